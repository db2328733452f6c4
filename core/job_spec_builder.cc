#include "core/job_spec_builder.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "gtest/gtest.h"

namespace substrax::testing {

JobSpecBuilder::JobSpecBuilder(std::string name)
    : name_(std::move(name)),
      fields_({
          {"model", "{type: mlp, hidden_sizes: [8], num_classes: 2}"},
          {"data", ""},
          {"optimizer", "{type: sgd, learning_rate: 0.1}"},
          {"mesh", "{data_parallel_size: 1}"},
          {"batch", "{per_device_batch_size: 2}"},
          {"steps", "10"},
      }) {
  SyntheticData("{task: classification, num_train_examples: 64, num_features: 4, num_outputs: 2}");
}

JobSpecBuilder& JobSpecBuilder::Set(const std::string& key, std::string value) {
  for (auto& [k, v] : fields_) {
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  }
  fields_.emplace_back(key, std::move(value));
  return *this;
}

JobSpecBuilder& JobSpecBuilder::Steps(int steps) { return Set("steps", absl::StrCat(steps)); }

JobSpecBuilder& JobSpecBuilder::DataParallel(int dp, int mp) {
  return Mesh(mp > 1 ? absl::StrCat("{type: hybrid, data_parallel_size: ", dp,
                                    ", model_parallel_size: ", mp, "}")
                     : absl::StrCat("{data_parallel_size: ", dp, "}"));
}

JobSpecBuilder& JobSpecBuilder::SyntheticData(const std::string& settings) {
  return Data("synthetic", {{"synthetic", settings}});
}

JobSpecBuilder& JobSpecBuilder::Data(
    const std::string& format, const std::vector<std::pair<std::string, std::string>>& settings) {
  // A block of its own, a setting a line (the layout the header promises).
  std::string block = absl::StrCat("\n    format: ", format);
  for (const auto& [key, value] : settings) absl::StrAppend(&block, "\n    ", key, ": ", value);
  return Set("data", std::move(block));
}

JobSpecBuilder& JobSpecBuilder::Program(std::string program) {
  return UserCode("program", std::move(program));
}

JobSpecBuilder& JobSpecBuilder::Command(std::string command) {
  return UserCode("command", std::move(command));
}

JobSpecBuilder& JobSpecBuilder::UserCode(const std::string& key, std::string value) {
  for (const char* builtin : {"model", "data", "optimizer", "batch", "steps"}) Set(builtin, "");
  // The program or command comes first, where the model stood.
  for (auto& field : fields_) {
    if (field.first == "model") field = {key, std::move(value)};
  }
  return *this;
}

std::string JobSpecBuilder::Yaml() const {
  std::string yaml = absl::StrCat("apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: ",
                                  name_, "}\nspec:\n");
  for (const auto& [key, value] : fields_) {
    if (value.empty()) continue;
    // A block value starts on the next line; a flow value follows the key.
    absl::StrAppend(&yaml, "  ", key, value[0] == '\n' ? ":" : ": ", value, "\n");
  }
  return yaml;
}

absl::StatusOr<v1::JobSpec> JobSpecBuilder::Parse() const { return ParseJobSpecYaml(Yaml()); }

v1::JobSpec JobSpecBuilder::Proto() const {
  absl::StatusOr<v1::JobSpec> spec = Parse();
  if (!spec.ok()) {
    ADD_FAILURE() << "the test's job spec does not parse: " << spec.status() << "\n" << Yaml();
    return v1::JobSpec();
  }
  return *std::move(spec);
}

}  // namespace substrax::testing
