// Test support for the backends' optimizer dispatch: an optimizer shaped like a row of the core
// table (core/optimizers.h) that no backend implements, to check that each backend refuses it
// rather than running another.
#ifndef SUBSTRAX_CORE_OPTIMIZERS_TESTING_H_
#define SUBSTRAX_CORE_OPTIMIZERS_TESTING_H_

#include "core/optimizers.h"

namespace substrax {

// "lion" (optax.lion: one slot, "mu"), resolved with learning rate 0.1. It is not in
// OptimizerTable(); the config points at a row that lives for the whole program.
inline OptimizerConfig UnimplementedOptimizerConfig() {
  static const OptimizerInfo* const lion = [] {
    auto* info = new OptimizerInfo;
    info->name = "lion";
    info->formula = "optax.lion (not implemented anywhere)";
    info->slots = {"mu"};
    return info;
  }();
  OptimizerConfig config;
  config.info = lion;
  config.learning_rate = 0.1;
  return config;
}

}  // namespace substrax

#endif  // SUBSTRAX_CORE_OPTIMIZERS_TESTING_H_
