#include "worker/compute/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/optimizers.h"
#include "core/status.h"
#include "worker/gpu/cuda_status.h"
#include "worker/compute/cuda_kernels.h"

namespace substrax {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// Row-major C[m, n] = op(A)[m, k] · op(B)[k, n] through column-major cuBLAS: a row-major matrix
// is its transpose in column-major, so compute C^T = op(B)^T · op(A)^T with the operands swapped.
absl::Status Gemm(const CudaDevice& device, bool trans_a, bool trans_b, int64_t m, int64_t n,
                  int64_t k, const float* a, const float* b, float* c) {
  if (m == 0 || n == 0) return absl::OkStatus();
  const float one = 1.0f, zero = 0.0f;
  const int lda = static_cast<int>(trans_a ? m : k);
  const int ldb = static_cast<int>(trans_b ? k : n);
  return CublasStatus(
      cublasSgemm(static_cast<cublasHandle_t>(device.cublas()), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                  static_cast<int>(k), &one, b, ldb, a, lda, &zero, c, static_cast<int>(n)),
      absl::StrCat("cublasSgemm [", m, "x", k, "]·[", k, "x", n, "]"), device.name());
}

absl::Status Kernel(cudaError_t error, const char* kernel, const CudaDevice& device) {
  return CudaStatus(error, absl::StrCat("kernel ", kernel), device.name());
}

}  // namespace

struct CudaModel::Impl {
  const CudaDevice* device = nullptr;
  // The CPU model of the same spec: parameter specs, local shapes, initialisation.
  std::unique_ptr<Model> host;
  CudaTensorParallelism tp;
  std::vector<LayerSplit> splits;
  int64_t num_features = 0;
  int64_t num_outputs = 0;
  // Per layer: local input and output widths.
  std::vector<int64_t> in_width, out_width;
  int64_t max_width = 0;
  // Workspace for batches of up to `capacity` examples: each layer's output (after ReLU), and two
  // gradient buffers that alternate going backward.
  int64_t capacity = 0;
  std::vector<DeviceBuffer> acts;
  DeviceBuffer d, d_next;

  absl::Status Reserve(int64_t n) {
    if (n <= capacity) return absl::OkStatus();
    acts.clear();
    for (int64_t w : out_width) {
      SUBSTRAX_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(*device, n * w));
      acts.push_back(std::move(b));
    }
    SUBSTRAX_ASSIGN_OR_RETURN(d, DeviceBuffer::Allocate(*device, n * max_width));
    SUBSTRAX_ASSIGN_OR_RETURN(d_next, DeviceBuffer::Allocate(*device, n * max_width));
    capacity = n;
    return absl::OkStatus();
  }

  // Device pointers of every layer's kernel and bias, checked against the local shapes.
  absl::StatusOr<std::vector<const float*>> CheckParams(const DeviceTree& params) const {
    std::vector<const float*> out;
    for (const ParamSpec& spec : host->params()) {
      auto it = params.find(spec.name);
      if (it == params.end()) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' is missing"));
      }
      const std::vector<int64_t> local = host->LocalShape(spec);
      if (it->second.shape != local) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' has shape ",
                                                       ShapeString(it->second.shape),
                                                       ", expected ", ShapeString(local)));
      }
      out.push_back(it->second.data());
    }
    if (params.size() != host->params().size()) {
      for (const auto& [name, tensor] : params) {
        bool known = false;
        for (const ParamSpec& spec : host->params()) known = known || spec.name == name;
        if (!known) {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter '", name, "' is not a parameter of this model"));
        }
      }
    }
    return out;
  }

  absl::Status CheckBatch(const DeviceBatchView& batch) const {
    if (batch.num_features != num_features) {
      return absl::InvalidArgumentError(absl::StrCat("batch.inputs has ", batch.num_features,
                                                     " features per example, expected ",
                                                     num_features));
    }
    const int64_t width = host->is_classification() ? 1 : num_outputs;
    if (batch.target_width != width) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch.targets has ", batch.target_width, " values per example, expected ", width,
          host->is_classification() ? " (a class id)" : " (the regression outputs)"));
    }
    if (batch.size < 0 || (batch.size > 0 && (batch.inputs == nullptr || batch.targets == nullptr))) {
      return absl::InvalidArgumentError("batch: no device memory for a non-empty batch");
    }
    return absl::OkStatus();
  }

  absl::Status AllReduce(float* values, int64_t count) const {
    return tp.all_reduce_sum(values, count);
  }

  // Forward through every layer into acts; with `d_out`, the head's gradient of the mean loss.
  absl::Status ForwardAndHead(const std::vector<const float*>& p, const DeviceBatchView& batch,
                              float* d_out, CudaMetrics* metrics) {
    const int64_t n = batch.size;
    cudaStream_t stream = device->stream();
    const size_t layers = splits.size();
    for (size_t l = 0; l < layers; ++l) {
      const float* input = l == 0 ? batch.inputs : acts[l - 1].data();
      float* z = acts[l].data();
      SUBSTRAX_RETURN_IF_ERROR(
          Gemm(*device, false, false, n, out_width[l], in_width[l], input, p[2 * l], z));
      // A row-parallel kernel gives a partial sum; its bias is added once, after the sum.
      if (splits[l] == LayerSplit::kRow) SUBSTRAX_RETURN_IF_ERROR(AllReduce(z, n * out_width[l]));
      SUBSTRAX_RETURN_IF_ERROR(
          Kernel(gpu::BiasAdd(z, p[2 * l + 1], n, out_width[l], stream), "BiasAdd", *device));
      if (l + 1 < layers) {
        SUBSTRAX_RETURN_IF_ERROR(Kernel(gpu::Relu(z, n * out_width[l], stream), "Relu", *device));
      }
    }
    auto* sums = static_cast<gpu::DeviceMetricSums*>(metrics->device_sums());
    const float scale = 1.0f / static_cast<float>(n);
    if (host->is_classification()) {
      SUBSTRAX_RETURN_IF_ERROR(
          Kernel(gpu::SoftmaxCrossEntropy(acts.back().data(), batch.targets, n, num_outputs,
                                          scale, d_out, sums, stream),
                 "SoftmaxCrossEntropy", *device));
    } else {
      SUBSTRAX_RETURN_IF_ERROR(
          Kernel(gpu::MeanSquaredError(acts.back().data(), batch.targets, n, num_outputs, scale,
                                       d_out, sums, stream),
                 "MeanSquaredError", *device));
    }
    metrics->AddCount(n);
    return absl::OkStatus();
  }
};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const v1::ModelSpec& spec,
                                                             int64_t num_features,
                                                             const CudaDevice* device,
                                                             CudaTensorParallelism tp) {
  if (device == nullptr) return absl::InvalidArgumentError("CudaModel needs a device, got none");
  if (tp.axis_size > 1 && !tp.all_reduce_sum) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism: a model axis of size ", tp.axis_size,
        " needs an all_reduce_sum callback (the worker's collective over the model axis)"));
  }
  // The CPU model validates the spec and the parallelism and knows the shapes; its all-reduce is
  // never called (it computes nothing here).
  TensorParallelism host_tp;
  host_tp.axis_size = tp.axis_size;
  host_tp.index = tp.index;
  host_tp.all_reduce_sum = [](absl::Span<float>) {
    return absl::InternalError("the host model of a CudaModel computes nothing");
  };
  auto impl = std::make_unique<Impl>();
  SUBSTRAX_ASSIGN_OR_RETURN(impl->host, Model::Create(spec, num_features, std::move(host_tp)));
  impl->device = device;
  impl->tp = std::move(tp);
  impl->splits = LayerSplits(spec, impl->tp.axis_size);
  impl->num_features = num_features;
  impl->num_outputs = ModelOutputSize(spec);
  const std::vector<ParamSpec>& params = impl->host->params();
  impl->max_width = num_features;
  for (size_t i = 0; i + 1 < params.size(); i += 2) {
    const std::vector<int64_t> shape = impl->host->LocalShape(params[i]);
    impl->in_width.push_back(shape[0]);
    impl->out_width.push_back(shape[1]);
    impl->max_width = std::max({impl->max_width, shape[0], shape[1]});
  }
  if (impl->splits.size() != impl->out_width.size()) {
    return absl::InternalError(absl::StrCat("model catalog: ", impl->splits.size(),
                                            " layer splits for ", impl->out_width.size(),
                                            " layers"));
  }
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(impl)));
}

bool CudaModel::is_classification() const { return impl_->host->is_classification(); }
const std::vector<ParamSpec>& CudaModel::params() const { return impl_->host->params(); }
std::vector<int64_t> CudaModel::LocalShape(const ParamSpec& p) const {
  return impl_->host->LocalShape(p);
}

absl::StatusOr<DeviceTree> CudaModel::Init(uint64_t seed) const {
  return impl_->device->Upload(impl_->host->Init(seed));
}

absl::Status CudaModel::LossAndGradients(const DeviceTree& params, const DeviceBatchView& batch,
                                         DeviceTree* grads, CudaMetrics* metrics) {
  Impl& m = *impl_;
  SUBSTRAX_ASSIGN_OR_RETURN(const std::vector<const float*> p, m.CheckParams(params));
  SUBSTRAX_RETURN_IF_ERROR(m.CheckBatch(batch));
  const int64_t n = batch.size;
  if (n == 0) {
    return absl::InvalidArgumentError(
        "batch.inputs: the batch is empty; the mean loss of no examples is undefined");
  }
  // The gradients' buffers, made once and reused.
  std::vector<float*> g;
  for (const ParamSpec& spec : m.host->params()) {
    DeviceTensor& t = (*grads)[spec.name];
    const std::vector<int64_t> local = m.host->LocalShape(spec);
    if (t.shape != local || t.data() == nullptr) {
      int64_t size = 1;
      for (int64_t dim : local) size *= dim;
      t.shape = local;
      SUBSTRAX_ASSIGN_OR_RETURN(t.buffer, DeviceBuffer::Allocate(*m.device, size));
    }
    g.push_back(t.data());
  }
  SUBSTRAX_RETURN_IF_ERROR(m.device->MakeCurrent());
  SUBSTRAX_RETURN_IF_ERROR(m.Reserve(n));
  SUBSTRAX_RETURN_IF_ERROR(m.ForwardAndHead(p, batch, m.d.data(), metrics));
  cudaStream_t stream = m.device->stream();
  for (int l = static_cast<int>(m.splits.size()) - 1; l >= 0; --l) {
    const float* input = l == 0 ? batch.inputs : m.acts[l - 1].data();
    SUBSTRAX_RETURN_IF_ERROR(Gemm(*m.device, true, false, m.in_width[l], m.out_width[l], n, input,
                                  m.d.data(), g[2 * l]));
    SUBSTRAX_RETURN_IF_ERROR(Kernel(
        gpu::ColumnSums(m.d.data(), n, m.out_width[l], g[2 * l + 1], stream), "ColumnSums",
        *m.device));
    if (l > 0) {
      // Through the kernel, then the ReLU that made this layer's input. A column-parallel
      // kernel's input gradient is this device's share of a sum over the model axis.
      float* d_input = m.d_next.data();
      SUBSTRAX_RETURN_IF_ERROR(Gemm(*m.device, false, true, n, m.in_width[l], m.out_width[l],
                                    m.d.data(), p[2 * l], d_input));
      if (m.splits[l] == LayerSplit::kColumn) {
        SUBSTRAX_RETURN_IF_ERROR(m.AllReduce(d_input, n * m.in_width[l]));
      }
      SUBSTRAX_RETURN_IF_ERROR(Kernel(
          gpu::ReluBackwardMask(d_input, m.acts[l - 1].data(), n * m.in_width[l], stream),
          "ReluBackwardMask", *m.device));
      std::swap(m.d, m.d_next);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaModel::Evaluate(const DeviceTree& params, const DeviceBatchView& batch,
                                 CudaMetrics* metrics) {
  Impl& m = *impl_;
  SUBSTRAX_ASSIGN_OR_RETURN(const std::vector<const float*> p, m.CheckParams(params));
  SUBSTRAX_RETURN_IF_ERROR(m.CheckBatch(batch));
  if (batch.size == 0) return absl::OkStatus();
  SUBSTRAX_RETURN_IF_ERROR(m.device->MakeCurrent());
  SUBSTRAX_RETURN_IF_ERROR(m.Reserve(batch.size));
  return m.ForwardAndHead(p, batch, nullptr, metrics);
}

// ---------------------------------------------------------------------------------------------

struct CudaOptimizer::Impl {
  const CudaDevice* device = nullptr;
  OptimizerConfig config;
  const gpu::CudaOptimizerKernel* kernel = nullptr;
  // The values of kernel->hyper, in its order.
  std::vector<double> hyper;
  std::map<std::string, std::vector<DeviceTensor>> state;
  int64_t steps = 0;
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
  std::vector<float*> slot_data(num_slots);
  for (auto& [name, p] : *params) {
    std::vector<DeviceTensor>& slots = o.state[name];
    for (size_t s = 0; s < num_slots; ++s) slot_data[s] = slots[s].data();
    gpu::OptimizerStepArgs args;
    args.p = p.data();
    args.g = grads.at(name).data();
    args.slots = slot_data.data();
    args.n = p.size();
    args.learning_rate = o.config.learning_rate;
    args.step = step;
    args.hyper = o.hyper.data();
    SUBSTRAX_RETURN_IF_ERROR(Kernel(o.kernel->update(args, stream), "optimizer update", device));
  }
  o.steps = step;
  return absl::OkStatus();
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
