// The CPU kernels of the optimizers; the Optimizer class (public, part of the SDK) is declared in
// substrax/optimizer.h.
#ifndef SUBSTRAX_WORKER_COMPUTE_OPTIMIZER_H_
#define SUBSTRAX_WORKER_COMPUTE_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/optimizers.h"
#include "substrax/v1/job.pb.h"
#include "substrax/optimizer.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// A CPU kernel: updates the `n` values of one parameter `p` in place from its gradient `g` at
// step `step` (1 for the first update). slots[i] is the parameter's state tensor named
// config.info->slots[i] (zeros before the first update).
using CpuOptimizerKernel = void (*)(const OptimizerConfig& config, int64_t step, float* p,
                                    const float* g, float* const* slots, int64_t n);

// The CPU kernel of the optimizer called `name`; nullptr when the cpu backend has none.
CpuOptimizerKernel FindCpuOptimizerKernel(absl::string_view name);

// Gradients that live elsewhere than in tensors (the CPU backend's flat buffer): each
// parameter's name -> its values, as many as the parameter has.
using GradientViews = std::map<std::string, const float*>;
// optimizer.Update from `grads` without copying them into tensors first (an optimizer made by
// Optimizer::Create reads them in place; any other gets them copied). Errors: as Update, naming
// a parameter without a gradient.
absl::Status UpdateFromViews(Optimizer& optimizer, const GradientViews& grads, TensorTree* params);


}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMPUTE_OPTIMIZER_H_
