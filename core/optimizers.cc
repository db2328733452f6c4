#include "core/optimizers.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/suggest.h"

namespace substrax {
namespace {

// A decay rate: optax accepts any float, but outside [0, 1) the moving averages diverge or never
// forget, which is never what a user meant.
HyperParameter Decay(std::string name, double default_value, std::string doc) {
  HyperParameter h;
  h.name = std::move(name);
  h.default_value = default_value;
  h.min = 0;
  h.max = 1;
  h.max_inclusive = false;
  h.doc = std::move(doc);
  return h;
}

std::vector<OptimizerInfo>* BuildTable() {
  HyperParameter nesterov;
  nesterov.name = "nesterov";
  nesterov.kind = HyperParameter::Kind::kBool;
  nesterov.doc = "use Nesterov's variant";
  HyperParameter eps;
  eps.name = "eps";
  eps.default_value = 1e-8;
  eps.min_inclusive = false;
  eps.doc = "added to the denominator";
  return new std::vector<OptimizerInfo>{
      {"sgd", "p -= lr * g", {}, {}, "optax.sgd(lr)"},
      {"momentum", "t = g + momentum * t; u = nesterov ? g + momentum * t : t; p -= lr * u",
       {Decay("momentum", 0.9, "decay of the velocity"), nesterov},
       {"trace"},
       "optax.sgd(lr, momentum, nesterov)"},
      {"adam",
       "mu = b1 * mu + (1 - b1) * g; nu = b2 * nu + (1 - b2) * g^2; "
       "p -= lr * (mu / (1 - b1^t)) / (sqrt(nu / (1 - b2^t)) + eps), t = 1, 2, ...",
       {Decay("b1", 0.9, "decay of the first moment estimate"),
        Decay("b2", 0.999, "decay of the second moment estimate"), eps},
       {"mu", "nu"},
       "optax.adam(lr, b1, b2, eps, eps_root=0)"},
  };
}

}  // namespace

const HyperParameter* OptimizerInfo::FindHyper(absl::string_view hyper_name) const {
  for (const HyperParameter& h : hyper) {
    if (h.name == hyper_name) return &h;
  }
  return nullptr;
}

const std::vector<OptimizerInfo>& OptimizerTable() {
  static const std::vector<OptimizerInfo>* table = BuildTable();
  return *table;
}

const OptimizerInfo* FindOptimizer(absl::string_view name) {
  for (const OptimizerInfo& info : OptimizerTable()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string OptimizerNames() {
  return absl::StrJoin(OptimizerTable(), ", ",
                       [](std::string* out, const OptimizerInfo& info) { out->append(info.name); });
}

std::string UnknownHyperParameterMessage(const OptimizerInfo& info, absl::string_view key) {
  std::vector<std::string> takes = {"type", "learning_rate"};
  for (const HyperParameter& h : info.hyper) takes.push_back(h.name);
  std::vector<std::string> owners;
  for (const OptimizerInfo& other : OptimizerTable()) {
    if (other.FindHyper(key) != nullptr) owners.push_back(other.name);
  }
  if (!owners.empty()) {
    return absl::StrCat("is not used by optimizer ", info.name, "; remove it (", key,
                        " is a hyper-parameter of ", absl::StrJoin(owners, " and "), "; ",
                        info.name, " takes ", absl::StrJoin(takes, ", "), ")");
  }
  std::vector<std::string> candidates = takes;
  for (const OptimizerInfo& other : OptimizerTable()) {
    for (const HyperParameter& h : other.hyper) candidates.push_back(h.name);
  }
  return absl::StrCat("unknown field", DidYouMean(key, candidates), "; optimizer ", info.name,
                      " takes ", absl::StrJoin(takes, ", "));
}

std::string OptimizerTableMarkdown() {
  std::string out =
      "| `type` | update rule | optax | hyper-parameters: default, range | state per parameter |\n"
      "| --- | --- | --- | --- | --- |\n";
  auto code = [](absl::string_view s) { return absl::StrCat("`", s, "`"); };
  for (const OptimizerInfo& info : OptimizerTable()) {
    std::vector<std::string> hyper;
    for (const HyperParameter& h : info.hyper) {
      hyper.push_back(
          h.kind == HyperParameter::Kind::kBool
              ? absl::StrCat(code(h.name), ": ", code(h.default_value != 0 ? "true" : "false"),
                             ", `true` or `false`; ", h.doc)
              : absl::StrCat(code(h.name), ": ", h.default_value, ", ", RangeString(h), "; ",
                             h.doc));
    }
    std::vector<std::string> slots;
    for (const std::string& slot : info.slots) slots.push_back(code(slot));
    absl::StrAppend(&out, "| ", code(info.name), " | ", code(info.formula), " | ",
                    code(info.optax), " | ", hyper.empty() ? "none" : absl::StrJoin(hyper, "<br>"),
                    " | ", slots.empty() ? "none" : absl::StrJoin(slots, ", "), " |\n");
  }
  return out;
}

double OptimizerConfig::Get(absl::string_view name) const {
  for (size_t i = 0; info != nullptr && i < info->hyper.size() && i < hyper.size(); ++i) {
    if (info->hyper[i].name == name) return hyper[i];
  }
  // A kernel asked for a hyper-parameter its optimizer's table row does not have: the kernel and
  // the row disagree, which no input can cause.
  std::cerr << "OptimizerConfig::Get: optimizer '" << (info ? info->name : "<none>")
            << "' has no hyper-parameter '" << name << "'" << std::endl;
  std::abort();
}

std::string RangeString(const HyperParameter& h) {
  return absl::StrCat(h.min_inclusive ? "[" : "(", h.min, ", ",
                      std::isinf(h.max) ? "inf" : absl::StrCat(h.max),
                      h.max_inclusive && !std::isinf(h.max) ? "]" : ")");
}

absl::Status CheckHyperParameter(const HyperParameter& h, double value) {
  if (h.kind == HyperParameter::Kind::kBool) {
    if (value == 0 || value == 1) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("must be 0 or 1 (false or true), got ", value));
  }
  const bool above = h.min_inclusive ? value >= h.min : value > h.min;
  const bool below = h.max_inclusive ? value <= h.max : value < h.max;
  if (above && below && std::isfinite(value)) return absl::OkStatus();
  if (h.min == 0 && !h.min_inclusive && std::isinf(h.max)) {
    return absl::InvalidArgumentError(
        absl::StrCat("must be a positive finite number, got ", value));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be in ", RangeString(h), ", got ", value));
}

void ForEachOptimizerError(
    const v1::OptimizerSpec& spec,
    absl::FunctionRef<void(absl::string_view field, absl::string_view message)> report) {
  const OptimizerInfo* info = FindOptimizer(spec.type());
  if (info == nullptr) {
    report("type", spec.type().empty()
                       ? absl::StrCat("is required; use one of ", OptimizerNames())
                       : absl::StrCat("unknown optimizer '", spec.type(), "'; use one of ",
                                      OptimizerNames()));
    return;  // without a type, no hyper-parameter can be checked
  }
  if (!(spec.learning_rate() > 0) || !std::isfinite(spec.learning_rate())) {
    report("learning_rate",
           absl::StrCat("must be a positive finite number, got ", spec.learning_rate()));
  }
  // The map's order is unspecified; report by name for stable messages.
  const std::map<std::string, double> given(spec.hyperparameters().begin(),
                                            spec.hyperparameters().end());
  for (const auto& [name, value] : given) {
    const HyperParameter* h = info->FindHyper(name);
    if (h == nullptr) {
      report(name, UnknownHyperParameterMessage(*info, name));
      continue;
    }
    absl::Status valid = CheckHyperParameter(*h, value);
    if (!valid.ok()) report(name, valid.message());
  }
}

absl::StatusOr<OptimizerConfig> ResolveOptimizer(const v1::OptimizerSpec& spec) {
  std::vector<std::string> errors;
  ForEachOptimizerError(spec, [&](absl::string_view field, absl::string_view message) {
    errors.push_back(absl::StrCat("spec.optimizer.", field, ": ", message));
  });
  if (!errors.empty()) return absl::InvalidArgumentError(absl::StrJoin(errors, "\n"));
  OptimizerConfig config;
  config.info = FindOptimizer(spec.type());
  config.learning_rate = spec.learning_rate();
  for (const HyperParameter& h : config.info->hyper) {
    auto it = spec.hyperparameters().find(h.name);
    config.hyper.push_back(it == spec.hyperparameters().end() ? h.default_value : it->second);
  }
  return config;
}

}  // namespace substrax
