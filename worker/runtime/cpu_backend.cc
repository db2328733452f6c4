#include "worker/runtime/cpu_backend.h"

#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker/compute/cpu_features.h"
#include "worker/compute/model.h"
#include "worker/compute/optimizer.h"
#include "worker/data/sampler.h"
#include "worker/runtime/device_state.h"
#include "worker/tensor/aligned_floats.h"

namespace substrax {
namespace {

class CpuBackend final : public DeviceBackend {
 public:
  CpuBackend(std::unique_ptr<Model> model, std::unique_ptr<Optimizer> optimizer,
             TensorTree params, std::unique_ptr<Prefetcher<Batch>> batches)
      : model_(std::move(model)),
        optimizer_(std::move(optimizer)),
        params_(std::move(params)),
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
                              model_->LossAndGradientsInto(params_, *batch_, sink));
    const int64_t n = batch_->size();
    sums_.loss_sum += lg.loss * static_cast<double>(n);
    sums_.correct += std::llround(lg.accuracy * static_cast<double>(n));
    sums_.count += n;
    return absl::OkStatus();
  }

  absl::Status ApplyGradients() override {
    // In place from the flat buffer: no copy into tensors.
    return UpdateFromViews(*optimizer_, views_, &params_);
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
      SUBSTRAX_ASSIGN_OR_RETURN(EvalResult r, model_->Evaluate(params_, Gather(data, rows)));
      total.loss_sum += r.loss_sum;
      total.correct += r.correct;
      total.count += r.count;
    }
    return total;
  }

  absl::StatusOr<TensorTree> Parameters() override { return params_; }

  absl::StatusOr<TensorTree> SaveState() override { return DeviceState(params_, *optimizer_); }

  absl::Status RestoreState(const TensorTree& state, int64_t step) override {
    return RestoreDeviceState(state, step, &params_, *optimizer_);
  }

 private:
  const std::unique_ptr<Model> model_;
  const std::unique_ptr<Optimizer> optimizer_;
  TensorTree params_;
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

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCpuBackend(BackendSetup setup) {
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
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                            Optimizer::Create(spec.optimizer()));
  // Each device initialises only its blocks; each equals the slice of the full initialisation.
  TensorTree params = model->Init(spec.seed());
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::unique_ptr<Prefetcher<Batch>> batches,
      PrefetchToDevice(std::move(setup.batches), spec.data().prefetch_size()));
  return std::unique_ptr<DeviceBackend>(new CpuBackend(
      std::move(model), std::move(optimizer), std::move(params), std::move(batches)));
}

}  // namespace substrax
