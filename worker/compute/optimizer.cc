#include "worker/compute/optimizer.h"

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

// What every optimizer here shares: validation before anything changes, per-parameter state
// slots (zeros of the parameter's shape, created on first use), and the step count. Subclasses
// say how one parameter is updated.
class ElementwiseOptimizer : public Optimizer {
 public:
  ElementwiseOptimizer(float learning_rate, int num_slots)
      : learning_rate_(learning_rate), num_slots_(num_slots) {}

  absl::Status Update(const TensorTree& grads, TensorTree* params) final {
    SUBSTRAX_RETURN_IF_ERROR(CheckGradsMatchParams(grads, *params));
    for (const auto& [name, p] : *params) {
      auto it = state_.find(name);
      if (it != state_.end() && it->second.front().shape() != p.shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter '", name, "' has shape ", p.ShapeString(),
            ", but its optimizer state was made for ", it->second.front().ShapeString()));
      }
    }
    const int64_t step = steps_ + 1;
    for (auto& [name, p] : *params) {
      std::vector<Tensor>* slots = nullptr;
      if (num_slots_ > 0) {
        slots = &state_[name];
        if (slots->empty()) slots->assign(num_slots_, Tensor(p.shape()));
      }
      Apply(step, grads.at(name), slots, &p);
    }
    steps_ = step;
    return absl::OkStatus();
  }

  int64_t steps() const final { return steps_; }

 protected:
  // Updates `p` from `g` at step `step` (1 for the first update); `slots` holds this
  // parameter's num_slots state tensors (nullptr when there are none). Shapes are checked.
  virtual void Apply(int64_t step, const Tensor& g, std::vector<Tensor>* slots, Tensor* p) = 0;

  const float learning_rate_;

 private:
  const int num_slots_;
  std::map<std::string, std::vector<Tensor>> state_;
  int64_t steps_ = 0;
};

class Sgd final : public ElementwiseOptimizer {
 public:
  explicit Sgd(float learning_rate) : ElementwiseOptimizer(learning_rate, 0) {}

 private:
  void Apply(int64_t, const Tensor& g, std::vector<Tensor>*, Tensor* p) override {
    const float* gd = g.data();
    float* pd = p->data();
    for (int64_t i = 0; i < p->size(); ++i) pd[i] -= learning_rate_ * gd[i];
  }
};

// optax.sgd with momentum: optax.trace(decay, nesterov) then the learning rate.
class Momentum final : public ElementwiseOptimizer {
 public:
  Momentum(float learning_rate, float momentum, bool nesterov)
      : ElementwiseOptimizer(learning_rate, 1), momentum_(momentum), nesterov_(nesterov) {}

 private:
  void Apply(int64_t, const Tensor& g, std::vector<Tensor>* slots, Tensor* p) override {
    const float* gd = g.data();
    float* trace = (*slots)[0].data();
    float* pd = p->data();
    for (int64_t i = 0; i < p->size(); ++i) {
      trace[i] = gd[i] + momentum_ * trace[i];
      const float u = nesterov_ ? gd[i] + momentum_ * trace[i] : trace[i];
      pd[i] -= learning_rate_ * u;
    }
  }

  const float momentum_;
  const bool nesterov_;
};

// optax.adam with eps_root = 0: optax.scale_by_adam then the learning rate.
class Adam final : public ElementwiseOptimizer {
 public:
  Adam(float learning_rate, double b1, double b2, float eps)
      : ElementwiseOptimizer(learning_rate, 2), b1_(b1), b2_(b2), eps_(eps) {}

 private:
  void Apply(int64_t step, const Tensor& g, std::vector<Tensor>* slots, Tensor* p) override {
    // The bias corrections in double: in float, 1 - 0.999^t keeps only about four significant
    // digits for small t.
    const float correction1 = static_cast<float>(1.0 - std::pow(b1_, static_cast<double>(step)));
    const float correction2 = static_cast<float>(1.0 - std::pow(b2_, static_cast<double>(step)));
    // optax computes 1 - b in Python (double) and multiplies float32 moments by it.
    const float b1 = static_cast<float>(b1_), one_minus_b1 = static_cast<float>(1.0 - b1_);
    const float b2 = static_cast<float>(b2_), one_minus_b2 = static_cast<float>(1.0 - b2_);
    const float* gd = g.data();
    float* mu = (*slots)[0].data();
    float* nu = (*slots)[1].data();
    float* pd = p->data();
    for (int64_t i = 0; i < p->size(); ++i) {
      mu[i] = one_minus_b1 * gd[i] + b1 * mu[i];
      nu[i] = one_minus_b2 * (gd[i] * gd[i]) + b2 * nu[i];
      const float mu_hat = mu[i] / correction1;
      const float nu_hat = nu[i] / correction2;
      pd[i] -= learning_rate_ * (mu_hat / (std::sqrt(nu_hat) + eps_));
    }
  }

  const double b1_;
  const double b2_;
  const float eps_;
};

absl::Status CheckUnitInterval(const char* field, double value) {
  if (value >= 0 && value < 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("spec.optimizer.", field, ": must be in [0, 1), got ", value));
}

absl::Status CheckPositive(const char* field, double value) {
  if (value > 0 && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("spec.optimizer.", field, ": must be a positive finite number, got ", value));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const v1::OptimizerSpec& spec) {
  if (spec.type() != v1::OPTIMIZER_TYPE_SGD && spec.type() != v1::OPTIMIZER_TYPE_MOMENTUM &&
      spec.type() != v1::OPTIMIZER_TYPE_ADAM) {
    return absl::InvalidArgumentError(absl::StrCat("spec.optimizer.type: unknown optimizer ",
                                                   v1::OptimizerType_Name(spec.type())));
  }
  SUBSTRAX_RETURN_IF_ERROR(CheckPositive("learning_rate", spec.learning_rate()));
  const float lr = static_cast<float>(spec.learning_rate());
  if (spec.type() == v1::OPTIMIZER_TYPE_SGD) return std::make_unique<Sgd>(lr);
  if (spec.type() == v1::OPTIMIZER_TYPE_MOMENTUM) {
    const double momentum = spec.has_momentum() ? spec.momentum() : 0.9;
    SUBSTRAX_RETURN_IF_ERROR(CheckUnitInterval("momentum", momentum));
    return std::make_unique<Momentum>(lr, static_cast<float>(momentum), spec.nesterov());
  }
  const double b1 = spec.has_b1() ? spec.b1() : 0.9;
  const double b2 = spec.has_b2() ? spec.b2() : 0.999;
  const double eps = spec.has_eps() ? spec.eps() : 1e-8;
  SUBSTRAX_RETURN_IF_ERROR(CheckUnitInterval("b1", b1));
  SUBSTRAX_RETURN_IF_ERROR(CheckUnitInterval("b2", b2));
  SUBSTRAX_RETURN_IF_ERROR(CheckPositive("eps", eps));
  return std::make_unique<Adam>(lr, b1, b2, static_cast<float>(eps));
}

}  // namespace substrax
