// CUDA kernels of the GPU backend behind plain C++ functions: device pointers in, work queued on
// `stream`, the launch's error out (cudaSuccess, or the cudaGetLastError after the launch).
// Nothing here synchronises; results are ready for later work on the same stream.
//
// Matrices are row-major [rows, cols], as worker/tensor. Sizes are element counts; every function
// accepts 0 (then it launches nothing). Kept free of heavy includes so nvcc needs only the CUDA
// headers (tools/cuda.bzl).
#ifndef SUBSTRAX_WORKER_COMPUTE_CUDA_KERNELS_H_
#define SUBSTRAX_WORKER_COMPUTE_CUDA_KERNELS_H_

#include <cstdint>

#include <cuda_runtime.h>

namespace substrax {
namespace gpu {

// Metric accumulators in device memory, summed over the calls since the last reset.
struct DeviceMetricSums {
  double loss_sum;                    // sum over examples of the per-example loss
  unsigned long long correct;         // classification: examples whose argmax is the label
  unsigned long long invalid_labels;  // classification: labels not a class id in [0, classes)
};

// z[r, c] += bias[c].
cudaError_t BiasAdd(float* z, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream);

// x = max(x, 0).
cudaError_t Relu(float* x, int64_t n, cudaStream_t stream);

// d[i] = activation[i] > 0 ? d[i] : 0 (ReLU's derivative; 0 at the kink, as JAX).
cudaError_t ReluBackwardMask(float* d, const float* activation, int64_t n, cudaStream_t stream);

// The fused epilogues: one pass each instead of two, with the same float operations in the
// same order as the separate kernels, so the results are equal bit for bit.
// Forward: z[r, c] = z[r, c] + bias[c], then max(., 0) when `relu` (BiasAdd then Relu).
cudaError_t BiasActivation(float* z, const float* bias, int64_t rows, int64_t cols, bool relu,
                           cudaStream_t stream);
// Backward through a ReLU into the layer below's bias gradient: d[r, c] = activation[r, c] > 0 ?
// d[r, c] : 0 in place, and bias_grad[c] = sum over r of the masked d[r, c]
// (ReluBackwardMask then ColumnSums).
cudaError_t ReluMaskColumnSums(float* d, const float* activation, int64_t rows, int64_t cols,
                               float* bias_grad, cudaStream_t stream);

// out[i] = bfloat16(x[i]) (round to nearest even): the bf16 inputs of a matrix product.
// `out` is device memory for n bfloat16 values (2 bytes each).
cudaError_t CastToBf16(const float* x, int64_t n, void* out, cudaStream_t stream);

// Softmax cross-entropy of `logits` [rows, cols] against `labels` [rows] (class ids as floats),
// through log-sum-exp on logits shifted by the row maximum. Adds the per-example losses (double)
// and the correct predictions (first maximum as argmax) into `sums`. With `d_logits` non-null,
// writes the gradient of (grad_scale * sum of losses): grad_scale * (softmax - onehot(label)).
// A label that is not a class id counts in sums->invalid_labels and contributes nothing.
cudaError_t SoftmaxCrossEntropy(const float* logits, const float* labels, int64_t rows,
                                int64_t cols, float grad_scale, float* d_logits,
                                DeviceMetricSums* sums, cudaStream_t stream);

// Mean squared error per example (mean over the cols outputs of (out - target)^2), summed into
// sums->loss_sum. With `d_out` non-null: grad_scale * 2 (out - target) / cols.
cudaError_t MeanSquaredError(const float* out, const float* targets, int64_t rows, int64_t cols,
                             float grad_scale, float* d_out, DeviceMetricSums* sums,
                             cudaStream_t stream);

// out[c] = sum over r of m[r, c] (a bias gradient).
cudaError_t ColumnSums(const float* m, int64_t rows, int64_t cols, float* out,
                       cudaStream_t stream);

// x *= alpha (a sum over devices into a mean).
cudaError_t Scale(float* x, int64_t n, float alpha, cudaStream_t stream);

// Optimizer updates with optax's semantics: the CUDA backend of the optimizers in
// core/optimizers.h, one kernel per optimizer, registered by the table's name in one table in
// kernels.cu. In float, elementwise, without fused multiply-adds so that they match the CPU
// kernels (worker/compute/optimizer.cc) bit for bit.

// What every optimizer kernel gets for one parameter.
struct OptimizerStepArgs {
  float* p = nullptr;              // the parameter's n values, updated in place
  const float* g = nullptr;        // its gradient
  float* const* slots = nullptr;   // host array of its state tensors (device pointers), in the
                                   // order of the core table row's slots; zeros at first
  int64_t n = 0;
  double learning_rate = 0;
  int64_t step = 0;                // 1 for the first update
  const double* hyper = nullptr;   // the values of the kernel row's `hyper` names, in that order
  // Device memory: [0] the learning rate, then the values the row's step_scalars computed for
  // this step (Adam's bias corrections). Read by the kernel, not passed by value, so that a
  // captured CUDA graph of the update stays valid from step to step and takes a changed
  // learning rate at its next replay.
  const float* step_scalars = nullptr;
};

inline constexpr int kMaxOptimizerHyper = 8;
inline constexpr int kMaxStepScalars = 4;

struct CudaOptimizerKernel {
  // The optimizer's name in core/optimizers.h ("adam").
  const char* name;
  // The hyper-parameters the kernel reads (names in the core table), nullptr after the last.
  const char* hyper[kMaxOptimizerHyper];
  cudaError_t (*update)(const OptimizerStepArgs& args, cudaStream_t stream);
  // The values that change from step to step, computed on the host from args.step and
  // args.hyper into out[0, kMaxStepScalars - 1) (they land after the learning rate in
  // step_scalars); returns how many. Null: none.
  int (*step_scalars)(const OptimizerStepArgs& args, float* out);
};

// The CUDA kernel of the optimizer called `name`; nullptr when the cuda backend has none.
const CudaOptimizerKernel* FindCudaOptimizerKernel(const char* name);

}  // namespace gpu
}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMPUTE_CUDA_KERNELS_H_
