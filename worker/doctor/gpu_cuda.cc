// The GPU check in a CUDA build (bazel build --config=cuda).
#include <cuda_runtime.h>
#include <nccl.h>

#include "absl/strings/str_cat.h"
#include "worker/doctor/gpu.h"

namespace substrax::doctor {

std::optional<Finding> CheckGpu() {
  GpuFacts facts;
  cudaDriverGetVersion(&facts.driver_cuda_version);
  cudaRuntimeGetVersion(&facts.runtime_cuda_version);
  ncclGetVersion(&facts.nccl_version);
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    // No driver and no device is a CPU host; anything else is a broken GPU host.
    if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver) {
      if (facts.driver_cuda_version == 0) return std::nullopt;
    }
    facts.error = absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
    return JudgeGpu(facts);
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) facts.names.push_back(prop.name);
  }
  if (facts.names.empty()) return std::nullopt;
  return JudgeGpu(facts);
}

}  // namespace substrax::doctor
