#include "worker/compute/optimizer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace substrax {
namespace {

// Grads must name exactly the parameters, with their shapes.
absl::Status CheckGradsMatchParams(const TensorTree& grads, const TensorTree& params) {
  for (const auto& [name, p] : params) {
    auto it = grads.find(name);
    if (it == grads.end()) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has no gradient"));
    }
    if (it->second.shape() != p.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient of parameter '", name,
                                                     "' has shape ", it->second.ShapeString(),
                                                     ", the parameter ", p.ShapeString()));
    }
  }
  for (const auto& [name, g] : grads) {
    if (params.find(name) == params.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for '", name, "', which is not a parameter"));
    }
  }
  return absl::OkStatus();
}

// What every optimizer shares: validation before anything changes, per-parameter state slots
// (zeros of the parameter's shape, created on first use, as many as the table's row names), and
// the step count. The kernel says how one parameter is updated.
class ElementwiseOptimizer final : public Optimizer {
 public:
  ElementwiseOptimizer(OptimizerConfig config, CpuOptimizerKernel kernel)
      : config_(std::move(config)), kernel_(kernel) {}

  absl::Status Update(const TensorTree& grads, TensorTree* params) override {
    SUBSTRAX_RETURN_IF_ERROR(CheckGradsMatchParams(grads, *params));
    GradientViews views;
    for (const auto& [name, g] : grads) views[name] = g.data();
    return UpdateFrom(views, params);
  }

  // The update once the gradients are known to match (one view per parameter, of its size).
  absl::Status UpdateFrom(const GradientViews& grads, TensorTree* params) {
    SUBSTRAX_RETURN_IF_ERROR(EnsureState(*params));
    const int64_t step = steps_ + 1;
    std::vector<float*> slot_data;
    for (auto& [name, p] : *params) {
      RunKernel(step, p, state_.at(name), 0, p.size(), grads.at(name), slot_data);
    }
    steps_ = step;
    return absl::OkStatus();
  }

  // Every parameter's state: checked against its shape first (nothing changes when one differs),
  // then zeros of its shape where there is none.
  absl::Status EnsureState(const TensorTree& params) {
    for (const auto& [name, p] : params) {
      auto it = state_.find(name);
      if (it != state_.end() && !it->second.empty() && it->second.front().shape() != p.shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter '", name, "' has shape ", p.ShapeString(),
            ", but its optimizer state was made for ", it->second.front().ShapeString()));
      }
    }
    const size_t num_slots = config_.info->slots.size();
    for (const auto& [name, p] : params) {
      std::vector<Tensor>& slots = state_[name];
      if (slots.size() != num_slots) slots.assign(num_slots, Tensor(p.shape()));
    }
    return absl::OkStatus();
  }

  // Reads state_ without changing its structure: safe on several threads at once.
  absl::Status UpdateRanges(absl::Span<const ParamRange> ranges, int64_t step,
                            TensorTree* params) {
    std::vector<float*> slot_data;
    for (const ParamRange& r : ranges) {
      auto p = params->find(r.name);
      if (p == params->end()) {
        return absl::InvalidArgumentError(absl::StrCat("'", r.name, "' is not a parameter"));
      }
      if (r.begin < 0 || r.count < 0 || r.begin + r.count > p->second.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("values [", r.begin, ", ", r.begin + r.count, ") are outside parameter '",
                         r.name, "' of ", p->second.size()));
      }
      auto state = state_.find(r.name);
      if (state == state_.end() || state->second.size() != config_.info->slots.size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "parameter '", r.name, "' has no optimizer state: call PrepareRangeUpdates first"));
      }
      RunKernel(step, p->second, state->second, r.begin, r.count, r.grads, slot_data);
    }
    return absl::OkStatus();
  }

  int64_t steps() const override { return steps_; }

  TensorTree ExportState(const TensorTree& params) const override {
    TensorTree out;
    const std::vector<std::string>& slots = config_.info->slots;
    for (const auto& [name, p] : params) {
      auto it = state_.find(name);
      for (size_t s = 0; s < slots.size(); ++s) {
        const bool made = it != state_.end() && it->second.size() == slots.size();
        out.emplace(SlotKey(name, slots[s]), made ? it->second[s] : Tensor(p.shape()));
      }
    }
    return out;
  }

  absl::Status ImportState(const TensorTree& state, const TensorTree& params,
                           int64_t steps) override {
    const std::vector<std::string>& slots = config_.info->slots;
    std::map<std::string, std::vector<Tensor>> imported;
    for (const auto& [name, p] : params) {
      std::vector<Tensor>& tensors = imported[name];
      for (const std::string& slot : slots) {
        const std::string key = SlotKey(name, slot);
        auto it = state.find(key);
        if (it == state.end()) {
          return absl::InvalidArgumentError(
              absl::StrCat("optimizer state '", key, "' is missing"));
        }
        if (it->second.shape() != p.shape()) {
          return absl::InvalidArgumentError(absl::StrCat(
              "optimizer state '", key, "' has shape ", it->second.ShapeString(),
              ", its parameter ", p.ShapeString()));
        }
        tensors.push_back(it->second);
      }
    }
    for (const auto& [key, tensor] : state) {
      const size_t slash = key.rfind('/');
      const bool known =
          slash != std::string::npos && imported.count(key.substr(0, slash)) > 0 &&
          std::find(slots.begin(), slots.end(), key.substr(slash + 1)) != slots.end();
      if (!known) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer state '", key, "' belongs to no parameter of ", config_.info->name));
      }
    }
    state_ = std::move(imported);
    steps_ = steps;
    return absl::OkStatus();
  }

 private:
  // The kernel at `step` on values [begin, begin + count) of `p`, whose state is `slots`.
  // `slot_data` is the caller's scratch for the slots' pointers.
  void RunKernel(int64_t step, Tensor& p, std::vector<Tensor>& slots, int64_t begin,
                 int64_t count, const float* g, std::vector<float*>& slot_data) const {
    slot_data.resize(slots.size());
    for (size_t s = 0; s < slots.size(); ++s) slot_data[s] = slots[s].data() + begin;
    kernel_(config_, step, p.data() + begin, g, slot_data.data(), count);
  }

  static std::string SlotKey(const std::string& param, const std::string& slot) {
    return absl::StrCat(param, "/", slot);
  }

  const OptimizerConfig config_;
  const CpuOptimizerKernel kernel_;
  std::map<std::string, std::vector<Tensor>> state_;
  int64_t steps_ = 0;
};

// The kernels. Arithmetic in float as optax on float32 parameters; constants rounded to float
// once per call, as optax multiplies float32 arrays by Python (double) scalars.

void Sgd(const OptimizerConfig& config, int64_t, float* p, const float* g, float* const*,
         int64_t n) {
  const float lr = static_cast<float>(config.learning_rate);
  for (int64_t i = 0; i < n; ++i) p[i] -= lr * g[i];
}

// optax.sgd with momentum: optax.trace(decay, nesterov) then the learning rate.
void Momentum(const OptimizerConfig& config, int64_t, float* p, const float* g,
              float* const* slots, int64_t n) {
  const float lr = static_cast<float>(config.learning_rate);
  const float momentum = static_cast<float>(config.Get("momentum"));
  const bool nesterov = config.Get("nesterov") != 0;
  float* trace = slots[0];
  for (int64_t i = 0; i < n; ++i) {
    trace[i] = g[i] + momentum * trace[i];
    const float u = nesterov ? g[i] + momentum * trace[i] : trace[i];
    p[i] -= lr * u;
  }
}

// optax.adam with eps_root = 0: optax.scale_by_adam then the learning rate.
void Adam(const OptimizerConfig& config, int64_t step, float* p, const float* g,
          float* const* slots, int64_t n) {
  const float lr = static_cast<float>(config.learning_rate);
  const double b1_d = config.Get("b1"), b2_d = config.Get("b2");
  const float eps = static_cast<float>(config.Get("eps"));
  // The bias corrections in double: in float, 1 - 0.999^t keeps only about four significant
  // digits for small t. optax divides by them; this multiplies by their reciprocals, rounded
  // once per call: within a rounding of the quotient, and two divisions fewer per value (the
  // update is bound by its divisions; docs/performance.md).
  const float inv_correction1 =
      static_cast<float>(1.0 / (1.0 - std::pow(b1_d, static_cast<double>(step))));
  const float inv_correction2 =
      static_cast<float>(1.0 / (1.0 - std::pow(b2_d, static_cast<double>(step))));
  // optax computes 1 - b in Python (double) and multiplies float32 moments by it.
  const float b1 = static_cast<float>(b1_d), one_minus_b1 = static_cast<float>(1.0 - b1_d);
  const float b2 = static_cast<float>(b2_d), one_minus_b2 = static_cast<float>(1.0 - b2_d);
  float* mu = slots[0];
  float* nu = slots[1];
  for (int64_t i = 0; i < n; ++i) {
    mu[i] = one_minus_b1 * g[i] + b1 * mu[i];
    nu[i] = one_minus_b2 * (g[i] * g[i]) + b2 * nu[i];
    const float mu_hat = mu[i] * inv_correction1;
    const float nu_hat = nu[i] * inv_correction2;
    p[i] -= lr * (mu_hat / (std::sqrt(nu_hat) + eps));
  }
}

// The CPU kernel of each optimizer in core/optimizers.h, by the table's name. A row there
// without one here is refused by Optimizer::Create.
struct KernelRow {
  const char* name;
  CpuOptimizerKernel kernel;
};
constexpr KernelRow kCpuKernels[] = {
    {"sgd", Sgd},
    {"momentum", Momentum},
    {"adam", Adam},
};

}  // namespace

absl::Status UpdateFromViews(Optimizer& optimizer, const GradientViews& grads,
                             TensorTree* params) {
  for (const auto& [name, p] : *params) {
    if (grads.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' has no gradient"));
    }
  }
  for (const auto& [name, g] : grads) {
    if (params->count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for '", name, "', which is not a parameter"));
    }
  }
  if (auto* elementwise = dynamic_cast<ElementwiseOptimizer*>(&optimizer)) {
    return elementwise->UpdateFrom(grads, params);
  }
  TensorTree copies;
  for (const auto& [name, p] : *params) {
    Tensor& g = copies[name] = Tensor(p.shape());
    std::copy_n(grads.at(name), g.size(), g.data());
  }
  return optimizer.Update(copies, params);
}

namespace {

absl::StatusOr<ElementwiseOptimizer*> RangeUpdater(Optimizer& optimizer) {
  auto* elementwise = dynamic_cast<ElementwiseOptimizer*>(&optimizer);
  if (elementwise == nullptr) {
    return absl::UnimplementedError(
        "updates of parameter ranges need an optimizer made by Optimizer::Create");
  }
  return elementwise;
}

}  // namespace

absl::Status PrepareRangeUpdates(Optimizer& optimizer, const TensorTree& params) {
  SUBSTRAX_ASSIGN_OR_RETURN(ElementwiseOptimizer * elementwise, RangeUpdater(optimizer));
  return elementwise->EnsureState(params);
}

absl::Status UpdateRanges(Optimizer& optimizer, absl::Span<const ParamRange> ranges,
                          int64_t step, TensorTree* params) {
  SUBSTRAX_ASSIGN_OR_RETURN(ElementwiseOptimizer * elementwise, RangeUpdater(optimizer));
  return elementwise->UpdateRanges(ranges, step, params);
}

CpuOptimizerKernel FindCpuOptimizerKernel(absl::string_view name) {
  for (const KernelRow& row : kCpuKernels) {
    if (name == row.name) return row.kernel;
  }
  return nullptr;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config) {
  if (config.info == nullptr) {
    return absl::InvalidArgumentError("spec.optimizer.type: no optimizer was resolved");
  }
  CpuOptimizerKernel kernel = FindCpuOptimizerKernel(config.info->name);
  if (kernel == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "optimizer '", config.info->name, "' is not implemented on the cpu backend"));
  }
  return std::make_unique<ElementwiseOptimizer>(config, kernel);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const v1::OptimizerSpec& spec) {
  SUBSTRAX_ASSIGN_OR_RETURN(OptimizerConfig config, ResolveOptimizer(spec));
  return Create(config);
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const std::string& type, double learning_rate,
    const std::map<std::string, double>& hyperparameters) {
  v1::OptimizerSpec spec;
  spec.set_type(type);
  spec.set_learning_rate(learning_rate);
  spec.mutable_hyperparameters()->insert(hyperparameters.begin(), hyperparameters.end());
  return Create(spec);
}

}  // namespace substrax
