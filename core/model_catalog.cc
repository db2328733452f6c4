#include "core/model_catalog.h"

#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "core/models.h"

namespace substrax {

int64_t ModelOutputSize(const v1::ModelSpec& model) {
  return IsClassification(model.type()) ? model.num_classes() : model.output_size();
}

std::vector<LayerSplit> LayerSplits(const v1::ModelSpec& model, int64_t model_axis_size) {
  const ModelInfo* info = FindModel(model.type());
  const bool hidden = info != nullptr && info->Uses("hidden_sizes");
  const int layers = hidden ? model.hidden_sizes_size() + 1 : 1;
  std::vector<LayerSplit> splits(layers, LayerSplit::kReplicated);
  if (info == nullptr || !info->tensor_parallel || model_axis_size <= 1) return splits;
  for (int layer = 0; layer + 1 < layers; layer += 2) {
    splits[layer] = LayerSplit::kColumn;
    splits[layer + 1] = LayerSplit::kRow;
  }
  return splits;
}

absl::StatusOr<std::vector<ParamSpec>> ModelParams(const v1::ModelSpec& model,
                                                   int64_t num_features,
                                                   int64_t model_axis_size) {
  if (num_features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a model needs at least one input feature, got ", num_features));
  }
  std::vector<int64_t> widths = {num_features};
  const ModelInfo* info = FindModel(model.type());
  if (info == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.model.type: unknown model ", v1::ModelType_Name(model.type())));
  }
  // Dense layers: one per hidden width the model uses, then the output layer.
  if (info->Uses("hidden_sizes")) {
    if (model.hidden_sizes().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.model.hidden_sizes: model ", info->name, " needs a hidden layer"));
    }
    for (int64_t h : model.hidden_sizes()) widths.push_back(h);
  }
  const int64_t outputs = ModelOutputSize(model);
  if (outputs < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        IsClassification(model.type()) ? "spec.model.num_classes" : "spec.model.output_size",
        ": must be >= 1, got ", outputs));
  }
  widths.push_back(outputs);
  const std::vector<LayerSplit> splits = LayerSplits(model, model_axis_size);
  std::vector<ParamSpec> params;
  for (size_t layer = 0; layer + 1 < widths.size(); ++layer) {
    const int64_t in = widths[layer], out = widths[layer + 1];
    if (in < 1 || out < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec.model.hidden_sizes: layer widths must be >= 1, got ", in, " -> ", out));
    }
    PartitionSpec kernel, bias;
    if (splits[layer] == LayerSplit::kColumn) {
      // The split dimension is hidden layer `layer`'s width, shared with the row-parallel partner.
      if (out % model_axis_size != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "spec.model.hidden_sizes[", layer, "]: ", out,
            " does not divide over the model axis of size ", model_axis_size));
      }
      kernel = PartitionSpec({{}, {kModelAxis}});
      bias = PartitionSpec({{kModelAxis}});
    } else if (splits[layer] == LayerSplit::kRow) {
      kernel = PartitionSpec({{kModelAxis}, {}});
    }
    const std::string prefix = absl::StrCat("dense_", layer, "/");
    params.push_back({prefix + "kernel", {in, out}, kernel, in, out});
    params.push_back({prefix + "bias", {out}, bias, in, out});
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
