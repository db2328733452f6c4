// MeshCommunicators: the communicators of one device of a mesh, on any backend.
//
//   world()      every device of the mesh; rank = the device's row-major position.
//   Axis(name)   the devices along mesh axis `name` through this device (those that share every
//                other coordinate); rank = this device's coordinate on the axis.
//
// A GroupConnector says how a backend connects a group: Gloo connects each group through the
// store (gloo_communicator.h); NCCL creates the world and splits each axis group from it
// (nccl_communicator.h).
//
// Every device of the mesh must create its MeshCommunicators (they connect as groups), in any
// order between devices, but each device connects the world first and then the axes in mesh
// order, so that no two groups wait on each other (and every rank splits in the same order). A
// group that spans the whole mesh reuses the world communicator.
//
// Used by one device thread; PeerDied from any thread.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_MESH_COMMUNICATORS_H_
#define SUBSTRAX_WORKER_COLLECTIVES_MESH_COMMUNICATORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/device.h"
#include "core/mesh.h"
#include "worker/collectives/communicator.h"

namespace substrax {

// One group of devices to connect, as this device sees it.
struct CommunicatorGroup {
  // "world", "axis 'data' group 0.1": for messages.
  std::string name;
  // The group's own key prefix in the attempt's store ("world", "axis/data/0.1").
  std::string store_prefix;
  // The members in rank order, their mesh positions, and this device's rank among them.
  std::vector<Device> members;
  std::vector<int64_t> positions;
  int rank = 0;
  // For backends that split axis groups from the world: the same non-negative value for every
  // member of this group and a different one for every other group of the axis.
  int color = 0;
};

// How a backend connects groups. Errors: whatever connecting returns (UNAVAILABLE,
// DEADLINE_EXCEEDED naming the group and rank; UNIMPLEMENTED for a backend not built in).
class GroupConnector {
 public:
  virtual ~GroupConnector() = default;
  virtual absl::StatusOr<std::unique_ptr<Communicator>> ConnectWorld(
      const CommunicatorGroup& world) = 0;
  // Every member of the world calls it for each axis, in mesh order (a collective for
  // backends that split).
  virtual absl::StatusOr<std::unique_ptr<Communicator>> ConnectAxis(
      Communicator& world, const CommunicatorGroup& group) = 0;
};

class MeshCommunicators {
 public:
  // Connects the groups of device `device_id` of `mesh` with `connector` (used during the
  // call only). Errors: INVALID_ARGUMENT (device not in the mesh), and whatever connecting a
  // group returns.
  static absl::StatusOr<std::unique_ptr<MeshCommunicators>> Create(const Mesh& mesh,
                                                                   int device_id,
                                                                   GroupConnector& connector);

  Communicator& world() { return *world_; }
  // Errors: INVALID_ARGUMENT naming the axes the mesh has, never a silent no-op.
  absl::StatusOr<Communicator*> Axis(absl::string_view name);

  // Tells every communicator of this device that `who` died (Communicator::PeerDied).
  void PeerDied(const std::string& who);

 private:
  explicit MeshCommunicators(const Mesh& mesh) : mesh_(mesh) {}

  const Mesh mesh_;
  std::unique_ptr<Communicator> world_;
  std::map<std::string, std::unique_ptr<Communicator>, std::less<>> own_axes_;
  std::map<std::string, Communicator*, std::less<>> axes_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_MESH_COMMUNICATORS_H_
