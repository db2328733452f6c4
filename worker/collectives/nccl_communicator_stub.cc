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
void NcclCommunicator::PeerDied(std::string) {}
absl::Status NcclCommunicator::AllReduceDevice(float*, size_t, ReduceOp, cudaStream_t) {
  return NotBuilt();
}
absl::Status NcclCommunicator::AllReduceDevice(double*, size_t, ReduceOp, cudaStream_t) {
  return NotBuilt();
}
absl::Status NcclCommunicator::AllGatherDevice(const float*, float*, size_t, cudaStream_t) {
  return NotBuilt();
}
absl::Status NcclCommunicator::AllGatherDevice(const double*, double*, size_t, cudaStream_t) {
  return NotBuilt();
}
absl::Status NcclCommunicator::BroadcastDevice(float*, size_t, int, cudaStream_t) {
  return NotBuilt();
}
absl::Status NcclCommunicator::ReduceScatterDevice(const float*, float*, size_t, ReduceOp,
                                                   cudaStream_t) {
  return NotBuilt();
}
absl::Status NcclCommunicator::DoAllReduce(absl::Span<float>, ReduceOp) { return NotBuilt(); }
absl::Status NcclCommunicator::DoAllReduce(absl::Span<double>, ReduceOp) { return NotBuilt(); }
absl::Status NcclCommunicator::DoAllGather(absl::Span<const float>, absl::Span<float>) {
  return NotBuilt();
}
absl::Status NcclCommunicator::DoAllGather(absl::Span<const double>, absl::Span<double>) {
  return NotBuilt();
}
absl::Status NcclCommunicator::DoBroadcast(absl::Span<float>, int) { return NotBuilt(); }
absl::Status NcclCommunicator::DoReduceScatter(absl::Span<const float>, absl::Span<float>,
                                               ReduceOp) {
  return NotBuilt();
}
absl::Status NcclCommunicator::DoBarrier() { return NotBuilt(); }

}  // namespace substrax
