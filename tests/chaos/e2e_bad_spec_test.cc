// End to end over gRPC: every file of core/testdata/bad_specs whose error survives conversion to
// a JobSpec message (ReadJobSpecYaml reads it and the message, defaulted, is still invalid;
// YAML-level errors and explicit zeros cannot reach the wire and stay client tests), and
// hand-made invalid messages, are sent to a real coordinator with SubmitJob
// while it serves a running job; each is refused with INVALID_ARGUMENT naming the field, and
// the running job goes on untouched.
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

grpc::Status SubmitMessage(ChaosCluster& cluster, const v1::JobSpec& spec) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  return cluster.jobs()->SubmitJob(&context, request, &response);
}

TEST(EndToEndBadSpecTest, TheCoordinatorRefusesEveryInvalidMessageWhileServing) {
  ChaosClusterOptions options;
  options.workers = 1;
  options.cpu_devices_per_worker = 1;
  ChaosCluster cluster("e2e_bad_spec", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(30))) << cluster.Logs();
  const std::string running = cluster.Submit(SyntheticJob("running", 1, 1000000));
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(running);
        return job.has_value() && job->progress().step() > 0;
      },
      absl::Seconds(60)))
      << cluster.Logs();

  int sent = 0, client_only = 0;
  for (const auto& entry : fs::directory_iterator(Runfile("core/testdata/bad_specs"))) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const std::string yaml = ReadAll(entry.path());
    absl::StatusOr<v1::JobSpec> message = ReadJobSpecYaml(yaml, entry.path().filename().string());
    v1::JobSpec defaulted = message.ok() ? *message : v1::JobSpec();
    ApplyJobSpecDefaults(&defaulted);
    if (!message.ok() || ValidateJobSpec(defaulted).ok()) {
      // A YAML-level error (not YAML, unknown field, wrong type), or one the message cannot
      // carry (a zero written explicitly reads as unset, and takes its default): client tests.
      ++client_only;
      continue;
    }
    ++sent;
    const grpc::Status status = SubmitMessage(cluster, *message);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    // The field the file's "# expect: <path>: ..." names is named over the wire too.
    const size_t at = yaml.find("# expect: ");
    if (at != std::string::npos) {
      const std::string expect = yaml.substr(at + 10, yaml.find('\n', at) - at - 10);
      const std::string path = expect.substr(0, expect.find(": "));
      if (absl::StartsWith(path, "spec.") || absl::StartsWith(path, "metadata.")) {
        const std::string field = absl::StartsWith(path, "metadata.") ? "name" : path;
        EXPECT_THAT(status.error_message(), ::testing::HasSubstr(field));
      }
    }
  }
  EXPECT_GE(sent, 30) << "files sent over gRPC; " << client_only << " stay client tests";

  // Hand-made messages no YAML file produces.
  v1::JobSpec good = *ParseJobSpecYaml(SyntheticJob("good", 1, 10));
  std::vector<std::pair<std::string, v1::JobSpec>> hand_made;
  hand_made.push_back({"spec.model", v1::JobSpec()});
  v1::JobSpec bad = good;
  bad.mutable_model()->set_type(static_cast<v1::ModelType>(99));
  hand_made.push_back({"spec.model.type", bad});
  bad = good;
  bad.mutable_mesh()->set_data_parallel_size(-1);
  hand_made.push_back({"spec.mesh.data_parallel_size", bad});
  bad = good;
  bad.set_max_duration_seconds(-5);
  hand_made.push_back({"spec.max_duration_seconds", bad});
  bad = good;
  bad.set_progress_timeout_seconds(-1);
  hand_made.push_back({"spec.progress_timeout_seconds", bad});
  bad = good;
  bad.set_name("Not A DNS Label");
  hand_made.push_back({"name", bad});
  for (const auto& [field, spec] : hand_made) {
    SCOPED_TRACE(field);
    const grpc::Status status = SubmitMessage(cluster, spec);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), ::testing::HasSubstr(field));
  }

  // The running job never noticed.
  std::optional<v1::Job> job = cluster.Get(running);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job->attempt(), 1);
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
