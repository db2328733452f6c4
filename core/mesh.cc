#include "core/mesh.h"

#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace substrax {

absl::StatusOr<Mesh> Mesh::Create(std::vector<std::string> axis_names,
                                  std::vector<int64_t> shape, std::vector<Device> devices) {
  if (axis_names.empty()) {
    return absl::InvalidArgumentError("a mesh needs at least one axis");
  }
  if (axis_names.size() != shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mesh has ", axis_names.size(), " axis names (", absl::StrJoin(axis_names, ", "),
        ") but a shape of rank ", shape.size()));
  }
  absl::flat_hash_set<std::string> seen;
  int64_t product = 1;
  for (size_t i = 0; i < axis_names.size(); ++i) {
    if (axis_names[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("mesh axis ", i, " has an empty name"));
    }
    if (!seen.insert(axis_names[i]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh axis name '", axis_names[i], "' appears twice"));
    }
    if (shape[i] < 1) {
      return absl::InvalidArgumentError(absl::StrCat("mesh axis '", axis_names[i],
                                                     "' must have size >= 1, got ", shape[i]));
    }
    // A shape from a peer's proto may hold any sizes: a product past int64 is undefined
    // behaviour and could wrap around to the device count, accepting an absurd shape (found by
    // tests/fuzz:mesh_fuzzer).
    if (shape[i] > std::numeric_limits<int64_t>::max() / product) {
      return absl::InvalidArgumentError(
          absl::StrCat("mesh shape (", absl::StrJoin(shape, ", "), ") holds more than 2^63 ",
                       "devices but ", devices.size(), " were given"));
    }
    product *= shape[i];
  }
  if (product != static_cast<int64_t>(devices.size())) {
    return absl::InvalidArgumentError(absl::StrCat("mesh shape (", absl::StrJoin(shape, ", "),
                                                   ") holds ", product, " devices but ",
                                                   devices.size(), " were given"));
  }
  SUBSTRAX_RETURN_IF_ERROR(ValidateDevices(devices));
  return Mesh(std::move(axis_names), std::move(shape), std::move(devices));
}

Mesh::Mesh(std::vector<std::string> axis_names, std::vector<int64_t> shape,
           std::vector<Device> devices)
    : axis_names_(std::move(axis_names)), shape_(std::move(shape)), devices_(std::move(devices)) {}

absl::StatusOr<Mesh> Mesh::FromProto(const v1::Mesh& proto) {
  std::vector<Device> devices;
  devices.reserve(proto.devices_size());
  for (const v1::Device& d : proto.devices()) devices.push_back(DeviceFromProto(d));
  return Create({proto.axis_names().begin(), proto.axis_names().end()},
                {proto.shape().begin(), proto.shape().end()}, std::move(devices));
}

v1::Mesh Mesh::ToProto() const {
  v1::Mesh proto;
  for (const std::string& name : axis_names_) proto.add_axis_names(name);
  for (int64_t s : shape_) proto.add_shape(s);
  for (const Device& d : devices_) *proto.add_devices() = DeviceToProto(d);
  return proto;
}

bool Mesh::HasAxis(absl::string_view name) const { return AxisIndex(name).ok(); }

absl::StatusOr<int> Mesh::AxisIndex(absl::string_view name) const {
  for (size_t i = 0; i < axis_names_.size(); ++i) {
    if (axis_names_[i] == name) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat("mesh ", ShapeString(), " has no axis '", name,
                                                 "'; its axes are ",
                                                 absl::StrJoin(axis_names_, ", ")));
}

absl::StatusOr<int64_t> Mesh::AxisSize(absl::string_view name) const {
  SUBSTRAX_ASSIGN_OR_RETURN(int index, AxisIndex(name));
  return shape_[index];
}

std::vector<int64_t> Mesh::Unravel(int64_t flat_index) const {
  std::vector<int64_t> coords(shape_.size());
  for (int i = ndim() - 1; i >= 0; --i) {
    coords[i] = flat_index % shape_[i];
    flat_index /= shape_[i];
  }
  return coords;
}

int64_t Mesh::Ravel(absl::Span<const int64_t> coords) const {
  SUBSTRAX_CHECK(coords.size() == shape_.size(),
                 absl::StrCat(coords.size(), " coordinates for mesh ", ShapeString()));
  int64_t flat = 0;
  for (int i = 0; i < ndim(); ++i) {
    SUBSTRAX_CHECK(coords[i] >= 0 && coords[i] < shape_[i],
                   absl::StrCat("coordinate ", coords[i], " out of range on axis ",
                                axis_names_[i], " of mesh ", ShapeString()));
    flat = flat * shape_[i] + coords[i];
  }
  return flat;
}

const Device& Mesh::DeviceAt(absl::Span<const int64_t> coords) const {
  return devices_[Ravel(coords)];
}

absl::StatusOr<std::vector<int64_t>> Mesh::CoordinatesOf(int device_id) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i].id == device_id) return Unravel(static_cast<int64_t>(i));
  }
  return absl::NotFoundError(
      absl::StrCat("device ", device_id, " is not in mesh ", ShapeString()));
}

absl::StatusOr<std::vector<Device>> Mesh::DevicesAlongAxis(absl::string_view axis,
                                                           int device_id) const {
  SUBSTRAX_ASSIGN_OR_RETURN(int axis_index, AxisIndex(axis));
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int64_t> coords, CoordinatesOf(device_id));
  std::vector<Device> along;
  along.reserve(shape_[axis_index]);
  for (int64_t c = 0; c < shape_[axis_index]; ++c) {
    coords[axis_index] = c;
    along.push_back(DeviceAt(coords));
  }
  return along;
}

absl::StatusOr<std::vector<std::vector<Device>>> Mesh::AxisGroups(absl::string_view axis) const {
  SUBSTRAX_ASSIGN_OR_RETURN(int axis_index, AxisIndex(axis));
  std::vector<std::vector<Device>> groups;
  for (int64_t i = 0; i < size(); ++i) {
    // Each group is visited once, through its member with coordinate 0 on the axis.
    if (Unravel(i)[axis_index] != 0) continue;
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<Device> group, DevicesAlongAxis(axis, devices_[i].id));
    groups.push_back(std::move(group));
  }
  return groups;
}

std::vector<std::string> Mesh::Hosts() const {
  std::vector<std::string> hosts;
  absl::flat_hash_set<std::string> seen;
  for (const Device& d : devices_) {
    if (seen.insert(d.host).second) hosts.push_back(d.host);
  }
  return hosts;
}

std::string Mesh::ShapeString() const {
  std::vector<std::string> parts;
  for (int i = 0; i < ndim(); ++i) parts.push_back(absl::StrCat(axis_names_[i], "=", shape_[i]));
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

}  // namespace substrax
