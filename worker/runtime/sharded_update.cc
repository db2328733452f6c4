#include "worker/runtime/sharded_update.h"

#include <algorithm>

#include "core/status.h"

namespace substrax {
namespace {

// Whole 64-byte lines of float32: neighbouring blocks share no cache line.
constexpr int64_t kBlockGranule = 16;

class ShardedUpdate final : public GradientReducer {
 public:
  ShardedUpdate(Communicator& comm, int64_t block, int64_t total, float* grads,
                BlockUpdate& blocks)
      : comm_(comm), block_(block), total_(total), grads_(grads), blocks_(blocks) {}

  const char* kind() const override { return "sharded update"; }
  absl::Status Reduce(std::vector<CollectiveEvent>*) override {
    ++collectives_;
    return Annotate(comm_.ReduceScatter(grads_, grads_ + block_ * comm_.rank(), DataType::kFloat32,
                                        block_, ReduceOp::kMean),
                    what());
  }
  absl::Status Apply(DeviceBackend& backend, int64_t step) override {
    // This device's block (past the layout's end, in its padding, a block is empty); then, once
    // every device has updated its block, the others' blocks from them.
    const int rank = comm_.rank();
    SUBSTRAX_RETURN_IF_ERROR(blocks_.ApplyGradientBlock(std::min(total_, block_ * rank),
                                                        std::min(total_, block_ * (rank + 1)),
                                                        step));
    backend.MarkPhase(Phase::kCollective);
    SUBSTRAX_RETURN_IF_ERROR(Annotate(comm_.Barrier(), "sharded update"));
    return blocks_.FetchPeerBlocks(block_, rank, comm_.size());
  }
  int64_t collectives() const override { return collectives_; }

 private:
  Communicator& comm_;
  const int64_t block_;
  const int64_t total_;  // the layout's values, before the padding
  float* const grads_;
  BlockUpdate& blocks_;
  int64_t collectives_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GradientReducer>> CreateShardedUpdate(
    const GradientReducerSetup& setup, DeviceBackend& backend, BlockUpdate& blocks) {
  const Mesh& mesh = *setup.mesh;
  if (setup.explicit_collectives || !mesh.HasAxis(kDataAxis) || mesh.axis_names().size() != 1 ||
      backend.max_steps_in_flight() > 0) {
    return absl::InvalidArgumentError(
        "the update is sharded only on a mesh with a data axis alone, on the sharding path "
        "(not explicit collectives), with a backend that runs on the calling thread");
  }
  SUBSTRAX_ASSIGN_OR_RETURN(Communicator * comm, setup.comms->Axis(kDataAxis));
  const int64_t n = comm->size();
  const int64_t per_device = (setup.layout.total + n - 1) / n;
  const int64_t block = (per_device + kBlockGranule - 1) / kBlockGranule * kBlockGranule;
  FlatLayout padded = setup.layout;
  padded.total = block * n;
  SUBSTRAX_ASSIGN_OR_RETURN(float* grads, backend.BindGradients(padded));
  return std::unique_ptr<GradientReducer>(
      std::make_unique<ShardedUpdate>(*comm, block, setup.layout.total, grads, blocks));
}

}  // namespace substrax
