// NcclGroupConnector, in both builds: it only calls NcclCommunicator::Create and Split, which the
// default build's stub answers with UNIMPLEMENTED.
#include "absl/strings/str_cat.h"
#include "worker/collectives/nccl_communicator.h"

namespace substrax {

absl::StatusOr<std::unique_ptr<Communicator>> NcclGroupConnector::ConnectWorld(
    const CommunicatorGroup& world) {
  NcclCommunicatorOptions options = options_;
  options.name = world.name;
  options.self = world.members[world.rank].ToString();
  PrefixStore store(store_, absl::StrCat("nccl/", world.store_prefix));
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::Create(
      options, &store, world.rank, static_cast<int>(world.members.size()));
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<Communicator>(std::move(*comm));
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclGroupConnector::ConnectAxis(
    Communicator& world, const CommunicatorGroup& group) {
  auto* nccl = dynamic_cast<NcclCommunicator*>(&world);
  if (nccl == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "communicator '", group.name, "': NCCL splits axis groups from an NCCL world, but the "
        "world communicator '", world.name(), "' is of another backend"));
  }
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      nccl->Split(group.color, group.rank, group.name);
  if (!comm.ok()) return comm.status();
  return std::unique_ptr<Communicator>(std::move(*comm));
}

}  // namespace substrax
