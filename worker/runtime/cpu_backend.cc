#include "worker/runtime/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "contract/cpu_features.h"
#include "worker/compute/model.h"
#include "worker/compute/optimizer.h"
#include "worker/data/sampler.h"
#include "worker/runtime/device_state.h"
#include "worker/runtime/sharded_update.h"
#include "worker/tensor/aligned_floats.h"

namespace substrax {

// A device's parameters and optimizer state.
struct CpuState {
  TensorTree params;
  std::unique_ptr<Optimizer> optimizer;
};

class ShardedUpdateGroup {
 public:
  explicit ShardedUpdateGroup(int size) : members_(size) {}

  int size() const { return static_cast<int>(members_.size()); }

  absl::Status Join(int rank, std::shared_ptr<CpuState> state) {
    absl::MutexLock lock(&mu_);
    if (rank < 0 || rank >= size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharded update: rank ", rank, " outside a group of ", size()));
    }
    if (members_[rank] != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharded update: rank ", rank, " joined twice"));
    }
    members_[rank] = std::move(state);
    return absl::OkStatus();
  }

  // Every member's state, by rank. Errors: FAILED_PRECONDITION while one has not joined.
  absl::StatusOr<std::vector<std::shared_ptr<CpuState>>> Members() {
    absl::MutexLock lock(&mu_);
    for (int r = 0; r < size(); ++r) {
      if (members_[r] == nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("sharded update: the device of rank ", r, " has not joined"));
      }
    }
    return members_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<CpuState>> members_ ABSL_GUARDED_BY(mu_);
};

std::shared_ptr<ShardedUpdateGroup> MakeShardedUpdateGroup(int size) {
  return std::make_shared<ShardedUpdateGroup>(size);
}

namespace {

// With a sharded update's group the backend is also its BlockUpdate: the reducer it brings
// (OwnGradientReducer) updates this device's block and fetches the others'.
class CpuBackend final : public DeviceBackend, public BlockUpdate {
 public:
  CpuBackend(std::unique_ptr<Model> model, std::shared_ptr<CpuState> state,
             std::shared_ptr<ShardedUpdateGroup> group, int rank,
             std::unique_ptr<Prefetcher<Batch>> batches)
      : model_(std::move(model)),
        state_ptr_(std::move(state)),
        state_(*state_ptr_),
        group_(std::move(group)),
        rank_(rank),
        batches_(std::move(batches)) {}

  const std::vector<ParamSpec>& params() const override { return model_->params(); }
  std::vector<int64_t> LocalShape(const ParamSpec& p) const override {
    return model_->LocalShape(p);
  }
  bool is_classification() const override { return model_->is_classification(); }
  ExecutionContext execution_context() const override {
    return ExecutionContext::CallingThread();
  }

  absl::StatusOr<float*> BindGradients(const FlatLayout& layout) override {
    layout_ = layout;
    flat_.assign(layout.total, 0.0f);
    slots_.clear();
    views_.clear();
    for (const ParamSpec& p : model_->params()) {
      SUBSTRAX_ASSIGN_OR_RETURN(const FlatSlot* slot, layout_.Find(p.name));
      slots_.push_back(slot);
      views_[p.name] = flat_.data() + slot->offset;
    }
    return flat_.data();
  }

  void SetGradientsReady(GradientsReady ready) override { ready_ = std::move(ready); }

  absl::StatusOr<bool> NextBatch() override {
    SUBSTRAX_ASSIGN_OR_RETURN(batch_, batches_->Next());
    return batch_.has_value();
  }

  absl::Status ComputeGradients() override {
    if (!batch_.has_value()) return absl::FailedPreconditionError("no batch: call NextBatch");
    if (slots_.empty()) return absl::FailedPreconditionError("no gradient buffer: call BindGradients");
    // Straight into the flat buffer, each gradient announced as soon as it is complete.
    Model::GradientSink sink;
    sink.buffer = [this](size_t i) { return flat_.data() + slots_[i]->offset; };
    if (ready_) sink.done = [this](size_t i) { ready_(slots_[i]->offset, slots_[i]->size); };
    SUBSTRAX_ASSIGN_OR_RETURN(LossAndGrads lg,
                              model_->LossAndGradientsInto(state_.params, *batch_, sink));
    const int64_t n = batch_->size();
    sums_.loss_sum += lg.loss * static_cast<double>(n);
    sums_.correct += std::llround(lg.accuracy * static_cast<double>(n));
    sums_.count += n;
    return absl::OkStatus();
  }

  absl::Status ApplyGradients() override {
    if (group_ != nullptr) {
      return absl::FailedPreconditionError(
          "this device shards its update: update its block with ApplyGradientBlock");
    }
    // In place from the flat buffer: no copy into tensors.
    return UpdateFromViews(*state_.optimizer, views_, &state_.params);
  }

  absl::StatusOr<std::unique_ptr<GradientReducer>> OwnGradientReducer(
      const GradientReducerSetup& setup) override {
    if (group_ == nullptr) return nullptr;
    return CreateShardedUpdate(setup, *this, *this);
  }

  absl::Status ApplyGradientBlock(int64_t begin, int64_t end, int64_t step) override {
    if (group_ == nullptr) return absl::FailedPreconditionError(kUnsharded);
    if (slots_.empty()) return absl::FailedPreconditionError("no gradient buffer: call BindGradients");
    std::vector<ParamRange> ranges;
    ForEachPiece(begin, end, [&](const FlatSlot& slot, int64_t lo, int64_t hi) {
      ranges.push_back({slot.name, lo - slot.offset, hi - lo, flat_.data() + lo});
    });
    return UpdateRanges(*state_.optimizer, ranges, step, &state_.params);
  }

  absl::Status FetchPeerBlocks(int64_t block, int rank, int size) override {
    if (group_ == nullptr) return absl::FailedPreconditionError(kUnsharded);
    if (rank != rank_ || size != group_->size() || block <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sharded update: fetching as rank ", rank, " of ", size, " (block ", block,
          ") on the device of rank ", rank_, " of ", group_->size()));
    }
    if (peers_.empty()) {
      SUBSTRAX_ASSIGN_OR_RETURN(peers_, group_->Members());
    }
    for (int q = 0; q < size; ++q) {
      if (q == rank) continue;
      TensorTree& theirs = peers_[q]->params;
      ForEachPiece(q * block, (q + 1) * block, [&](const FlatSlot& slot, int64_t lo, int64_t hi) {
        std::memcpy(state_.params.at(slot.name).data() + (lo - slot.offset),
                    theirs.at(slot.name).data() + (lo - slot.offset),
                    (hi - lo) * sizeof(float));
      });
    }
    block_ = block;
    return absl::OkStatus();
  }

  absl::StatusOr<EvalResult> TakeMetrics() override { return std::exchange(sums_, EvalResult()); }

  void MarkPhase(Phase phase) override { clock_.Mark(phase); }
  absl::StatusOr<PhaseSeconds> TakePhaseSeconds() override { return clock_.Take(); }

  absl::StatusOr<EvalResult> Evaluate(const Dataset& data, int64_t begin, int64_t end) override {
    EvalResult total;
    constexpr int64_t kChunk = 1024;
    for (int64_t start = begin; start < end; start += kChunk) {
      std::vector<int64_t> rows;
      for (int64_t i = start; i < std::min(end, start + kChunk); ++i) rows.push_back(i);
      SUBSTRAX_ASSIGN_OR_RETURN(EvalResult r,
                                model_->Evaluate(state_.params, Gather(data, rows)));
      total.loss_sum += r.loss_sum;
      total.correct += r.correct;
      total.count += r.count;
    }
    return total;
  }

  absl::StatusOr<TensorTree> Parameters() override { return state_.params; }

  absl::StatusOr<TensorTree> SaveState() override {
    TensorTree state = DeviceState(state_.params, *state_.optimizer);
    if (group_ == nullptr || block_ == 0) return state;
    // This device's optimizer state is up to date in its own block only: the others' blocks come
    // from their devices (which change them only after the next step's reduce-scatter, which
    // waits for this device).
    for (int q = 0; q < group_->size(); ++q) {
      if (q == rank_) continue;
      const CpuState& peer = *peers_[q];
      for (const auto& [key, tensor] : peer.optimizer->ExportState(peer.params)) {
        const std::string param = key.substr(0, key.rfind('/'));
        float* mine = state.at(absl::StrCat(kOptimizerPrefix, key)).data();
        ForEachPiece(q * block_, (q + 1) * block_,
                     [&](const FlatSlot& slot, int64_t lo, int64_t hi) {
                       if (slot.name != param) return;
                       std::memcpy(mine + (lo - slot.offset), tensor.data() + (lo - slot.offset),
                                   (hi - lo) * sizeof(float));
                     });
      }
    }
    return state;
  }

  absl::Status RestoreState(const TensorTree& state, int64_t step) override {
    SUBSTRAX_RETURN_IF_ERROR(
        RestoreDeviceState(state, step, &state_.params, *state_.optimizer));
    // Every device restores the whole replicated state: each block is up to date everywhere.
    block_ = 0;
    return group_ == nullptr ? absl::OkStatus()
                             : PrepareRangeUpdates(*state_.optimizer, state_.params);
  }

 private:
  static constexpr const char* kUnsharded = "this device does not shard its update";

  // Calls f(slot, lo, hi) for each parameter's piece [lo, hi) of the layout's [begin, end).
  template <typename F>
  void ForEachPiece(int64_t begin, int64_t end, F f) const {
    for (const FlatSlot* slot : slots_) {
      const int64_t lo = std::max(begin, slot->offset);
      const int64_t hi = std::min(end, slot->offset + slot->size);
      if (lo < hi) f(*slot, lo, hi);
    }
  }

  const std::unique_ptr<Model> model_;
  // Shared with the sharded update's group, whose other devices read it.
  const std::shared_ptr<CpuState> state_ptr_;
  CpuState& state_;
  const std::shared_ptr<ShardedUpdateGroup> group_;
  const int rank_;  // in group_
  // The group's states by rank (once every device has joined), and the block of the last fetch
  // (0: none since the start or a restore: every block of this device's state is current).
  std::vector<std::shared_ptr<CpuState>> peers_;
  int64_t block_ = 0;
  const std::unique_ptr<Prefetcher<Batch>> batches_;
  std::optional<Batch> batch_;
  FlatLayout layout_;
  // Each gradient's slot of the flat buffer, by parameter index.
  std::vector<const FlatSlot*> slots_;
  AlignedFloats flat_;
  GradientsReady ready_;
  GradientViews views_;  // each parameter's gradient in flat_, for the optimizer
  EvalResult sums_;
  HostPhaseClock clock_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCpuBackend(BackendSetup setup,
                                                                CpuShardedUpdate sharded) {
  SUBSTRAX_RETURN_IF_ERROR(CheckCpuKernels());
  const v1::JobSpec& spec = *setup.spec;
  TensorParallelism tp;
  if (setup.model_axis != nullptr) {
    Communicator* comm = setup.model_axis;
    tp.axis_size = comm->size();
    tp.index = setup.model_index;
    tp.all_reduce_sum = [comm](absl::Span<float> values) {
      return Annotate(comm->AllReduce(values, ReduceOp::kSum), "tensor-parallel all-reduce");
    };
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<Model> model,
                            Model::Create(spec.model(), setup.num_features, tp));
  // Each device initialises only its blocks; each equals the slice of the full initialisation.
  auto init = [&]() -> absl::StatusOr<CpuState> {
    CpuState state;
    SUBSTRAX_ASSIGN_OR_RETURN(state.optimizer, Optimizer::Create(spec.optimizer()));
    state.params = model->Init(spec.seed());
    return state;
  };
  SUBSTRAX_ASSIGN_OR_RETURN(CpuState initial, init());
  auto state = std::make_shared<CpuState>(std::move(initial));
  if (sharded.group != nullptr) {
    if (setup.model_axis != nullptr) {
      return absl::InvalidArgumentError(
          "the update is sharded only along a data axis alone; this device has a model axis");
    }
    SUBSTRAX_RETURN_IF_ERROR(PrepareRangeUpdates(*state->optimizer, state->params));
    SUBSTRAX_RETURN_IF_ERROR(sharded.group->Join(sharded.rank, state));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::unique_ptr<Prefetcher<Batch>> batches,
      PrefetchToDevice(std::move(setup.batches), spec.data().prefetch_size()));
  return std::unique_ptr<DeviceBackend>(
      new CpuBackend(std::move(model), std::move(state), std::move(sharded.group), sharded.rank,
                     std::move(batches)));
}

}  // namespace substrax
