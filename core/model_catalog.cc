#include "core/model_catalog.h"

#include "absl/strings/str_cat.h"
#include "core/job_spec.h"

namespace substrax {

int64_t ModelOutputSize(const v1::ModelSpec& model) {
  return IsClassification(model.type()) ? model.num_classes() : model.output_size();
}

absl::StatusOr<std::vector<ParamSpec>> ModelParams(const v1::ModelSpec& model,
                                                   int64_t num_features) {
  if (num_features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a model needs at least one input feature, got ", num_features));
  }
  std::vector<int64_t> widths = {num_features};
  switch (model.type()) {
    case v1::MODEL_TYPE_MLP:
      if (model.hidden_sizes().empty()) {
        return absl::InvalidArgumentError("spec.model.hidden_sizes: an mlp needs a hidden layer");
      }
      for (int64_t h : model.hidden_sizes()) widths.push_back(h);
      break;
    case v1::MODEL_TYPE_LINEAR:
    case v1::MODEL_TYPE_SOFTMAX_REGRESSION:
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("spec.model.type: unknown model ", v1::ModelType_Name(model.type())));
  }
  const int64_t outputs = ModelOutputSize(model);
  if (outputs < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        IsClassification(model.type()) ? "spec.model.num_classes" : "spec.model.output_size",
        ": must be >= 1, got ", outputs));
  }
  widths.push_back(outputs);
  std::vector<ParamSpec> params;
  for (size_t layer = 0; layer + 1 < widths.size(); ++layer) {
    const int64_t in = widths[layer], out = widths[layer + 1];
    if (in < 1 || out < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.model.hidden_sizes: layer widths must be >= 1, got ", in, " -> ", out));
    }
    const std::string prefix = absl::StrCat("dense_", layer, "/");
    params.push_back({prefix + "kernel", {in, out}, PartitionSpec(), in, out});
    params.push_back({prefix + "bias", {out}, PartitionSpec(), in, out});
  }
  return params;
}

int64_t ParamCount(const std::vector<ParamSpec>& params) {
  int64_t n = 0;
  for (const ParamSpec& p : params) {
    int64_t size = 1;
    for (int64_t d : p.shape) size *= d;
    n += size;
  }
  return n;
}

}  // namespace substrax
