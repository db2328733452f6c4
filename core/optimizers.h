// The optimizers substrax knows, as one table: their YAML names, hyper-parameters (with defaults
// and ranges), update rules and per-parameter state. The job-spec reader, the validator, the
// planner's memory figure and both compute backends read this table, so adding an optimizer is a
// row here plus one kernel per backend (docs/architecture.md, "Adding an optimizer").
//
// Semantics are optax's: each row's formula names the optax function it matches.
//
// Pure data and pure functions; thread-safe.
#ifndef SUBSTRAX_CORE_OPTIMIZERS_H_
#define SUBSTRAX_CORE_OPTIMIZERS_H_

#include <limits>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

struct HyperParameter {
  std::string name;  // YAML key under spec.optimizer ("b1")
  enum class Kind { kReal, kBool } kind = Kind::kReal;
  double default_value = 0;
  double min = 0;  // kReal range
  bool min_inclusive = true;
  double max = std::numeric_limits<double>::infinity();
  bool max_inclusive = true;
  std::string doc;  // one line, for docs and messages
};

struct OptimizerInfo {
  std::string name;                   // "adam"
  std::string formula;                // the update rule, one line (optax semantics)
  std::vector<HyperParameter> hyper;  // besides learning_rate
  std::vector<std::string> slots;     // state tensors per parameter, e.g. {"mu", "nu"}
  std::string optax;                  // the optax call it matches ("optax.sgd(lr)")

  // The hyper-parameter called `name`; nullptr when this optimizer has none by that name.
  const HyperParameter* FindHyper(absl::string_view name) const;
};

// Every optimizer, in a stable order (sgd, momentum, adam).
const std::vector<OptimizerInfo>& OptimizerTable();

// nullptr when unknown.
const OptimizerInfo* FindOptimizer(absl::string_view name);

// The names of every optimizer, comma-separated in table order ("sgd, momentum, adam").
std::string OptimizerNames();

// Why `key` may not appear under spec.optimizer for optimizer `info` (a key that is neither a
// field of OptimizerSpec nor one of info's hyper-parameters), without the field path:
//   "is not used by optimizer adam; remove it (momentum is a hyper-parameter of momentum; adam
//    takes learning_rate, b1, b2, eps)"
//   "unknown field (did you mean 'eps'?); optimizer adam takes type, learning_rate, b1, b2, eps"
std::string UnknownHyperParameterMessage(const OptimizerInfo& info, absl::string_view key);

// The table as the Markdown table docs/job-spec.md shows (one row per optimizer: type, update
// rule, the optax call, hyper-parameters with default and range, state per parameter), ending in
// a newline.
std::string OptimizerTableMarkdown();

// A spec's optimizer with every hyper-parameter resolved (defaults applied), in table order.
struct OptimizerConfig {
  const OptimizerInfo* info = nullptr;
  double learning_rate = 0;
  std::vector<double> hyper;  // hyper[i] belongs to info->hyper[i]; bools as 0 or 1

  // The value of hyper-parameter `name`; dies for a name the optimizer does not have (a
  // programming error: kernels ask only for their own optimizer's names).
  double Get(absl::string_view name) const;
};

// The range a kReal hyper-parameter accepts, as messages write it: "[0, 1)", "(0, inf)".
std::string RangeString(const HyperParameter& hyper);

// Checks one hyper-parameter value. Errors: INVALID_ARGUMENT with the message only, without the
// field path ("must be in [0, 1), got 1"; "must be 0 or 1 (false or true), got 2").
absl::Status CheckHyperParameter(const HyperParameter& hyper, double value);

// Calls `report(field, message)` for every problem of `spec` against the table, in field order:
// type unknown or missing, learning rate not a positive finite number, a hyper-parameter key the
// type does not have, a value out of its range. `field` is relative to spec.optimizer ("b1").
void ForEachOptimizerError(
    const v1::OptimizerSpec& spec,
    absl::FunctionRef<void(absl::string_view field, absl::string_view message)> report);

// Resolves `spec` against the table: the type must be known, the learning rate a positive finite
// number, every key of the hyper-parameter map one of the type's, each value in its range;
// missing ones take the table's defaults.
// Errors: INVALID_ARGUMENT naming the field ("spec.optimizer.b1: must be in [0, 1), got 1").
absl::StatusOr<OptimizerConfig> ResolveOptimizer(const v1::OptimizerSpec& spec);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_OPTIMIZERS_H_
