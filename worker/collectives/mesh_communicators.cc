#include "worker/collectives/mesh_communicators.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace substrax {

absl::StatusOr<std::unique_ptr<MeshCommunicators>> MeshCommunicators::Create(
    const Mesh& mesh, int device_id, const std::vector<int>& process_of_position, Store* store,
    const PeerMonitor* monitor, const GlooCommunicatorOptions& options) {
  if (static_cast<int64_t>(process_of_position.size()) != mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat("process table has ",
                                                   process_of_position.size(),
                                                   " entries for a mesh of ", mesh.size()));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int64_t> coords, mesh.CoordinatesOf(device_id));
  const int64_t position = mesh.Ravel(coords);
  std::unique_ptr<MeshCommunicators> comms(new MeshCommunicators(mesh));

  auto rank_info = [&](const Device& d) {
    const int64_t pos = mesh.Ravel(*mesh.CoordinatesOf(d.id));
    return RankInfo{process_of_position[pos], d.ToString(),
                    d.worker_id.empty() ? std::string()
                                        : absl::StrCat("worker ", d.worker_id, " (host ", d.host, ")")};
  };
  std::vector<RankInfo> world_ranks;
  for (const Device& d : mesh.devices()) world_ranks.push_back(rank_info(d));
  GlooCommunicatorOptions world_options = options;
  world_options.name = "world";
  PrefixStore world_store(store, "world");
  SUBSTRAX_ASSIGN_OR_RETURN(comms->world_,
                            GlooCommunicator::Create(world_options, &world_store,
                                                     static_cast<int>(position), world_ranks,
                                                     monitor));

  for (int a = 0; a < mesh.ndim(); ++a) {
    const std::string& axis = mesh.axis_names()[a];
    if (mesh.shape()[a] == mesh.size()) {
      comms->axes_[axis] = comms->world_.get();
      continue;
    }
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<Device> group, mesh.DevicesAlongAxis(axis, device_id));
    // The group is named by the coordinates of its first member, which all members share.
    std::vector<int64_t> key = *mesh.CoordinatesOf(group.front().id);
    std::vector<RankInfo> ranks;
    for (const Device& d : group) ranks.push_back(rank_info(d));
    GlooCommunicatorOptions axis_options = options;
    axis_options.name = absl::StrCat("axis '", axis, "' group ", absl::StrJoin(key, "."));
    PrefixStore axis_store(store, absl::StrCat("axis/", axis, "/", absl::StrJoin(key, ".")));
    SUBSTRAX_ASSIGN_OR_RETURN(
        std::unique_ptr<GlooCommunicator> comm,
        GlooCommunicator::Create(axis_options, &axis_store, static_cast<int>(coords[a]), ranks,
                                 monitor));
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

}  // namespace substrax
