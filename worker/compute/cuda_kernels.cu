#include "worker/compute/cuda_kernels.h"

#include <cmath>
#include <cstring>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace substrax {
namespace gpu {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  int64_t blocks = (n + kThreads - 1) / kThreads;
  // Grid-stride loops cover the rest; this bound keeps the grid within limits for any n.
  return static_cast<int>(blocks < 65535 ? blocks : 65535);
}

cudaError_t Launched() { return cudaGetLastError(); }

__global__ void BiasAddKernel(float* z, const float* bias, int64_t rows, int64_t cols) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    z[i] += bias[i % cols];
  }
}

__global__ void ReluKernel(float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    x[i] = fmaxf(x[i], 0.0f);
  }
}

__global__ void ReluBackwardKernel(float* d, const float* act, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    if (!(act[i] > 0.0f)) d[i] = 0.0f;
  }
}

__global__ void BiasActivationKernel(float* z, const float* bias, int64_t rows, int64_t cols,
                                     bool relu) {
  const int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float v = z[i] + bias[i % cols];
    z[i] = relu ? fmaxf(v, 0.0f) : v;
  }
}

__global__ void CastToBf16Kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}

// Sums each thread's values over the block, then adds the block's total into `sums` with one
// atomic per field: the reduction stays on the device and costs a few atomics per launch.
__device__ void BlockAccumulate(double loss, unsigned long long correct,
                                unsigned long long invalid, DeviceMetricSums* sums) {
  __shared__ double s_loss[kThreads];
  __shared__ unsigned long long s_correct[kThreads];
  __shared__ unsigned long long s_invalid[kThreads];
  const int t = threadIdx.x;
  s_loss[t] = loss;
  s_correct[t] = correct;
  s_invalid[t] = invalid;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) {
      s_loss[t] += s_loss[t + stride];
      s_correct[t] += s_correct[t + stride];
      s_invalid[t] += s_invalid[t + stride];
    }
    __syncthreads();
  }
  if (t == 0) {
    atomicAdd(&sums->loss_sum, s_loss[0]);
    if (s_correct[0] != 0) atomicAdd(&sums->correct, s_correct[0]);
    if (s_invalid[0] != 0) atomicAdd(&sums->invalid_labels, s_invalid[0]);
  }
}

// One thread per example (row): the class count is small (tens), so a row fits one thread and
// the loop over it stays in registers/L1.
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const float* labels, int64_t rows,
                                          int64_t cols, float grad_scale, float* d_logits,
                                          DeviceMetricSums* sums) {
  double loss = 0;
  unsigned long long correct = 0, invalid = 0;
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < rows) {
    const float* row = logits + r * cols;
    const float v = labels[r];
    const bool valid = v >= 0.0f && v < static_cast<float>(cols) && v == floorf(v);
    const int64_t label = valid ? static_cast<int64_t>(v) : -1;
    float row_max = row[0];
    int64_t predicted = 0;
    for (int64_t c = 1; c < cols; ++c) {
      if (row[c] > row_max) {
        row_max = row[c];
        predicted = c;
      }
    }
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) sum += expf(row[c] - row_max);
    if (valid) {
      loss = log(static_cast<double>(sum)) - static_cast<double>(row[label] - row_max);
      correct = predicted == label ? 1 : 0;
    } else {
      invalid = 1;
    }
    if (d_logits != nullptr) {
      float* d = d_logits + r * cols;
      const float inv = 1.0f / sum;
      for (int64_t c = 0; c < cols; ++c) {
        const float p = expf(row[c] - row_max) * inv;
        d[c] = valid ? grad_scale * (c == label ? p - 1.0f : p) : 0.0f;
      }
    }
  }
  BlockAccumulate(loss, correct, invalid, sums);
}

__global__ void MeanSquaredErrorKernel(const float* out, const float* targets, int64_t rows,
                                       int64_t cols, float grad_scale, float* d_out,
                                       DeviceMetricSums* sums) {
  double loss = 0;
  const int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (r < rows) {
    const float scale = grad_scale * (2.0f / static_cast<float>(cols));
    for (int64_t c = 0; c < cols; ++c) {
      const float diff = out[r * cols + c] - targets[r * cols + c];
      loss += static_cast<double>(diff) * static_cast<double>(diff);
      if (d_out != nullptr) d_out[r * cols + c] = diff * scale;
    }
    loss /= static_cast<double>(cols);
  }
  BlockAccumulate(loss, 0, 0, sums);
}

// Column sums (a bias gradient), optionally through the ReLU mask first. A block covers
// kSumColumns columns with kSumRowGroups threads each: thread (x, y) sums rows y, y +
// kSumRowGroups, ... of column x, so a warp reads kSumColumns consecutive floats of a row, then
// the kSumRowGroups partial sums of a column are added in y order. A fixed order: the result is
// the same on every run, and equal between the masked and the plain kernel on the same values.
constexpr int kSumColumns = 32;
constexpr int kSumRowGroups = 16;

// kMask: masked values are written back as 0 to `masked` (the same array as `m`).
template <bool kMask>
__global__ void ColumnSumsKernel(const float* m, float* masked, const float* act, int64_t rows,
                                 int64_t cols, float* out) {
  // A warp's threads share y and take consecutive x: row accesses, no bank conflicts.
  __shared__ float partial[kSumRowGroups][kSumColumns];
  const int64_t c = blockIdx.x * int64_t{kSumColumns} + threadIdx.x;
  float sum = 0.0f;
  if (c < cols) {
    for (int64_t r = threadIdx.y; r < rows; r += kSumRowGroups) {
      const int64_t i = r * cols + c;
      float v = m[i];
      if (kMask && !(act[i] > 0.0f)) {
        v = 0.0f;
        masked[i] = 0.0f;
      }
      sum += v;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = partial[0][threadIdx.x];
    for (int y = 1; y < kSumRowGroups; ++y) total += partial[y][threadIdx.x];
    out[c] = total;
  }
}

__global__ void ScaleKernel(float* x, int64_t n, float alpha) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    x[i] *= alpha;
  }
}

// __fmul_rn / __fadd_rn are never contracted into FMAs: the CPU optimizer's arithmetic, exactly.
// Each update reads the learning rate (and Adam its corrections) from `scalars` in device
// memory (OptimizerStepArgs::step_scalars), not from its arguments: a captured graph of the update
// then takes a changed value at its next replay.
__global__ void SgdKernel(float* p, const float* g, int64_t n, const float* scalars) {
  const float lr = scalars[0];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, g[i]));
  }
}

__global__ void MomentumKernel(float* p, const float* g, float* trace, int64_t n,
                               const float* scalars, float momentum, bool nesterov) {
  const float lr = scalars[0];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float t = __fadd_rn(g[i], __fmul_rn(momentum, trace[i]));
    trace[i] = t;
    const float u = nesterov ? __fadd_rn(g[i], __fmul_rn(momentum, t)) : t;
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, u));
  }
}

__global__ void AdamKernel(float* p, const float* g, float* mu, float* nu, int64_t n,
                           float b1, float one_minus_b1, float b2, float one_minus_b2,
                           const float* scalars, float eps) {
  const float lr = scalars[0], correction1 = scalars[1], correction2 = scalars[2];
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{blockDim.x} * gridDim.x) {
    const float gi = g[i];
    const float m = __fadd_rn(__fmul_rn(one_minus_b1, gi), __fmul_rn(b1, mu[i]));
    const float v = __fadd_rn(__fmul_rn(one_minus_b2, __fmul_rn(gi, gi)), __fmul_rn(b2, nu[i]));
    mu[i] = m;
    nu[i] = v;
    const float m_hat = __fdiv_rn(m, correction1);
    const float v_hat = __fdiv_rn(v, correction2);
    p[i] = __fsub_rn(p[i], __fmul_rn(lr, __fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), eps))));
  }
}

}  // namespace

cudaError_t BiasAdd(float* z, const float* bias, int64_t rows, int64_t cols,
                    cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  BiasAddKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(z, bias, rows, cols);
  return Launched();
}

cudaError_t Relu(float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ReluKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n);
  return Launched();
}

cudaError_t ReluBackwardMask(float* d, const float* activation, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(d, activation, n);
  return Launched();
}

cudaError_t BiasActivation(float* z, const float* bias, int64_t rows, int64_t cols, bool relu,
                           cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  BiasActivationKernel<<<Blocks(rows * cols), kThreads, 0, stream>>>(z, bias, rows, cols, relu);
  return Launched();
}

cudaError_t ReluMaskColumnSums(float* d, const float* activation, int64_t rows, int64_t cols,
                               float* bias_grad, cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const dim3 threads(kSumColumns, kSumRowGroups);
  const unsigned blocks = static_cast<unsigned>((cols + kSumColumns - 1) / kSumColumns);
  ColumnSumsKernel<true><<<blocks, threads, 0, stream>>>(d, d, activation, rows, cols, bias_grad);
  return Launched();
}

cudaError_t CastToBf16(const float* x, int64_t n, void* out, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  CastToBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(out));
  return Launched();
}

cudaError_t SoftmaxCrossEntropy(const float* logits, const float* labels, int64_t rows,
                                int64_t cols, float grad_scale, float* d_logits,
                                DeviceMetricSums* sums, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int blocks = static_cast<int>((rows + kThreads - 1) / kThreads);
  SoftmaxCrossEntropyKernel<<<blocks, kThreads, 0, stream>>>(logits, labels, rows, cols,
                                                             grad_scale, d_logits, sums);
  return Launched();
}

cudaError_t MeanSquaredError(const float* out, const float* targets, int64_t rows, int64_t cols,
                             float grad_scale, float* d_out, DeviceMetricSums* sums,
                             cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  const int blocks = static_cast<int>((rows + kThreads - 1) / kThreads);
  MeanSquaredErrorKernel<<<blocks, kThreads, 0, stream>>>(out, targets, rows, cols, grad_scale,
                                                          d_out, sums);
  return Launched();
}

cudaError_t ColumnSums(const float* m, int64_t rows, int64_t cols, float* out,
                       cudaStream_t stream) {
  if (cols == 0) return cudaSuccess;
  const dim3 threads(kSumColumns, kSumRowGroups);
  const unsigned blocks = static_cast<unsigned>((cols + kSumColumns - 1) / kSumColumns);
  ColumnSumsKernel<false><<<blocks, threads, 0, stream>>>(m, nullptr, nullptr, rows, cols, out);
  return Launched();
}

cudaError_t Scale(float* x, int64_t n, float alpha, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  ScaleKernel<<<Blocks(n), kThreads, 0, stream>>>(x, n, alpha);
  return Launched();
}

namespace {

//   sgd:      p -= lr * g
cudaError_t SgdUpdate(const OptimizerStepArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  SgdKernel<<<Blocks(a.n), kThreads, 0, stream>>>(a.p, a.g, a.n, a.step_scalars);
  return Launched();
}

//   momentum: trace = g + m * trace; u = nesterov ? g + m * trace : trace; p -= lr * u
//   hyper: momentum, nesterov
cudaError_t MomentumUpdate(const OptimizerStepArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  MomentumKernel<<<Blocks(a.n), kThreads, 0, stream>>>(
      a.p, a.g, a.slots[0], a.n, a.step_scalars, static_cast<float>(a.hyper[0]),
      a.hyper[1] != 0);
  return Launched();
}

//   adam:     mu = (1-b1) g + b1 mu; nu = (1-b2) g^2 + b2 nu;
//             p -= lr * (mu / correction1) / (sqrt(nu / correction2) + eps)
//   hyper: b1, b2, eps. The corrections 1 - b^t are computed on the host in double, then
//   rounded to float, as the CPU kernel does (AdamStepScalars), and read from device memory
//   after the learning rate (step_scalars[1], [2]).
int AdamStepScalars(const OptimizerStepArgs& a, float* out) {
  const double b1 = a.hyper[0], b2 = a.hyper[1];
  out[0] = static_cast<float>(1.0 - std::pow(b1, static_cast<double>(a.step)));
  out[1] = static_cast<float>(1.0 - std::pow(b2, static_cast<double>(a.step)));
  return 2;
}

cudaError_t AdamUpdate(const OptimizerStepArgs& a, cudaStream_t stream) {
  if (a.n == 0) return cudaSuccess;
  const double b1 = a.hyper[0], b2 = a.hyper[1];
  AdamKernel<<<Blocks(a.n), kThreads, 0, stream>>>(
      a.p, a.g, a.slots[0], a.slots[1], a.n, static_cast<float>(b1), static_cast<float>(1.0 - b1), static_cast<float>(b2),
      static_cast<float>(1.0 - b2), a.step_scalars, static_cast<float>(a.hyper[2]));
  return Launched();
}

// The CUDA kernel of each optimizer in core/optimizers.h, by the table's name. A row there
// without one here is refused by CudaOptimizer::Create.
const CudaOptimizerKernel kCudaOptimizerKernels[] = {
    {"sgd", {nullptr}, SgdUpdate, nullptr},
    {"momentum", {"momentum", "nesterov", nullptr}, MomentumUpdate, nullptr},
    {"adam", {"b1", "b2", "eps", nullptr}, AdamUpdate, AdamStepScalars},
};

}  // namespace

const CudaOptimizerKernel* FindCudaOptimizerKernel(const char* name) {
  for (const CudaOptimizerKernel& kernel : kCudaOptimizerKernels) {
    if (std::strcmp(kernel.name, name) == 0) return &kernel;
  }
  return nullptr;
}

}  // namespace gpu
}  // namespace substrax
