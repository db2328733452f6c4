// The models substrax trains, as one table: their YAML names, what they predict, which ModelSpec
// fields they use and whether they split over a model axis. The job-spec validator, the enum
// names in messages and output, and the parameter catalog (core/model_catalog.h) read it.
//
// Pure data and pure functions; thread-safe.
#ifndef SUBSTRAX_CORE_MODELS_H_
#define SUBSTRAX_CORE_MODELS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

struct ModelInfo {
  v1::ModelType type = v1::MODEL_TYPE_UNSPECIFIED;
  // The YAML name: the enum value's name lower-cased without its prefix ("softmax_regression").
  std::string name;
  // Classification models predict classes (softmax cross-entropy, accuracy); regression models
  // predict values (mean squared error).
  enum class Task { kClassification, kRegression } task = Task::kClassification;
  // The ModelSpec fields besides `type` the model reads ("hidden_sizes", "num_classes",
  // "output_size"); the validator rejects the others when they are set.
  std::vector<std::string> fields;
  // Whether the model splits over a mesh's model axis (tensor parallelism).
  bool tensor_parallel = false;
  std::string doc;  // one line, for docs and messages

  bool Uses(absl::string_view field) const;
};

// Every model, in the enum's order (linear, softmax_regression, mlp).
const std::vector<ModelInfo>& ModelTable();

// nullptr for MODEL_TYPE_UNSPECIFIED and values no row has.
const ModelInfo* FindModel(v1::ModelType type);

// The ModelSpec fields some model reads, in the order of the proto.
const std::vector<std::string>& ModelSpecFields();

// The names of the models whose rows satisfy `pred`, in table order.
template <typename Pred>
std::vector<std::string> ModelNames(Pred pred) {
  std::vector<std::string> names;
  for (const ModelInfo& info : ModelTable()) {
    if (pred(info)) names.push_back(info.name);
  }
  return names;
}

}  // namespace substrax

#endif  // SUBSTRAX_CORE_MODELS_H_
