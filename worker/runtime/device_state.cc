#include "worker/runtime/device_state.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker/runtime/device_backend.h"

namespace substrax {

TensorTree DeviceState(const TensorTree& params, const Optimizer& optimizer) {
  TensorTree state;
  for (const auto& [name, p] : params) state.emplace(absl::StrCat(kParamsPrefix, name), p);
  for (auto& [name, slot] : optimizer.ExportState(params)) {
    state.emplace(absl::StrCat(kOptimizerPrefix, name), std::move(slot));
  }
  return state;
}

absl::Status RestoreDeviceState(const TensorTree& state, int64_t step, TensorTree* params,
                                Optimizer& optimizer) {
  TensorTree restored, slots;
  for (const auto& [name, tensor] : state) {
    if (absl::StartsWith(name, kParamsPrefix)) {
      restored.emplace(name.substr(kParamsPrefix.size()), tensor);
    } else if (absl::StartsWith(name, kOptimizerPrefix)) {
      slots.emplace(name.substr(kOptimizerPrefix.size()), tensor);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("state array '", name, "' is unknown"));
    }
  }
  for (const auto& [name, p] : *params) {
    auto it = restored.find(name);
    if (it == restored.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("state array '", kParamsPrefix, name, "' is missing"));
    }
    if (it->second.shape() != p.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "state array '", kParamsPrefix, name, "' has shape ", it->second.ShapeString(),
          ", this device's block ", p.ShapeString()));
    }
  }
  for (const auto& [name, p] : restored) {
    if (params->count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("state array '", kParamsPrefix, name, "' is not a parameter"));
    }
  }
  SUBSTRAX_RETURN_IF_ERROR(optimizer.ImportState(slots, restored, step));
  *params = std::move(restored);
  return absl::OkStatus();
}

}  // namespace substrax
