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
#include "absl/types/span.h"
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

// Devices that keep one copy of the parameters between them (worker/runtime's shared
// parameters) update it in disjoint pieces, each from its own thread, at the same time.
//
// One piece: values [begin, begin + count) of parameter `name` (in its row-major order), and
// their gradients.
struct ParamRange {
  std::string name;
  int64_t begin = 0;
  int64_t count = 0;
  const float* grads = nullptr;
};
// Creates the optimizer's (zero) state of every parameter of `params` that has none yet, so that
// UpdateRanges never creates any. Call it before the threads start. Errors: UNIMPLEMENTED for
// an optimizer not made by Optimizer::Create; INVALID_ARGUMENT as Update for a state of another
// shape.
absl::Status PrepareRangeUpdates(Optimizer& optimizer, const TensorTree& params);
// The update of step `step` (1 for the first) of the values in `ranges`, from their gradients:
// each value changes as Update would change it at that step (the update is elementwise). The
// optimizer's step count is not advanced (RestoreState and ImportState set it). Calls on
// disjoint ranges may run at the same time. Errors: FAILED_PRECONDITION for a parameter whose
// state PrepareRangeUpdates did not create; INVALID_ARGUMENT for an unknown parameter or a range
// outside it; UNIMPLEMENTED as PrepareRangeUpdates.
absl::Status UpdateRanges(Optimizer& optimizer, absl::Span<const ParamRange> ranges,
                          int64_t step, TensorTree* params);


}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMPUTE_OPTIMIZER_H_
