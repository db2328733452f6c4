// The CUDA DeviceBackend: worker/gpu's cuBLAS models and device optimizers, batches from
// CudaPrefetcher (pinned memory and a copy stream), gradients in one flat device buffer, and
// every step's work queued on the device's compute stream, which is also the execution context of
// the loop's NCCL collectives (they run on the communicator's stream, ordered by events, so the
// host never waits for them: max_steps_in_flight() is 8). The forward and backward pass and the
// optimizer update are replayed as CUDA graphs, the matrix products in spec.precision. Phase
// times come from CUDA events recorded on that stream (device time, not host time). Real only under --config=cuda; otherwise CreateCudaBackend returns
// UNIMPLEMENTED.
#ifndef SUBSTRAX_WORKER_RUNTIME_CUDA_BACKEND_H_
#define SUBSTRAX_WORKER_RUNTIME_CUDA_BACKEND_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/runtime/device_backend.h"

namespace substrax {

// On CUDA device setup.local_index. Errors: UNIMPLEMENTED without --config=cuda or for an
// optimizer the CUDA backend lacks; FAILED_PRECONDITION when the device cannot be used; those of
// CudaModel::Create (INVALID_ARGUMENT) and CUDA (INTERNAL, RESOURCE_EXHAUSTED).
absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCudaBackend(BackendSetup setup);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_CUDA_BACKEND_H_
