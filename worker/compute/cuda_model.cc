#include "worker/compute/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
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
#include "worker/compute/cuda_step_graph.h"

namespace substrax {

using cuda_internal::Kernel;
using cuda_internal::ShapeString;
using cuda_internal::StepGraph;


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
  // Bumped whenever Reserve reallocates: a captured graph holds the old addresses.
  int64_t workspace_generation = 0;
  CudaModelOptions options;
  // bf16: the two operands of a matrix product cast to bfloat16 (two per float of the buffer).
  int64_t max_weights = 0;
  DeviceBuffer bf16_a, bf16_b;

  // The captured LossAndGradients (options.cuda_graphs): for batches of graph_n examples (0:
  // none captured yet), read from graph_inputs / graph_targets.
  std::unique_ptr<StepGraph> graph;
  int64_t graph_n = 0;
  DeviceBuffer graph_inputs, graph_targets;
  std::vector<const void*> key_scratch;  // reused: no allocation per step

  absl::Status Reserve(int64_t n) {
    if (n <= capacity) return absl::OkStatus();
    acts.clear();
    for (int64_t w : out_width) {
      SUBSTRAX_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(*device, n * w));
      acts.push_back(std::move(b));
    }
    SUBSTRAX_ASSIGN_OR_RETURN(d, DeviceBuffer::Allocate(*device, n * max_width));
    SUBSTRAX_ASSIGN_OR_RETURN(d_next, DeviceBuffer::Allocate(*device, n * max_width));
    if (options.precision == v1::PRECISION_BF16) {
      // Every operand of a product is an activation or gradient of at most n x max_width, or a
      // kernel of at most max_weights values; two bfloat16 values per float.
      const int64_t values = std::max(n * max_width, max_weights);
      SUBSTRAX_ASSIGN_OR_RETURN(bf16_a, DeviceBuffer::Allocate(*device, (values + 1) / 2));
      SUBSTRAX_ASSIGN_OR_RETURN(bf16_b, DeviceBuffer::Allocate(*device, (values + 1) / 2));
    }
    capacity = n;
    ++workspace_generation;
    return absl::OkStatus();
  }

  // Row-major C[m, n] = op(A)[m, k] · op(B)[k, n] through column-major cuBLAS: a row-major
  // matrix is its transpose in column-major, so compute C^T = op(B)^T · op(A)^T with the
  // operands swapped. In options.precision; the message is built only on failure (this runs
  // every step, and during graph capture).
  absl::Status Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const float* a,
                    const float* b, float* c) {
    if (m == 0 || n == 0) return absl::OkStatus();
    const float one = 1.0f, zero = 0.0f;
    const int lda = static_cast<int>(trans_a ? m : k);
    const int ldb = static_cast<int>(trans_b ? k : n);
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    auto handle = static_cast<cublasHandle_t>(device->cublas());
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    switch (options.precision) {
      case v1::PRECISION_TF32:
        status = cublasGemmEx(handle, op_b, op_a, ni, mi, ki, &one, b, CUDA_R_32F, ldb, a,
                              CUDA_R_32F, lda, &zero, c, CUDA_R_32F, ni,
                              CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
        break;
      case v1::PRECISION_BF16: {
        SUBSTRAX_RETURN_IF_ERROR(Kernel(gpu::CastToBf16(a, m * k, bf16_a.data(), device->stream()),
                                        "CastToBf16", *device));
        SUBSTRAX_RETURN_IF_ERROR(Kernel(gpu::CastToBf16(b, k * n, bf16_b.data(), device->stream()),
                                        "CastToBf16", *device));
        status = cublasGemmEx(handle, op_b, op_a, ni, mi, ki, &one, bf16_b.data(), CUDA_R_16BF,
                              ldb, bf16_a.data(), CUDA_R_16BF, lda, &zero, c, CUDA_R_32F, ni,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        break;
      }
      default:
        status = cublasSgemm(handle, op_b, op_a, ni, mi, ki, &one, b, ldb, a, lda, &zero, c, ni);
    }
    if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
    return CublasStatus(status,
                        absl::StrCat(options.precision == v1::PRECISION_BF16   ? "bf16 "
                                     : options.precision == v1::PRECISION_TF32 ? "tf32 "
                                                                               : "",
                                     "GEMM [", m, "x", k, "]·[", k, "x", n, "]"),
                        device->name());
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
  // Adds the losses into `sums`; the caller counts the examples (on the host, per call: a graph
  // replay runs none of this host code).
  absl::Status ForwardAndHead(const std::vector<const float*>& p, const DeviceBatchView& batch,
                              float* d_out, gpu::DeviceMetricSums* sums) {
    const int64_t n = batch.size;
    cudaStream_t stream = device->stream();
    const size_t layers = splits.size();
    for (size_t l = 0; l < layers; ++l) {
      const float* input = l == 0 ? batch.inputs : acts[l - 1].data();
      float* z = acts[l].data();
      SUBSTRAX_RETURN_IF_ERROR(
          Gemm(false, false, n, out_width[l], in_width[l], input, p[2 * l], z));
      // A row-parallel kernel gives a partial sum; its bias is added once, after the sum.
      if (splits[l] == LayerSplit::kRow) SUBSTRAX_RETURN_IF_ERROR(AllReduce(z, n * out_width[l]));
      const bool relu = l + 1 < layers;
      if (options.fused_epilogues) {
        SUBSTRAX_RETURN_IF_ERROR(Kernel(
            gpu::BiasActivation(z, p[2 * l + 1], n, out_width[l], relu, stream), "BiasActivation",
            *device));
        continue;
      }
      SUBSTRAX_RETURN_IF_ERROR(
          Kernel(gpu::BiasAdd(z, p[2 * l + 1], n, out_width[l], stream), "BiasAdd", *device));
      if (relu) {
        SUBSTRAX_RETURN_IF_ERROR(Kernel(gpu::Relu(z, n * out_width[l], stream), "Relu", *device));
      }
    }
    const float scale = 1.0f / static_cast<float>(n);
    if (host->is_classification()) {
      return Kernel(gpu::SoftmaxCrossEntropy(acts.back().data(), batch.targets, n, num_outputs,
                                             scale, d_out, sums, stream),
                    "SoftmaxCrossEntropy", *device);
    }
    return Kernel(gpu::MeanSquaredError(acts.back().data(), batch.targets, n, num_outputs, scale,
                                        d_out, sums, stream),
                  "MeanSquaredError", *device);
  }

  // The whole pass of LossAndGradients queued on the stream: forward, head, backward. Only
  // kernel launches and cuBLAS calls (no allocation, no synchronisation), so that it can be
  // captured as a graph.
  absl::Status Enqueue(const std::vector<const float*>& p, const std::vector<float*>& g,
                       const DeviceBatchView& batch, gpu::DeviceMetricSums* sums) {
    const int64_t n = batch.size;
    SUBSTRAX_RETURN_IF_ERROR(ForwardAndHead(p, batch, d.data(), sums));
    cudaStream_t stream = device->stream();
    for (int l = static_cast<int>(splits.size()) - 1; l >= 0; --l) {
      const float* input = l == 0 ? batch.inputs : acts[l - 1].data();
      SUBSTRAX_RETURN_IF_ERROR(
          Gemm(true, false, in_width[l], out_width[l], n, input, d.data(), g[2 * l]));
      // The fused path computed this layer's bias gradient with the ReLU mask above it (below,
      // at l + 1), except for the head's.
      const bool bias_done = options.fused_epilogues && l + 1 < static_cast<int>(splits.size());
      if (!bias_done) {
        SUBSTRAX_RETURN_IF_ERROR(Kernel(
            gpu::ColumnSums(d.data(), n, out_width[l], g[2 * l + 1], stream), "ColumnSums",
            *device));
      }
      if (l == 0) break;
      // Through the kernel, then the ReLU that made this layer's input. A column-parallel
      // kernel's input gradient is this device's share of a sum over the model axis.
      float* d_input = d_next.data();
      SUBSTRAX_RETURN_IF_ERROR(
          Gemm(false, true, n, in_width[l], out_width[l], d.data(), p[2 * l], d_input));
      if (splits[l] == LayerSplit::kColumn) {
        SUBSTRAX_RETURN_IF_ERROR(AllReduce(d_input, n * in_width[l]));
      }
      if (options.fused_epilogues) {
        SUBSTRAX_RETURN_IF_ERROR(Kernel(
            gpu::ReluMaskColumnSums(d_input, acts[l - 1].data(), n, in_width[l], g[2 * (l - 1) + 1],
                                    stream),
            "ReluMaskColumnSums", *device));
      } else {
        SUBSTRAX_RETURN_IF_ERROR(Kernel(
            gpu::ReluBackwardMask(d_input, acts[l - 1].data(), n * in_width[l], stream),
            "ReluBackwardMask", *device));
      }
      std::swap(d, d_next);
    }
    return absl::OkStatus();
  }

  // Replays the graph of Enqueue for `batch` when it can (capturing it first when needed): true
  // when it did, false when the caller must launch eagerly (graph->fallback() says why).
  // Errors: CUDA's around a replay (a failed capture is a fallback, not an error).
  absl::StatusOr<bool> Replay(const std::vector<const float*>& p, const std::vector<float*>& g,
                              const DeviceBatchView& batch, gpu::DeviceMetricSums* sums) {
    const int64_t n = batch.size;
    if (tp.axis_size > 1) {
      graph->Fallback("tensor parallelism: its collectives run between the kernels of the pass");
      return false;
    }
    if (graph_n != 0 && n != graph_n) {
      graph->Fallback(absl::StrCat("a batch of ", n, " examples, not the captured ", graph_n));
      return false;
    }
    if (graph->Broken()) return false;
    // A graph reads fixed addresses: the batch goes into the model's own buffers first (a copy
    // within device memory, queued before the replay).
    if (graph_inputs.size() < n * num_features) {
      SUBSTRAX_ASSIGN_OR_RETURN(graph_inputs, DeviceBuffer::Allocate(*device, n * num_features));
    }
    if (graph_targets.size() < n * batch.target_width) {
      SUBSTRAX_ASSIGN_OR_RETURN(graph_targets,
                                DeviceBuffer::Allocate(*device, n * batch.target_width));
    }
    cudaStream_t stream = device->stream();
    SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(graph_inputs.data(), batch.inputs, n * num_features * sizeof(float),
                        cudaMemcpyDeviceToDevice, stream),
        "copying the batch into the graph's inputs", device->name()));
    SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(graph_targets.data(), batch.targets,
                        n * batch.target_width * sizeof(float), cudaMemcpyDeviceToDevice, stream),
        "copying the batch into the graph's targets", device->name()));
    DeviceBatchView fixed = batch;
    fixed.inputs = graph_inputs.data();
    fixed.targets = graph_targets.data();
    // The addresses the graph reads and writes.
    key_scratch.assign(p.begin(), p.end());
    key_scratch.insert(key_scratch.end(), g.begin(), g.end());
    key_scratch.push_back(sums);
    key_scratch.push_back(reinterpret_cast<const void*>(workspace_generation));
    SUBSTRAX_ASSIGN_OR_RETURN(
        const bool launched,
        graph->Launch(key_scratch, [&] { return Enqueue(p, g, fixed, sums); }));
    if (launched) graph_n = n;
    return launched;
  }
};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaModel::~CudaModel() = default;

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const v1::ModelSpec& spec,
                                                             int64_t num_features,
                                                             const CudaDevice* device,
                                                             CudaTensorParallelism tp) {
  return Create(spec, num_features, device, std::move(tp), CudaModelOptions());
}

absl::StatusOr<std::unique_ptr<CudaModel>> CudaModel::Create(const v1::ModelSpec& spec,
                                                             int64_t num_features,
                                                             const CudaDevice* device,
                                                             CudaTensorParallelism tp,
                                                             const CudaModelOptions& options) {
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
  impl->options = options;
  if (impl->options.precision == v1::PRECISION_UNSPECIFIED) {
    impl->options.precision = v1::PRECISION_FP32;
  }
  if (impl->options.cuda_graphs) {
    impl->graph = std::make_unique<StepGraph>(device, "the forward and backward pass");
  }
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
    impl->max_weights = std::max(impl->max_weights, shape[0] * shape[1]);
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
  auto* sums = static_cast<gpu::DeviceMetricSums*>(metrics->device_sums());
  bool replayed = false;
  if (m.options.cuda_graphs) {
    SUBSTRAX_ASSIGN_OR_RETURN(replayed, m.Replay(p, g, batch, sums));
  }
  if (!replayed) SUBSTRAX_RETURN_IF_ERROR(m.Enqueue(p, g, batch, sums));
  metrics->AddCount(n);
  return absl::OkStatus();
}

int64_t CudaModel::graph_replays() const {
  return impl_->graph == nullptr ? 0 : impl_->graph->replays();
}
const std::string& CudaModel::graph_fallback() const {
  static const std::string kNone;
  return impl_->graph == nullptr ? kNone : impl_->graph->fallback();
}

absl::Status CudaModel::Evaluate(const DeviceTree& params, const DeviceBatchView& batch,
                                 CudaMetrics* metrics) {
  Impl& m = *impl_;
  SUBSTRAX_ASSIGN_OR_RETURN(const std::vector<const float*> p, m.CheckParams(params));
  SUBSTRAX_RETURN_IF_ERROR(m.CheckBatch(batch));
  if (batch.size == 0) return absl::OkStatus();
  SUBSTRAX_RETURN_IF_ERROR(m.device->MakeCurrent());
  SUBSTRAX_RETURN_IF_ERROR(m.Reserve(batch.size));
  SUBSTRAX_RETURN_IF_ERROR(m.ForwardAndHead(
      p, batch, nullptr, static_cast<gpu::DeviceMetricSums*>(metrics->device_sums())));
  metrics->AddCount(batch.size);
  return absl::OkStatus();
}

}  // namespace substrax
