// The default (CPU-only) build of NcclCommunicator: nothing can be created, so that targets
// depending on it build without the CUDA toolkit. The real one is nccl_communicator.cc
// (bazel build --config=cuda).
#include "worker/collectives/nccl_communicator.h"

namespace substrax {
namespace {

absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "the NCCL communicator was built without --config=cuda; rebuild with bazel build "
      "--config=cuda");
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclCommunicatorOptions&, Store*, int, int) {
  return NotBuilt();
}

// No instance can exist; these only complete the class.
NcclCommunicator::~NcclCommunicator() = default;
absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Split(int, int, std::string) {
  return NotBuilt();
}
void NcclCommunicator::PeerDied(const std::string&) {}
CollectiveEvent NcclCommunicator::DoAllReduce(void*, DataType, size_t, ReduceOp,
                                              ExecutionContext) {
  return CollectiveEvent::Done(NotBuilt());
}
CollectiveEvent NcclCommunicator::DoAllGather(const void*, void*, DataType, size_t,
                                              ExecutionContext) {
  return CollectiveEvent::Done(NotBuilt());
}
CollectiveEvent NcclCommunicator::DoBroadcast(void*, DataType, size_t, int, ExecutionContext) {
  return CollectiveEvent::Done(NotBuilt());
}
CollectiveEvent NcclCommunicator::DoReduceScatter(const void*, void*, DataType, size_t, ReduceOp,
                                                  ExecutionContext) {
  return CollectiveEvent::Done(NotBuilt());
}
CollectiveEvent NcclCommunicator::DoBarrier(ExecutionContext) {
  return CollectiveEvent::Done(NotBuilt());
}
CollectiveEvent NcclCommunicator::DoAllReduceGroup(absl::Span<const ReduceBuffer>, DataType,
                                                   ReduceOp, ExecutionContext) {
  return CollectiveEvent::Done(NotBuilt());
}

}  // namespace substrax
