// Fuzz target: Mesh::FromProto on any v1::Mesh a peer could send (axis names, shape and devices
// decoded from the bytes, edge values included), then every accessor of a mesh it accepts.
//
// Checks: ToProto/FromProto round-trips; Ravel inverts Unravel; CoordinatesOf and DeviceAt agree
// with devices(); each axis's groups partition the mesh into groups of the axis's size; the
// data-parallel layout of a mesh with a data axis has one shard per device.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device_mesh_manager.h"
#include "core/mesh.h"
#include "core/sharding.h"
#include "google/protobuf/util/message_differencer.h"
#include "substrax/v1/topology.pb.h"
#include "tests/fuzz/fuzz_input.h"

namespace substrax {
namespace {

void Check(bool condition, const char* what, const v1::Mesh& proto) {
  if (condition) return;
  std::fprintf(stderr, "mesh_fuzzer: %s\n%s\n", what, proto.DebugString().c_str());
  std::abort();
}

v1::Mesh DecodeMesh(FuzzInput& in) {
  static const char* const kAxisNames[] = {"data", "model", "x", "", "data"};
  static const char* const kHosts[] = {"a", "b", "c", ""};
  v1::Mesh proto;
  const int axes = static_cast<int>(in.Range(0, 4));
  for (int i = 0; i < axes; ++i) proto.add_axis_names(kAxisNames[in.Range(0, 4)]);
  // Usually as many sizes as axes; sometimes one more or less.
  const int sizes = static_cast<int>(in.Range(0, 7) == 0 ? in.Range(0, 5) : axes);
  for (int i = 0; i < sizes; ++i) proto.add_shape(in.Bool() ? in.Range(1, 4) : in.Int64());
  const int devices = static_cast<int>(in.Range(0, 64));
  for (int i = 0; i < devices; ++i) {
    v1::Device* device = proto.add_devices();
    // Mostly the well-formed choice, so that fuzzing gets past validation.
    const bool well_formed = in.Range(0, 7) != 0;
    device->set_id(well_formed ? i : static_cast<int32_t>(in.Int64()));
    device->set_host(kHosts[in.Range(0, well_formed ? 2 : 3)]);
    device->set_local_index(well_formed ? i : static_cast<int32_t>(in.Int64()));
    device->set_kind(in.Bool() ? v1::DEVICE_KIND_CPU : v1::DEVICE_KIND_CUDA);
    if (!well_formed) device->set_worker_id(in.String(4));
  }
  return proto;
}

void CheckMesh(const Mesh& mesh, const v1::Mesh& proto) {
  absl::StatusOr<Mesh> again = Mesh::FromProto(mesh.ToProto());
  Check(again.ok(), "ToProto of a mesh is not accepted by FromProto", proto);
  Check(google::protobuf::util::MessageDifferencer::Equals(again->ToProto(), mesh.ToProto()),
        "ToProto/FromProto does not round-trip", proto);
  for (int64_t i = 0; i < mesh.size(); ++i) {
    const std::vector<int64_t> coords = mesh.Unravel(i);
    Check(mesh.Ravel(coords) == i, "Ravel(Unravel(i)) != i", proto);
    const Device& device = mesh.devices()[i];
    Check(mesh.DeviceAt(coords) == device, "DeviceAt(Unravel(i)) is not devices()[i]", proto);
    absl::StatusOr<std::vector<int64_t>> found = mesh.CoordinatesOf(device.id);
    Check(found.ok() && *found == coords, "CoordinatesOf(id) is not where the device is", proto);
  }
  for (const std::string& axis : mesh.axis_names()) {
    absl::StatusOr<int64_t> axis_size = mesh.AxisSize(axis);
    absl::StatusOr<std::vector<std::vector<Device>>> groups = mesh.AxisGroups(axis);
    Check(axis_size.ok() && groups.ok(), "an axis of the mesh is not found", proto);
    std::set<int> seen;
    for (const std::vector<Device>& group : *groups) {
      Check(static_cast<int64_t>(group.size()) == *axis_size, "a group is not the axis's size",
            proto);
      for (const Device& device : group) {
        Check(seen.insert(device.id).second, "a device is in two groups of one axis", proto);
      }
      absl::StatusOr<std::vector<Device>> along = mesh.DevicesAlongAxis(axis, group[0].id);
      Check(along.ok() && *along == group, "DevicesAlongAxis is not the device's group", proto);
    }
    Check(static_cast<int64_t>(seen.size()) == mesh.size(), "the groups miss devices", proto);
  }
  mesh.Hosts();
  mesh.ShapeString();
  DeviceMeshManager::GetMeshInfo(mesh).ToString();
  if (mesh.HasAxis(kDataAxis)) {
    absl::StatusOr<NamedSharding> sharding = CreateDataParallelSharding(mesh);
    Check(sharding.ok(), "no data-parallel sharding on a mesh with a data axis", proto);
    absl::StatusOr<ShardLayout> layout =
        sharding->Layout({*mesh.AxisSize(kDataAxis) * 2, 3});
    Check(layout.ok() && static_cast<int64_t>(layout->shards.size()) == mesh.size(),
          "the data-parallel layout has not one shard per device", proto);
    sharding->ToString();
  }
}

}  // namespace
}  // namespace substrax

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  substrax::FuzzInput in(data, size);
  const substrax::v1::Mesh proto = substrax::DecodeMesh(in);
  absl::StatusOr<substrax::Mesh> mesh = substrax::Mesh::FromProto(proto);
  if (mesh.ok()) substrax::CheckMesh(*mesh, proto);
  return 0;
}
