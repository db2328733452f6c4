// DeviceMeshManager: builds the meshes of the guide (data-parallel, model-parallel, hybrid) from
// a set of devices, and describes a mesh for people (GetMeshInfo).
//
// Static methods only, as in the guide; no state, so every method is thread-safe.
//
// Placement is topology-aware: the model axis carries the chattiest collectives (an all-reduce
// per layer pair in tensor parallelism), so every model-axis group is placed on one host. When
// that is impossible the mesh is rejected with the reason, unless the caller asks for
// cross-host placement explicitly (MeshPlacementOptions::allow_cross_host_model_axis).
#ifndef SUBSTRAX_DEVICE_MESH_MANAGER_H_
#define SUBSTRAX_DEVICE_MESH_MANAGER_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "substrax/device.h"
#include "substrax/mesh.h"

namespace substrax {

struct MeshPlacementOptions {
  // Place a model-axis group across hosts when no host has enough devices for it. Off by
  // default: cross-host tensor parallelism is usually much slower, so it must be asked for.
  bool allow_cross_host_model_axis = false;
};

// What GetMeshInfo reports; printable (operator<< and ToString show the device grid).
struct MeshInfo {
  std::vector<std::string> axis_names;
  std::vector<int64_t> shape;
  int64_t device_count = 0;
  // Hosts in order of first appearance in the grid.
  std::vector<std::string> hosts;
  // Row-major, as in the mesh.
  std::vector<Device> devices;

  // A header line and the grid: one row per combination of all axes but the last, one column
  // per index of the last axis; each cell names the device, its host and its local name.
  std::string ToString() const;
  friend std::ostream& operator<<(std::ostream& os, const MeshInfo& info) {
    return os << info.ToString();
  }
};

class DeviceMeshManager {
 public:
  DeviceMeshManager() = delete;

  // A 1-D mesh over all `devices`, axis "data", grouped by host.
  // Errors: INVALID_ARGUMENT (no devices, or an invalid device set).
  static absl::StatusOr<Mesh> CreateDataParallelMesh(absl::Span<const Device> devices);

  // A 1-D mesh of `num_devices` of the `devices`, axis "model", on one host.
  // Errors: INVALID_ARGUMENT (num_devices < 1 or more than given; no host has num_devices
  // devices and cross-host placement was not allowed: the message lists devices per host).
  static absl::StatusOr<Mesh> CreateModelParallelMesh(absl::Span<const Device> devices,
                                                      int num_devices,
                                                      MeshPlacementOptions options = {});

  // A 2-D mesh (data=data_parallel_size, model=model_parallel_size) from the `devices`: each row
  // (a model-axis group) lies on one host. Always possible when model_parallel_size divides the
  // devices of every host and there are enough devices; otherwise the groups that fit are used,
  // and if too few fit the mesh is rejected with why (or placed across hosts if allowed).
  // Errors: INVALID_ARGUMENT (a size < 1, fewer devices than dp x mp, groups do not fit).
  static absl::StatusOr<Mesh> CreateHybridMesh(absl::Span<const Device> devices,
                                               int data_parallel_size, int model_parallel_size,
                                               MeshPlacementOptions options = {});

  static MeshInfo GetMeshInfo(const Mesh& mesh);
};

}  // namespace substrax

#endif  // SUBSTRAX_DEVICE_MESH_MANAGER_H_
