// The CUDA build of the CUDA backend (bazel build --config=cuda).
#include "worker/runtime/cuda_backend.h"

#include <cuda_runtime.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker/gpu/cuda_device.h"
#include "worker/compute/cuda_model.h"
#include "worker/data/cuda_prefetch.h"
#include "worker/data/sampler.h"

namespace substrax {
namespace {

absl::Status CudaCall(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: ", cudaGetErrorName(e), ": ",
                                          cudaGetErrorString(e),
                                          "; check the GPU (nvidia-smi, dmesg)"));
}

// Phase times on the device: an event recorded on the stream at every mark; the time between
// two marks belongs to the first one's phase. Events are pooled and reused after each Take.
class EventPhaseClock {
 public:
  explicit EventPhaseClock(cudaStream_t stream) : stream_(stream) {}
  ~EventPhaseClock() {
    for (cudaEvent_t e : pool_) cudaEventDestroy(e);
  }

  void Mark(Phase phase) {
    if (!error_.ok()) return;
    if (used_ == pool_.size()) {
      cudaEvent_t e = nullptr;
      error_ = CudaCall(cudaEventCreate(&e), "cudaEventCreate (phase timing)");
      if (!error_.ok()) return;
      pool_.push_back(e);
    }
    error_ = CudaCall(cudaEventRecord(pool_[used_], stream_), "cudaEventRecord (phase timing)");
    if (!error_.ok()) return;
    phases_.push_back(phase);
    ++used_;
  }

  absl::StatusOr<PhaseSeconds> Take() {
    const Phase current = phases_.empty() ? Phase::kCompute : phases_.back();
    Mark(current);
    SUBSTRAX_RETURN_IF_ERROR(error_);
    SUBSTRAX_RETURN_IF_ERROR(CudaCall(cudaEventSynchronize(pool_[used_ - 1]),
                                      "cudaEventSynchronize (phase timing)"));
    PhaseSeconds seconds = {};
    for (size_t i = 0; i + 1 < used_; ++i) {
      float ms = 0;
      SUBSTRAX_RETURN_IF_ERROR(CudaCall(cudaEventElapsedTime(&ms, pool_[i], pool_[i + 1]),
                                        "cudaEventElapsedTime (phase timing)"));
      seconds[static_cast<int>(phases_[i])] += ms / 1000.0;
    }
    // The last mark starts the next interval.
    std::swap(pool_[0], pool_[used_ - 1]);
    phases_ = {current};
    used_ = 1;
    return seconds;
  }

 private:
  const cudaStream_t stream_;
  std::vector<cudaEvent_t> pool_;
  std::vector<Phase> phases_;
  size_t used_ = 0;
  absl::Status error_;
};

// The tensor-parallel all-reduces a pass queues (inside the forward and backward passes): ordered
// on the compute stream by events, so the host never waits for one; their outcomes are collected
// at each report, or once kMaxPending are outstanding.
class PendingCollectives {
 public:
  static constexpr size_t kMaxPending = 256;
  absl::Status Add(CollectiveEvent event) {
    events_.push_back(std::move(event));
    return events_.size() >= kMaxPending ? Collect() : absl::OkStatus();
  }
  absl::Status Collect() {
    absl::Status status;
    for (const CollectiveEvent& e : events_) status.Update(e.Await());
    events_.clear();
    return status;
  }

 private:
  std::vector<CollectiveEvent> events_;
};

class CudaBackend final : public DeviceBackend {
 public:
  // How many steps' gradient reductions may be in flight before the loop awaits the oldest.
  // Enough that the host, blocked on the oldest, still has several steps queued on the device
  // meanwhile: an outcome is known only at the watchdog's next poll (every poll_interval, 1 ms
  // by default), longer than a small model's step.
  static constexpr int kStepsInFlight = 8;

  CudaBackend(std::unique_ptr<CudaDevice> device, std::unique_ptr<CudaModel> model,
              std::unique_ptr<CudaOptimizer> optimizer, DeviceTree params,
              std::unique_ptr<CudaMetrics> metrics, std::unique_ptr<CudaMetrics> eval_metrics,
              std::unique_ptr<CudaPrefetcher> batches,
              std::shared_ptr<PendingCollectives> tp_pending)
      : device_(std::move(device)),
        model_(std::move(model)),
        optimizer_(std::move(optimizer)),
        params_(std::move(params)),
        metrics_(std::move(metrics)),
        eval_metrics_(std::move(eval_metrics)),
        batches_(std::move(batches)),
        tp_pending_(std::move(tp_pending)),
        clock_(device_->stream()) {}

  const std::vector<ParamSpec>& params() const override { return model_->params(); }
  std::vector<int64_t> LocalShape(const ParamSpec& p) const override {
    return model_->LocalShape(p);
  }
  bool is_classification() const override { return model_->is_classification(); }
  ExecutionContext execution_context() const override {
    return ExecutionContext::Stream(device_->stream());
  }
  // The NCCL collectives are ordered on the compute stream by events: the update waits for the
  // reduction on the device, not on the host.
  int max_steps_in_flight() const override { return kStepsInFlight; }
  int64_t graph_replays() const override {
    return model_->graph_replays() + optimizer_->graph_replays();
  }

  absl::StatusOr<float*> BindGradients(const FlatLayout& layout) override {
    SUBSTRAX_ASSIGN_OR_RETURN(flat_, DeviceBuffer::Allocate(*device_, layout.total));
    grads_.clear();
    for (const FlatSlot& slot : layout.slots) {
      DeviceTensor& t = grads_[slot.name];
      t.shape = slot.shape;
      t.buffer = DeviceBuffer::View(flat_.data() + slot.offset, slot.size);
    }
    return flat_.data();
  }

  absl::StatusOr<bool> NextBatch() override {
    SUBSTRAX_ASSIGN_OR_RETURN(batch_, batches_->Next());
    return batch_.has_value();
  }

  absl::Status ComputeGradients() override {
    if (!batch_.has_value()) return absl::FailedPreconditionError("no batch: call NextBatch");
    return model_->LossAndGradients(params_, *batch_, &grads_, metrics_.get());
  }

  absl::Status ApplyGradients() override { return optimizer_->Update(grads_, &params_); }

  absl::StatusOr<EvalResult> TakeMetrics() override {
    SUBSTRAX_RETURN_IF_ERROR(tp_pending_->Collect());
    SUBSTRAX_ASSIGN_OR_RETURN(EvalResult sums, metrics_->Read());
    SUBSTRAX_RETURN_IF_ERROR(metrics_->Reset());
    return sums;
  }

  void MarkPhase(Phase phase) override { clock_.Mark(phase); }
  absl::StatusOr<PhaseSeconds> TakePhaseSeconds() override { return clock_.Take(); }

  absl::StatusOr<EvalResult> Evaluate(const Dataset& data, int64_t begin, int64_t end) override {
    constexpr int64_t kChunk = 1024;
    int64_t next = begin;
    Producer<Batch> chunks = [&]() -> absl::StatusOr<std::optional<Batch>> {
      if (next >= end) return std::optional<Batch>();
      std::vector<int64_t> rows;
      for (int64_t i = next; i < std::min(end, next + kChunk); ++i) rows.push_back(i);
      next += kChunk;
      return std::optional<Batch>(Gather(data, rows));
    };
    SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaPrefetcher> batches,
                              CudaPrefetcher::Create(device_.get(), std::move(chunks), 2));
    SUBSTRAX_RETURN_IF_ERROR(eval_metrics_->Reset());
    while (true) {
      SUBSTRAX_ASSIGN_OR_RETURN(std::optional<DeviceBatchView> batch, batches->Next());
      if (!batch.has_value()) break;
      SUBSTRAX_RETURN_IF_ERROR(model_->Evaluate(params_, *batch, eval_metrics_.get()));
    }
    SUBSTRAX_RETURN_IF_ERROR(tp_pending_->Collect());
    return eval_metrics_->Read();
  }

  absl::StatusOr<TensorTree> Parameters() override { return device_->Download(params_); }

 private:
  const std::unique_ptr<CudaDevice> device_;
  const std::unique_ptr<CudaModel> model_;
  const std::unique_ptr<CudaOptimizer> optimizer_;
  DeviceTree params_;
  const std::unique_ptr<CudaMetrics> metrics_;
  const std::unique_ptr<CudaMetrics> eval_metrics_;
  const std::unique_ptr<CudaPrefetcher> batches_;
  const std::shared_ptr<PendingCollectives> tp_pending_;
  std::optional<DeviceBatchView> batch_;
  DeviceBuffer flat_;
  DeviceTree grads_;  // views into flat_
  EventPhaseClock clock_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCudaBackend(BackendSetup setup) {
  const v1::JobSpec& spec = *setup.spec;
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device,
                            CudaDevice::Create(setup.local_index));
  CudaTensorParallelism tp;
  auto tp_pending = std::make_shared<PendingCollectives>();
  if (setup.model_axis != nullptr) {
    Communicator* comm = setup.model_axis;
    tp.axis_size = comm->size();
    tp.index = setup.model_index;
    // Ordered on the compute stream (the model's later work sees the sum); collected later.
    tp.all_reduce_sum = [comm, stream = device->stream(), tp_pending](float* values,
                                                                       int64_t count) {
      return Annotate(
          tp_pending->Add(comm->AllReduceAsync(values, DataType::kFloat32,
                                               static_cast<size_t>(count), ReduceOp::kSum,
                                               ExecutionContext::Stream(stream))),
          "tensor-parallel all-reduce");
    };
  }
  CudaModelOptions model_options;
  model_options.precision = spec.precision();
  model_options.cuda_graphs = setup.cuda_graphs;
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> model,
                            CudaModel::Create(spec.model(), setup.num_features, device.get(),
                                              std::move(tp), model_options));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaOptimizer> optimizer,
                            CudaOptimizer::Create(spec.optimizer(), device.get()));
  if (setup.cuda_graphs) optimizer->EnableCudaGraphs();
  SUBSTRAX_ASSIGN_OR_RETURN(DeviceTree params, model->Init(spec.seed()));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaMetrics> metrics, CudaMetrics::Create(*device));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaMetrics> eval_metrics,
                            CudaMetrics::Create(*device));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaPrefetcher> batches,
                            CudaPrefetcher::Create(device.get(), std::move(setup.batches),
                                                   spec.data().prefetch_size()));
  return std::unique_ptr<DeviceBackend>(
      new CudaBackend(std::move(device), std::move(model), std::move(optimizer),
                      std::move(params), std::move(metrics), std::move(eval_metrics),
                      std::move(batches), std::move(tp_pending)));
}

}  // namespace substrax
