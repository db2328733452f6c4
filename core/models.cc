#include "core/models.h"

#include <algorithm>

namespace substrax {

bool ModelInfo::Uses(absl::string_view field) const {
  return std::find(fields.begin(), fields.end(), field) != fields.end();
}

const std::vector<ModelInfo>& ModelTable() {
  using Task = ModelInfo::Task;
  static const auto* table = new std::vector<ModelInfo>{
      {v1::MODEL_TYPE_LINEAR, "linear", Task::kRegression, {"output_size"}, false,
       "y = xW + b, mean squared error loss"},
      {v1::MODEL_TYPE_SOFTMAX_REGRESSION, "softmax_regression", Task::kClassification,
       {"num_classes"}, false, "softmax(xW + b), cross-entropy loss"},
      {v1::MODEL_TYPE_MLP, "mlp", Task::kClassification, {"hidden_sizes", "num_classes"}, true,
       "dense layers with ReLU between them, softmax cross-entropy loss"},
  };
  return *table;
}

const ModelInfo* FindModel(v1::ModelType type) {
  for (const ModelInfo& info : ModelTable()) {
    if (info.type == type) return &info;
  }
  return nullptr;
}

const std::vector<std::string>& ModelSpecFields() {
  static const auto* fields =
      new std::vector<std::string>{"hidden_sizes", "num_classes", "output_size"};
  return *fields;
}

}  // namespace substrax
