// Optimizers with optax's semantics and defaults, updating float32 parameters in place: the CPU
// backend of the optimizers in core/optimizers.h. Each optimizer there has a CPU kernel here,
// registered by name in one table in optimizer.cc; the ones today:
//
//   - sgd:      p -= lr * g                                        (optax.sgd(lr))
//   - momentum: t = g + m * t;  u = nesterov ? g + m * t : t;  p -= lr * u
//               (optax.sgd(lr, momentum=m, nesterov=n); m defaults to 0.9, t starts at 0)
//   - adam:     m = b1 * m + (1 - b1) * g;  v = b2 * v + (1 - b2) * g^2;
//               p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps),  t = 1, 2, ...
//               (optax.adam(lr, b1, b2, eps, eps_root=0); defaults 0.9, 0.999, 1e-8)
//
// Arithmetic is in float like optax on float32 parameters; adam's bias corrections 1 - b^t are
// computed in double.
//
// An optimizer of the core table without a CPU kernel is refused (UNIMPLEMENTED), never replaced
// by another.
//
// An Optimizer keeps state (per parameter name, created on first use) and a step count: not
// thread-safe; the device thread that owns the parameters owns their optimizer.
#ifndef SUBSTRAX_OPTIMIZER_H_
#define SUBSTRAX_OPTIMIZER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "substrax/tensor.h"

namespace substrax {

// Internal to substrax (the job spec's wire form and the resolved table entry): the overloads of
// Create that take them are not part of the SDK.
namespace v1 {
class OptimizerSpec;
}  // namespace v1
struct OptimizerConfig;

class Optimizer {
 public:
  // The optimizer named `type` ("sgd", "momentum", "adam") with `learning_rate` and the
  // hyper-parameters besides it by name ({"b1", 0.9}); those left out take optax's defaults.
  // Errors: INVALID_ARGUMENT naming the hyper-parameter (an unknown type lists the known ones;
  // a key the optimizer does not have; a value out of range).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const std::string& type, double learning_rate,
      const std::map<std::string, double>& hyperparameters = {});

  // The optimizer `spec` describes, resolved through core/optimizers.h (hyper-parameters the spec
  // leaves out take optax's defaults from the table).
  // Errors: INVALID_ARGUMENT naming the field (those of ResolveOptimizer); UNIMPLEMENTED when the
  // optimizer has no CPU kernel.
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const v1::OptimizerSpec& spec);

  // The optimizer of a resolved `config`, with the kernel FindCpuOptimizerKernel gives its name.
  // Errors: UNIMPLEMENTED "optimizer 'lion' is not implemented on the cpu backend".
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config);

  virtual ~Optimizer() = default;

  // One update of `params` in place from `grads`. Nothing changes when it fails.
  // Errors: INVALID_ARGUMENT naming the parameter when grads and params differ in names or
  // shapes, or when a parameter's shape differs from the one its optimizer state was made for.
  virtual absl::Status Update(const TensorTree& grads, TensorTree* params) = 0;

  // Successful updates so far.
  virtual int64_t steps() const = 0;

  // The state a checkpoint saves: "<param>/<slot>" -> a copy of that slot of each parameter of
  // `params` (zeros of the parameter's shape before its first update; nothing for an optimizer
  // without slots, such as sgd).
  virtual TensorTree ExportState(const TensorTree& params) const = 0;
  // Replaces the state with `state` (named as ExportState names it) and the update count with
  // `steps`. Errors: INVALID_ARGUMENT naming an entry that is missing, unknown or of another
  // shape than its parameter; nothing changes then.
  virtual absl::Status ImportState(const TensorTree& state, const TensorTree& params,
                                   int64_t steps) = 0;
};

}  // namespace substrax

#endif  // SUBSTRAX_OPTIMIZER_H_
