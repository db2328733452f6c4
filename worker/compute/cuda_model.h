// The built-in models and optimizers of worker/compute on one GPU: the same math (model.h,
// optimizer.h), parameter names and shapes (core ModelParams) and initialisation (init.h, on the
// host, then uploaded: equal to the CPU model's bit for bit), with cuBLAS for the matrix products
// and the kernels of cuda_kernels.h for the rest.
//
// Everything runs on the CudaDevice's stream and nothing synchronises: a training step queues its
// work and returns; the loss and accuracy accumulate in a CudaMetrics on the device, read once per
// report. A CudaModel keeps its activation buffers between calls (sized for the largest batch so
// far), so it is NOT thread-safe: one device thread owns it, like the device. Nothing is
// allocated on the host or the device per step once a batch size has been seen.
//
// Tensor parallelism as in model.h (Megatron-LM pairs over the model axis), with an all-reduce
// callback that takes device memory. Without --config=cuda, Create returns UNIMPLEMENTED.
#ifndef SUBSTRAX_WORKER_COMPUTE_CUDA_MODEL_H_
#define SUBSTRAX_WORKER_COMPUTE_CUDA_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/model_catalog.h"
#include "core/optimizers.h"
#include "substrax/v1/job.pb.h"
#include "worker/compute/model.h"
#include "worker/gpu/cuda_device.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// Loss and accuracy sums accumulated on the device by every LossAndGradients / Evaluate call since
// the last Reset, read back once per report (one small copy and a stream synchronisation).
class CudaMetrics {
 public:
  // Errors: as DeviceBuffer::Allocate.
  static absl::StatusOr<std::unique_ptr<CudaMetrics>> Create(const CudaDevice& device);
  ~CudaMetrics();
  CudaMetrics(const CudaMetrics&) = delete;
  CudaMetrics& operator=(const CudaMetrics&) = delete;

  // Zeroes the sums (queued on the device's stream).
  absl::Status Reset();
  // The sums so far, waiting for the queued work. count is the examples passed since Reset.
  // Errors: INVALID_ARGUMENT when some label was not a class id in [0, num_classes) (the kernel
  // counted it instead of failing the step); INTERNAL for CUDA errors.
  absl::StatusOr<EvalResult> Read();

  // For the model: the device-side sums (a gpu::DeviceMetricSums*) and the host-side count.
  void* device_sums() const { return sums_; }
  void AddCount(int64_t n) { count_ += n; }

 private:
  explicit CudaMetrics(const CudaDevice& device) : device_(device) {}
  const CudaDevice& device_;
  void* sums_ = nullptr;
  int64_t count_ = 0;
};

// How this device takes part in tensor parallelism (TensorParallelism with device memory).
struct CudaTensorParallelism {
  // Devices on the model axis (1: no tensor parallelism).
  int64_t axis_size = 1;
  // This device's coordinate on it, in [0, axis_size).
  int64_t index = 0;
  // Sums `count` floats at `values` (device memory of this model's device) in place over the
  // model axis. Called in stream order: the values are those written by the work queued on the
  // device's stream before the call, and work queued after the call must see the sum, so the
  // callback either queues its collective on that stream (NCCL) or synchronises the stream, reduces
  // and copies back before returning (a host-staged collective). Required when axis_size > 1; its
  // errors pass through unchanged.
  std::function<absl::Status(float* values, int64_t count)> all_reduce_sum;
};

// How a CudaModel computes; the defaults are the reference path.
struct CudaModelOptions {
  // Bias and ReLU fused into one kernel pass forward (BiasActivation) and one backward
  // (ReluMaskColumnSums) instead of two each; equal results bit for bit. false: the separate
  // kernels, kept to compare against.
  bool fused_epilogues = true;
  // The arithmetic of the matrix products (spec.precision): fp32 (cublasSgemm, no TF32: equal to
  // the CPU model within float rounding), tf32 (TF32 tensor cores, CUBLAS_COMPUTE_32F_FAST_TF32)
  // or bf16 (both operands cast to bfloat16 on the fly, float32 accumulation and results).
  // Parameters, gradients and activations are float32 in all three. Unspecified: fp32.
  v1::Precision precision = v1::PRECISION_FP32;
  // LossAndGradients captured as a CUDA graph for the first batch size it sees (at its second
  // call: the first runs eagerly as a warm-up) and replayed for every later batch of that size
  // (the batch is first copied into the model's own input buffers: a graph reads fixed
  // addresses; a change of parameter, gradient or metric buffers captures again). Eager launches
  // instead, with the reason written to stderr once, for a batch of another size (the last short
  // one), under tensor parallelism (its collectives run inside the pass), and for good when a
  // capture fails.
  bool cuda_graphs = false;
};

class CudaModel {
 public:
  // The model `spec` describes, for inputs of `num_features` values, on `device` (which must
  // outlive the model).
  // Errors: UNIMPLEMENTED without --config=cuda; those of Model::Create (INVALID_ARGUMENT).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const v1::ModelSpec& spec,
                                                           int64_t num_features,
                                                           const CudaDevice* device,
                                                           CudaTensorParallelism tp = {});
  // The same with `options` (fused epilogues, precision, CUDA graphs).
  static absl::StatusOr<std::unique_ptr<CudaModel>> Create(const v1::ModelSpec& spec,
                                                           int64_t num_features,
                                                           const CudaDevice* device,
                                                           CudaTensorParallelism tp,
                                                           const CudaModelOptions& options);
  ~CudaModel();

  bool is_classification() const;
  // As Model::params(), LocalShape().
  const std::vector<ParamSpec>& params() const;
  std::vector<int64_t> LocalShape(const ParamSpec& p) const;
  // Model::Init(seed) (this device's shards) computed on the host, uploaded.
  // Errors: those of the upload.
  absl::StatusOr<DeviceTree> Init(uint64_t seed) const;

  // Queues the forward and backward pass of the mean loss of `batch`: writes the gradients into
  // `grads` (entries created with LocalShape when missing, reused otherwise) and adds the batch's
  // loss sum, correct predictions and size into `metrics`.
  // Errors: INVALID_ARGUMENT naming the parameter or batch field with the wrong shape, or an empty
  // batch; CUDA/cuBLAS errors; those of tp.all_reduce_sum. Labels outside [0, num_classes) are
  // reported by metrics->Read(), not here (the labels are on the device).
  absl::Status LossAndGradients(const DeviceTree& params, const DeviceBatchView& batch,
                                DeviceTree* grads, CudaMetrics* metrics);

  // Queues the forward pass and adds the loss sum, correct predictions and size into `metrics`.
  // An empty batch adds nothing. Errors: as LossAndGradients, except an empty batch is fine.
  absl::Status Evaluate(const DeviceTree& params, const DeviceBatchView& batch,
                        CudaMetrics* metrics);

  // LossAndGradients calls served by replaying a CUDA graph (options.cuda_graphs), and why the
  // latest eager one was not ("" when it was, or graphs are off).
  int64_t graph_replays() const;
  const std::string& graph_fallback() const;

 private:
  struct Impl;
  explicit CudaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The optimizers of core/optimizers.h applied on the device, through the CUDA kernel each has in
// cuda_kernels.cu (kernels without fused multiply-adds: the same float results as the CPU
// Optimizer from the same gradients). State per parameter, as many tensors as the table's row has
// slots, created on first use; not thread-safe (the device thread owns it).
class CudaOptimizer {
 public:
  // Errors: INVALID_ARGUMENT naming the field (those of ResolveOptimizer); UNIMPLEMENTED without
  // --config=cuda or when the optimizer has no CUDA kernel.
  static absl::StatusOr<std::unique_ptr<CudaOptimizer>> Create(const v1::OptimizerSpec& spec,
                                                               const CudaDevice* device);
  // The optimizer of a resolved `config`. Errors: UNIMPLEMENTED without --config=cuda, or
  // "optimizer 'lion' is not implemented on the cuda backend" (checked before the device);
  // INVALID_ARGUMENT without a device.
  static absl::StatusOr<std::unique_ptr<CudaOptimizer>> Create(const OptimizerConfig& config,
                                                               const CudaDevice* device);
  ~CudaOptimizer();

  // Queues one update of `params` from `grads`. Nothing is queued when it fails.
  // Errors: INVALID_ARGUMENT naming the parameter when names or shapes differ; CUDA errors.
  absl::Status Update(const DeviceTree& grads, DeviceTree* params);
  // From now on Update replays a CUDA graph of its kernel launches (captured at the second call
  // with the same buffers, the first being an eager warm-up), captured again whenever the
  // parameter, gradient or state addresses change (the step-dependent values, such as Adam's
  // bias corrections, are copied to the device before each replay). A failed capture turns
  // graphs off again, with the reason on stderr and in graph_fallback().
  void EnableCudaGraphs();
  int64_t graph_replays() const;
  const std::string& graph_fallback() const;
  // Divides every gradient by `divisor` (after an all-reduce sum over data-parallel devices).
  absl::Status ScaleGradients(DeviceTree* grads, float divisor);
  int64_t steps() const;

 private:
  struct Impl;
  explicit CudaOptimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMPUTE_CUDA_MODEL_H_
