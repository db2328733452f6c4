// A device's training state as checkpoints hold it: its parameters ("params/<name>") and its
// optimizer's slots ("optimizer/<param>/<slot>"), and back. Shared by the CPU backend and the
// SDK's checkpoints (substrax::Program::SaveCheckpoint), so both write the same arrays.
#ifndef SUBSTRAX_WORKER_RUNTIME_DEVICE_STATE_H_
#define SUBSTRAX_WORKER_RUNTIME_DEVICE_STATE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "worker/compute/optimizer.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// Copies of `params` and of `optimizer`'s state for them, named as above.
TensorTree DeviceState(const TensorTree& params, const Optimizer& optimizer);

// Replaces `params` with the state's parameters (the same names and shapes, which it checks) and
// `optimizer`'s state with its slots, its update count with `step`. Nothing changes when it
// fails. Errors: INVALID_ARGUMENT naming an array that is unknown, missing or of another shape.
absl::Status RestoreDeviceState(const TensorTree& state, int64_t step, TensorTree* params,
                                Optimizer& optimizer);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_DEVICE_STATE_H_
