// The one translation of CUDA runtime and cuBLAS errors into absl::Status.
// CUDA builds only (includes CUDA headers).
//
//   cudaErrorMemoryAllocation, CUBLAS_STATUS_ALLOC_FAILED       -> RESOURCE_EXHAUSTED
//   cudaErrorNoDevice, cudaErrorInsufficientDriver,
//   cudaErrorInvalidDevice, CUBLAS_STATUS_NOT_INITIALIZED      -> FAILED_PRECONDITION
//   everything else (launch failures, illegal address, ...)     -> INTERNAL
//
// Messages: "<what> on <where>: <CUDA error name>: <CUDA error string>; check the GPU
// (nvidia-smi)". A sticky error (illegal address) leaves the context unusable: the caller must
// stop using the device, which INTERNAL (not retryable in place) says.
#ifndef SUBSTRAX_WORKER_GPU_CUDA_STATUS_H_
#define SUBSTRAX_WORKER_GPU_CUDA_STATUS_H_

#include "absl/strings/string_view.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace substrax {

absl::Status CudaStatus(cudaError_t error, absl::string_view what, absl::string_view where);
absl::Status CublasStatus(cublasStatus_t status, absl::string_view what, absl::string_view where);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_GPU_CUDA_STATUS_H_
