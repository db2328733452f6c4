// The optimizers and metric sums of //worker/compute:cuda_model on one GPU (the models are in
// cuda_model.cc).
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "core/optimizers.h"
#include "core/status.h"
#include "worker/compute/cuda_kernels.h"
#include "worker/compute/cuda_model.h"
#include "worker/compute/cuda_step_graph.h"
#include "worker/gpu/cuda_status.h"

namespace substrax {

using cuda_internal::Kernel;
using cuda_internal::ShapeString;
using cuda_internal::StepGraph;

struct CudaOptimizer::Impl {
  const CudaDevice* device = nullptr;
  OptimizerConfig config;
  const gpu::CudaOptimizerKernel* kernel = nullptr;
  // The values of kernel->hyper, in its order.
  std::vector<double> hyper;
  std::map<std::string, std::vector<DeviceTensor>> state;
  int64_t steps = 0;
  // The learning rate and the kernel row's step_scalars, on the device, and the pinned host
  // slots they are copied from: a ring of kScalarSlots, each reused only once the copy out of
  // it is done (its event), so the copy is a real asynchronous DMA and the host never waits for
  // the device (a copy from pageable memory would stage through a driver buffer, or
  // synchronize).
  static constexpr int kScalarSlots = 8;
  float* pinned_scalars = nullptr;  // kScalarSlots x kMaxStepScalars
  cudaEvent_t copied[kScalarSlots] = {};
  DeviceBuffer step_scalars;

  ~Impl() {
    for (cudaEvent_t e : copied) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (pinned_scalars != nullptr) cudaFreeHost(pinned_scalars);
  }

  // Copies this step's scalars (`count` of them, computed into the slot by `fill`) to
  // step_scalars on `stream`.
  template <typename Fill>
  absl::Status CopyStepScalars(int64_t step, cudaStream_t stream, Fill&& fill) {
    if (pinned_scalars == nullptr) {
      SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
          cudaMallocHost(&pinned_scalars, kScalarSlots * gpu::kMaxStepScalars * sizeof(float)),
          "cudaMallocHost of the optimizer's step values", device->name()));
    }
    const int slot = static_cast<int>(step % kScalarSlots);
    if (copied[slot] == nullptr) {
      SUBSTRAX_RETURN_IF_ERROR(
          CudaStatus(cudaEventCreateWithFlags(&copied[slot], cudaEventDisableTiming),
                     "cudaEventCreate", device->name()));
    } else {
      // Recorded kScalarSlots steps ago: long done unless the host is that far ahead.
      SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(copied[slot]),
                                          "waiting for an earlier step's values to be copied",
                                          device->name()));
    }
    float* host = pinned_scalars + slot * gpu::kMaxStepScalars;
    const int count = fill(host);
    SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(step_scalars.data(), host, count * sizeof(float), cudaMemcpyHostToDevice,
                        stream),
        "copying the optimizer's step values to the device", device->name()));
    return CudaStatus(cudaEventRecord(copied[slot], stream), "cudaEventRecord", device->name());
  }
  // EnableCudaGraphs: the update's launches as one graph.
  std::unique_ptr<StepGraph> graph;
  std::vector<const void*> key_scratch;
  std::vector<float*> slot_data;

  // One kernel launch per parameter, reading the step's scalars from the device.
  absl::Status Enqueue(const DeviceTree& grads, DeviceTree* params, int64_t step) {
    cudaStream_t stream = device->stream();
    const size_t num_slots = config.info->slots.size();
    slot_data.resize(num_slots);
    for (auto& [name, p] : *params) {
      std::vector<DeviceTensor>& slots = state[name];
      for (size_t s = 0; s < num_slots; ++s) slot_data[s] = slots[s].data();
      gpu::OptimizerStepArgs args;
      args.p = p.data();
      args.g = grads.at(name).data();
      args.slots = slot_data.data();
      args.n = p.size();
      args.learning_rate = config.learning_rate;
      args.step = step;
      args.hyper = hyper.data();
      args.step_scalars = step_scalars.data();
      SUBSTRAX_RETURN_IF_ERROR(Kernel(kernel->update(args, stream), "optimizer update", *device));
    }
    return absl::OkStatus();
  }
};

CudaOptimizer::CudaOptimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaOptimizer::~CudaOptimizer() = default;

absl::StatusOr<std::unique_ptr<CudaOptimizer>> CudaOptimizer::Create(
    const v1::OptimizerSpec& spec, const CudaDevice* device) {
  SUBSTRAX_ASSIGN_OR_RETURN(OptimizerConfig config, ResolveOptimizer(spec));
  return Create(config, device);
}

absl::StatusOr<std::unique_ptr<CudaOptimizer>> CudaOptimizer::Create(
    const OptimizerConfig& config, const CudaDevice* device) {
  if (config.info == nullptr) {
    return absl::InvalidArgumentError("spec.optimizer.type: no optimizer was resolved");
  }
  const gpu::CudaOptimizerKernel* kernel = gpu::FindCudaOptimizerKernel(config.info->name.c_str());
  if (kernel == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "optimizer '", config.info->name, "' is not implemented on the cuda backend"));
  }
  if (device == nullptr) {
    return absl::InvalidArgumentError("CudaOptimizer needs a device, got none");
  }
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->config = config;
  impl->kernel = kernel;
  for (int i = 0; i < gpu::kMaxOptimizerHyper && kernel->hyper[i] != nullptr; ++i) {
    // A kernel row naming a hyper-parameter its table row lacks is a bug in this build, not in
    // the spec; say so rather than die in OptimizerConfig::Get.
    if (config.info->FindHyper(kernel->hyper[i]) == nullptr) {
      return absl::InternalError(absl::StrCat("the cuda kernel of optimizer '",
                                              config.info->name, "' reads hyper-parameter '",
                                              kernel->hyper[i], "', which core/optimizers.h does "
                                              "not give it"));
    }
    impl->hyper.push_back(config.Get(kernel->hyper[i]));
  }
  return std::unique_ptr<CudaOptimizer>(new CudaOptimizer(std::move(impl)));
}

int64_t CudaOptimizer::steps() const { return impl_->steps; }

absl::Status CudaOptimizer::ScaleGradients(DeviceTree* grads, float divisor) {
  const CudaDevice& device = *impl_->device;
  for (auto& [name, g] : *grads) {
    SUBSTRAX_RETURN_IF_ERROR(
        Kernel(gpu::Scale(g.data(), g.size(), 1.0f / divisor, device.stream()), "Scale", device));
  }
  return absl::OkStatus();
}

absl::Status CudaOptimizer::Update(const DeviceTree& grads, DeviceTree* params) {
  Impl& o = *impl_;
  const CudaDevice& device = *o.device;
  // Validate everything before queueing anything, as the CPU optimizer.
  for (const auto& [name, p] : *params) {
    auto it = grads.find(name);
    if (it == grads.end()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has no gradient"));
    }
    if (it->second.shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient of parameter '", name, "' has shape ", ShapeString(it->second.shape),
          ", the parameter ", ShapeString(p.shape)));
    }
    auto st = o.state.find(name);
    if (st != o.state.end() && !st->second.empty() && st->second.front().shape != p.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", name, "' has shape ", ShapeString(p.shape),
          ", but its optimizer state was made for ", ShapeString(st->second.front().shape)));
    }
  }
  for (const auto& [name, g] : grads) {
    if (params->find(name) == params->end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for '", name, "', which is not a parameter"));
    }
  }
  SUBSTRAX_RETURN_IF_ERROR(device.MakeCurrent());
  cudaStream_t stream = device.stream();
  // Slots as the table's row names them; an optimizer without state has none to index.
  const size_t num_slots = o.config.info->slots.size();
  for (auto& [name, p] : *params) {
    std::vector<DeviceTensor>& slots = o.state[name];
    if (slots.size() != num_slots) {
      slots.clear();
      for (size_t s = 0; s < num_slots; ++s) {
        DeviceTensor t;
        t.shape = p.shape;
        SUBSTRAX_ASSIGN_OR_RETURN(t.buffer, DeviceBuffer::Allocate(device, p.size()));
        if (p.size() > 0) {
          SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
              cudaMemsetAsync(t.data(), 0, p.size() * sizeof(float), stream),
              "cudaMemsetAsync of optimizer state", device.name()));
        }
        slots.push_back(std::move(t));
      }
    }
  }
  const int64_t step = o.steps + 1;
  // Every step: the learning rate, then the row's own values (Adam's corrections).
  if (o.step_scalars.data() == nullptr) {
    SUBSTRAX_ASSIGN_OR_RETURN(o.step_scalars,
                              DeviceBuffer::Allocate(device, gpu::kMaxStepScalars));
  }
  gpu::OptimizerStepArgs args;
  args.learning_rate = o.config.learning_rate;
  args.step = step;
  args.hyper = o.hyper.data();
  SUBSTRAX_RETURN_IF_ERROR(o.CopyStepScalars(step, stream, [&](float* host) {
    host[0] = static_cast<float>(args.learning_rate);
    return 1 + (o.kernel->step_scalars != nullptr ? o.kernel->step_scalars(args, host + 1) : 0);
  }));
  bool launched = false;
  if (o.graph != nullptr) {
    o.key_scratch.clear();
    for (auto& [name, p] : *params) {
      o.key_scratch.push_back(p.data());
      o.key_scratch.push_back(grads.at(name).data());
      for (const DeviceTensor& slot : o.state[name]) o.key_scratch.push_back(slot.data());
    }
    o.key_scratch.push_back(o.step_scalars.data());
    SUBSTRAX_ASSIGN_OR_RETURN(
        launched, o.graph->Launch(o.key_scratch, [&] { return o.Enqueue(grads, params, step); }));
  }
  if (!launched) SUBSTRAX_RETURN_IF_ERROR(o.Enqueue(grads, params, step));
  o.steps = step;
  return absl::OkStatus();
}

void CudaOptimizer::EnableCudaGraphs() {
  if (impl_->graph == nullptr) {
    impl_->graph = std::make_unique<StepGraph>(impl_->device, "the optimizer update");
  }
}
int64_t CudaOptimizer::graph_replays() const {
  return impl_->graph == nullptr ? 0 : impl_->graph->replays();
}
const std::string& CudaOptimizer::graph_fallback() const {
  static const std::string kNone;
  return impl_->graph == nullptr ? kNone : impl_->graph->fallback();
}

absl::StatusOr<std::unique_ptr<CudaMetrics>> CudaMetrics::Create(const CudaDevice& device) {
  std::unique_ptr<CudaMetrics> metrics(new CudaMetrics(device));
  SUBSTRAX_RETURN_IF_ERROR(device.MakeCurrent());
  SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&metrics->sums_, sizeof(gpu::DeviceMetricSums)),
                                      "cudaMalloc of the metric sums", device.name()));
  SUBSTRAX_RETURN_IF_ERROR(metrics->Reset());
  return metrics;
}

CudaMetrics::~CudaMetrics() {
  if (sums_ != nullptr) {
    cudaSetDevice(device_.ordinal());
    cudaFree(sums_);
  }
}

absl::Status CudaMetrics::Reset() {
  count_ = 0;
  return CudaStatus(
      cudaMemsetAsync(sums_, 0, sizeof(gpu::DeviceMetricSums), device_.stream()),
      "cudaMemsetAsync of the metric sums", device_.name());
}

absl::StatusOr<EvalResult> CudaMetrics::Read() {
  gpu::DeviceMetricSums sums;
  SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(&sums, sums_, sizeof(sums),
                                                      cudaMemcpyDeviceToHost, device_.stream()),
                                      "cudaMemcpyAsync of the metric sums", device_.name()));
  SUBSTRAX_RETURN_IF_ERROR(device_.Synchronize());
  if (sums.invalid_labels > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        sums.invalid_labels, " of the ", count_,
        " examples since the last report have a label (batch.targets) that is not a class id in "
        "[0, num_classes); check the data"));
  }
  EvalResult result;
  result.loss_sum = sums.loss_sum;
  result.correct = static_cast<int64_t>(sums.correct);
  result.count = count_;
  return result;
}

}  // namespace substrax
