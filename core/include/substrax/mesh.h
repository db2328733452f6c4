// Mesh: an N-d grid of devices with a name per axis, as in jax.sharding.Mesh.
//
// Devices are stored in row-major order of the grid. A Mesh is an immutable value: build it with
// Mesh::Create (or DeviceMeshManager), then share or copy it freely across threads.
#ifndef SUBSTRAX_MESH_H_
#define SUBSTRAX_MESH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "substrax/device.h"

namespace substrax {

// The wire form (substrax.v1 protos) is internal to substrax: the declarations that name it
// are not part of the SDK (docs/sdk.md) and need headers the SDK does not install.
namespace v1 {
class Mesh;
}  // namespace v1

// The axis names of the guide's meshes (DeviceMeshManager builds them).
inline constexpr char kDataAxis[] = "data";
inline constexpr char kModelAxis[] = "model";

class Mesh {
 public:
  // A mesh over `devices` (row-major) with the given axis names and shape.
  // Errors: INVALID_ARGUMENT when there are no axes, a name is empty or repeated, the shape has a
  // different rank or a size < 1, the sizes do not multiply to the number of devices, or the
  // devices are not a valid set (see ValidateDevices).
  static absl::StatusOr<Mesh> Create(std::vector<std::string> axis_names,
                                     std::vector<int64_t> shape, std::vector<Device> devices);
  // Errors: as Create.
  static absl::StatusOr<Mesh> FromProto(const v1::Mesh& proto);
  v1::Mesh ToProto() const;

  const std::vector<std::string>& axis_names() const { return axis_names_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  // Row-major: devices()[i] sits at coordinates Unravel(i).
  const std::vector<Device>& devices() const { return devices_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size() const { return static_cast<int64_t>(devices_.size()); }

  bool HasAxis(absl::string_view name) const;
  // Errors: INVALID_ARGUMENT naming the axes the mesh has.
  absl::StatusOr<int> AxisIndex(absl::string_view name) const;
  absl::StatusOr<int64_t> AxisSize(absl::string_view name) const;

  // Grid coordinates of the device at row-major position `flat_index`, and back.
  std::vector<int64_t> Unravel(int64_t flat_index) const;
  int64_t Ravel(absl::Span<const int64_t> coords) const;

  // The device at `coords` (one coordinate per axis, each in range: a programming error otherwise).
  const Device& DeviceAt(absl::Span<const int64_t> coords) const;
  // Errors: NOT_FOUND if no device of the mesh has this id.
  absl::StatusOr<std::vector<int64_t>> CoordinatesOf(int device_id) const;

  // The devices along `axis` through `device_id`: those that share every other coordinate with
  // it, ordered by their coordinate on `axis`. Errors: INVALID_ARGUMENT (no such axis),
  // NOT_FOUND (no such device).
  absl::StatusOr<std::vector<Device>> DevicesAlongAxis(absl::string_view axis,
                                                       int device_id) const;
  // Every group of devices along `axis` (the groups partition the mesh), ordered by the other
  // coordinates row-major. Errors: INVALID_ARGUMENT (no such axis).
  absl::StatusOr<std::vector<std::vector<Device>>> AxisGroups(absl::string_view axis) const;

  // Hosts of the mesh's devices in order of first appearance.
  std::vector<std::string> Hosts() const;
  // "(data=2, model=4)".
  std::string ShapeString() const;

 private:
  Mesh(std::vector<std::string> axis_names, std::vector<int64_t> shape,
       std::vector<Device> devices);

  std::vector<std::string> axis_names_;
  std::vector<int64_t> shape_;
  std::vector<Device> devices_;
};

}  // namespace substrax

#endif  // SUBSTRAX_MESH_H_
