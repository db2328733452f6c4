// Job specs for tests: one TrainJob YAML in one place, with the fields a test cares about
// changed, instead of a copy of the whole document in every test.
//
//   JobSpecBuilder("train").DataParallel(4).Set("max_restarts", "2").Proto()
//
// By default: a small mlp classifier on synthetic data, SGD, one data-parallel device, 2 examples
// a device, 10 steps.
// Yaml() lays the document out one field a line, always in this order (tests that check an
// error's line number rely on it):
//
//   1 apiVersion  2 kind  3 metadata  4 spec:  then the spec's fields, in the order below (model,
//   data with format and its settings on lines of their own, optimizer, mesh, batch, steps),
//   then the fields Set adds, in the order they were added.
#ifndef SUBSTRAX_CORE_JOB_SPEC_BUILDER_H_
#define SUBSTRAX_CORE_JOB_SPEC_BUILDER_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "substrax/v1/job.pb.h"

namespace substrax::testing {

class JobSpecBuilder {
 public:
  explicit JobSpecBuilder(std::string name = "test");

  // Sets spec field `key` to `value` (YAML, usually a flow mapping such as "{type: adam,
  // learning_rate: 0.01}"), where it stands or, for a new key, at the end. Empty `value`: the
  // field is left out.
  JobSpecBuilder& Set(const std::string& key, std::string value);

  JobSpecBuilder& Model(std::string value) { return Set("model", std::move(value)); }
  JobSpecBuilder& Optimizer(std::string value) { return Set("optimizer", std::move(value)); }
  JobSpecBuilder& Mesh(std::string value) { return Set("mesh", std::move(value)); }
  JobSpecBuilder& Batch(std::string value) { return Set("batch", std::move(value)); }
  JobSpecBuilder& Steps(int steps);
  // mesh: {data_parallel_size: dp}; with mp > 1 a hybrid mesh of dp x mp.
  JobSpecBuilder& DataParallel(int dp, int mp = 1);
  // data: {format: synthetic, synthetic: `settings`}.
  JobSpecBuilder& SyntheticData(const std::string& settings);
  // data of `format` with its settings, e.g. ("csv", {{"csv", "{label_column: y}"}, {"train",
  // "{path: /d/train.csv}"}}).
  JobSpecBuilder& Data(const std::string& format,
                       const std::vector<std::pair<std::string, std::string>>& settings);
  // A program job: spec.program is `program` ("{path: /opt/p/train}") and the built-in
  // trainer's fields (model, data, optimizer, batch, steps) are left out.
  JobSpecBuilder& Program(std::string program);
  // A command job likewise: spec.command is `command` ("{argv: [/opt/p/train.sh]}").
  JobSpecBuilder& Command(std::string command);

  // The document.
  std::string Yaml() const;
  // The document parsed (ParseJobSpecYaml: no defaults applied).
  absl::StatusOr<v1::JobSpec> Parse() const;
  // Parse()'s spec; a test failure naming the error and the document when it does not parse.
  v1::JobSpec Proto() const;

 private:
  // Program and Command: `key` in the model's place, the built-in trainer's fields left out.
  JobSpecBuilder& UserCode(const std::string& key, std::string value);

  std::string name_;
  std::vector<std::pair<std::string, std::string>> fields_;  // spec's, in document order
};

}  // namespace substrax::testing

#endif  // SUBSTRAX_CORE_JOB_SPEC_BUILDER_H_
