// MeshCommunicators: the communicators of one device of a mesh.
//
//   world()      every device of the mesh; rank = the device's row-major position.
//   Axis(name)   the devices along mesh axis `name` through this device (those that share every
//                other coordinate); rank = this device's coordinate on the axis.
//
// Every device of the mesh must create its MeshCommunicators (they connect as groups), in any
// order between devices, but each device connects the world first and then the axes in mesh
// order, so that no two groups wait on each other. A group that spans the whole mesh reuses the
// world communicator.
//
// Used by one device thread.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_MESH_COMMUNICATORS_H_
#define SUBSTRAX_WORKER_COLLECTIVES_MESH_COMMUNICATORS_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/mesh.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/gloo_communicator.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/collectives/store.h"

namespace substrax {

class MeshCommunicators {
 public:
  // `process_of_position[i]` is the process that drives mesh.devices()[i]. `store` is the job
  // attempt's store (each group gets its own prefix inside it). `monitor` may be null (one
  // process) and must outlive this object. Errors: INVALID_ARGUMENT (device not in the mesh,
  // wrong process table), and whatever connecting a group returns.
  static absl::StatusOr<std::unique_ptr<MeshCommunicators>> Create(
      const Mesh& mesh, int device_id, const std::vector<int>& process_of_position, Store* store,
      const PeerMonitor* monitor, const GlooCommunicatorOptions& options);

  Communicator& world() { return *world_; }
  // Errors: INVALID_ARGUMENT naming the axes the mesh has, never a silent no-op.
  absl::StatusOr<Communicator*> Axis(absl::string_view name);

 private:
  MeshCommunicators(const Mesh& mesh) : mesh_(mesh) {}

  const Mesh mesh_;
  std::unique_ptr<Communicator> world_;
  std::map<std::string, std::unique_ptr<Communicator>, std::less<>> own_axes_;
  std::map<std::string, Communicator*, std::less<>> axes_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_MESH_COMMUNICATORS_H_
