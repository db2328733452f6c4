#include "worker/gpu/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace substrax {
namespace {

absl::StatusCode CudaCode(cudaError_t error) {
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::StatusCode::kResourceExhausted;
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

absl::StatusCode CublasCode(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::StatusCode::kResourceExhausted;
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::StatusCode::kFailedPrecondition;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, absl::string_view what, absl::string_view where) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::Status(CudaCode(error),
                      absl::StrCat(what, " on ", where, ": ", cudaGetErrorName(error), ": ",
                                   cudaGetErrorString(error), "; check the GPU (nvidia-smi)"));
}

absl::Status CublasStatus(cublasStatus_t status, absl::string_view what, absl::string_view where) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::Status(CublasCode(status),
                      absl::StrCat(what, " on ", where, ": ", cublasGetStatusName(status), ": ",
                                   cublasGetStatusString(status), "; check the GPU (nvidia-smi)"));
}

}  // namespace substrax
