// The default build's CreateCudaBackend: the CUDA backend is built with --config=cuda only.
#include "worker/runtime/cuda_backend.h"

namespace substrax {

absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCudaBackend(BackendSetup) {
  return absl::UnimplementedError(
      "the CUDA backend was built without --config=cuda; rebuild with bazel build "
      "--config=cuda");
}

}  // namespace substrax
