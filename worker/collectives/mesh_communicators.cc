#include "worker/collectives/mesh_communicators.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace substrax {

absl::StatusOr<std::unique_ptr<MeshCommunicators>> MeshCommunicators::Create(
    const Mesh& mesh, int device_id, GroupConnector& connector) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int64_t> coords, mesh.CoordinatesOf(device_id));
  std::unique_ptr<MeshCommunicators> comms(new MeshCommunicators(mesh));

  CommunicatorGroup world;
  world.name = "world";
  world.store_prefix = "world";
  world.members = mesh.devices();
  for (int64_t i = 0; i < mesh.size(); ++i) world.positions.push_back(i);
  world.rank = static_cast<int>(mesh.Ravel(coords));
  SUBSTRAX_ASSIGN_OR_RETURN(comms->world_, connector.ConnectWorld(world));

  for (int a = 0; a < mesh.ndim(); ++a) {
    const std::string& axis = mesh.axis_names()[a];
    if (mesh.shape()[a] == mesh.size()) {
      comms->axes_[axis] = comms->world_.get();
      continue;
    }
    CommunicatorGroup group;
    SUBSTRAX_ASSIGN_OR_RETURN(group.members, mesh.DevicesAlongAxis(axis, device_id));
    for (const Device& d : group.members) {
      group.positions.push_back(mesh.Ravel(*mesh.CoordinatesOf(d.id)));
    }
    // The group is named by the coordinates of its first member, which all members share; its
    // position is unique among the groups of the axis.
    const std::vector<int64_t> key = *mesh.CoordinatesOf(group.members.front().id);
    group.name = absl::StrCat("axis '", axis, "' group ", absl::StrJoin(key, "."));
    group.store_prefix = absl::StrCat("axis/", axis, "/", absl::StrJoin(key, "."));
    group.rank = static_cast<int>(coords[a]);
    group.color = static_cast<int>(group.positions.front());
    SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                              connector.ConnectAxis(*comms->world_, group));
    comms->axes_[axis] = comm.get();
    comms->own_axes_[axis] = std::move(comm);
  }
  return comms;
}

absl::StatusOr<Communicator*> MeshCommunicators::Axis(absl::string_view name) {
  auto it = axes_.find(name);
  if (it == axes_.end()) {
    return Annotate(mesh_.AxisIndex(name).status(), "collective over a mesh axis");
  }
  return it->second;
}

void MeshCommunicators::PeerDied(const std::string& who) {
  world_->PeerDied(who);
  for (auto& [axis, comm] : own_axes_) comm->PeerDied(who);
}

}  // namespace substrax
