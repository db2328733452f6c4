// TrainOnCuda: Train's step loop on CUDA devices. One thread per local GPU, each with its own
// stream; CudaModel and CudaOptimizer on the device; batches through CudaPrefetcher (pinned
// buffers, a copy stream); NCCL communicators for the world and each mesh axis (split from the
// world): the model's tensor-parallel all-reduces run on the model axis, gradients are averaged
// over the axes each parameter is replicated on; metrics accumulated on the device and copied
// back once per report. Without --config=cuda every CUDA piece is a stub that returns
// UNIMPLEMENTED, and so does this.
#ifndef SUBSTRAX_WORKER_RUNTIME_CUDA_TRAINER_H_
#define SUBSTRAX_WORKER_RUNTIME_CUDA_TRAINER_H_

#include "absl/status/statusor.h"
#include "worker/runtime/trainer.h"

namespace substrax {

// Errors: as Train; UNIMPLEMENTED (built without CUDA); FAILED_PRECONDITION
// (no usable GPU); the CUDA, cuBLAS and NCCL errors of the device code.
absl::StatusOr<TrainResult> TrainOnCuda(const TrainerOptions& options, const TrainingData& data);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_CUDA_TRAINER_H_
