// Hang attribution with real processes: 2 agents x 2 CPU devices run a built-in job in which
// one rank of process 1 is made to hang by a job failpoint (worker/collectives/
// job_failpoints.h). Within the progress timeout the job fails with an error that names exactly
// that rank, its process, worker and host, and the collective the others wait in; the ranks
// that only waited are not blamed. Each case ends with the /proc check that no process outlived
// it.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: hangs}
spec:
  model: {type: mlp, hidden_sizes: [32], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 4096, num_test_examples: 256,
                num_features: 16, noise: 1.0}
  optimizer: {type: sgd, learning_rate: 0.05}
  mesh: {data_parallel_size: 4}
  batch: {global_batch_size: 64}
  steps: 1000000
  report_every_steps: 1
  progress_timeout_seconds: 8
)";

// Agents whose jobs get `failpoint` (SUBSTRAX_JOB_FAILPOINTS, through --job-env-pass).
ChaosClusterOptions WithFailpoint(const std::string& failpoint,
                                  const std::string& collective_timeout) {
  ChaosClusterOptions options;
  options.collective_timeout = collective_timeout;
  options.worker_env = {absl::StrCat("SUBSTRAX_JOB_FAILPOINTS=", failpoint)};
  options.worker_flags = {"--job-env-pass", "SUBSTRAX_JOB_FAILPOINTS"};
  return options;
}

// Runs the job with `failpoint` armed on every worker; the ended job. The collective timeout
// is longer than the progress timeout (the stall is found by the coordinator) unless
// `collective_timeout` says otherwise.
v1::Job RunWithFailpoint(const std::string& name, const std::string& failpoint,
                         absl::Duration* took, const std::string& collective_timeout = "120s") {
  ChaosCluster cluster(name, WithFailpoint(failpoint, collective_timeout));
  EXPECT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(kJob);
  EXPECT_FALSE(absl::StartsWith(id, "error")) << id;
  const absl::Time start = absl::Now();
  std::optional<v1::Job> ended = cluster.WaitForEnd(id, absl::Minutes(2));
  *took = absl::Now() - start;
  EXPECT_TRUE(ended.has_value()) << cluster.Logs();
  if (!ended.has_value()) return v1::Job();
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED) << ended->error();
  std::fprintf(stderr, "the job's error: %s\n", ended->error().c_str());
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
  return *ended;
}

// The rank the error blames is on process 1, and no rank of process 0 is blamed.
void ExpectOnlyProcessOneBlamed(const std::string& error) {
  EXPECT_THAT(error, HasSubstr("of process 1 (worker w-"));
  EXPECT_THAT(error, HasSubstr("(host host-"));
  EXPECT_THAT(error, Not(HasSubstr("of process 0 (worker")));
}

TEST(HangTest, ARankThatSleepsBeforeAnAllReduceIsNamed) {
  absl::Duration took;
  const v1::Job job =
      RunWithFailpoint("hang_sleep", "sleep_before_all_reduce:process=1:at=40", &took);
  EXPECT_THAT(job.error(), HasSubstr("stalled at step "));
  EXPECT_THAT(job.error(), HasSubstr("all_reduce #"));
  EXPECT_THAT(job.error(), HasSubstr("has not entered it"));
  ExpectOnlyProcessOneBlamed(job.error());
  EXPECT_LT(took, absl::Seconds(60)) << job.error();
}

// The same rank, found the other way: a waiting process's collective times out (4 s, before
// the progress timeout of 8 s) and reports DEADLINE_EXCEEDED; the error still names the rank it
// waited for, not the process that timed out.
TEST(HangTest, ACollectiveTimeoutIsAttributedToTheRankItWaitedFor) {
  absl::Duration took;
  const v1::Job job = RunWithFailpoint("hang_timeout", "sleep_before_all_reduce:process=1:at=40",
                                       &took, "4s");
  EXPECT_THAT(job.error(), HasSubstr("has not entered it"));
  EXPECT_THAT(job.error(), HasSubstr("a collective timed out (runner of process "));
  ExpectOnlyProcessOneBlamed(job.error());
  EXPECT_LT(took, absl::Seconds(60)) << job.error();
}

TEST(HangTest, AProcessThatStopsMakingProgressIsNamedWithWhatItDoes) {
  absl::Duration took;
  const v1::Job job = RunWithFailpoint("hang_step", "hang_at_step:process=1:at=30", &took);
  EXPECT_THAT(job.error(), HasSubstr("stalled at step "));
  EXPECT_THAT(job.error(), HasSubstr("has not entered it: in data since "));
  // Its last log lines, as its agent shipped them.
  EXPECT_THAT(job.error(), HasSubstr("last log lines of process 1 (worker w-"));
  EXPECT_THAT(job.error(), HasSubstr("hang_at_step fires at step 30"));
  ExpectOnlyProcessOneBlamed(job.error());
  EXPECT_LT(took, absl::Seconds(60)) << job.error();
}

TEST(HangTest, ARankThatSkipsACollectiveIsADesync) {
  absl::Duration took;
  const v1::Job job = RunWithFailpoint("hang_skip", "skip_all_reduce:process=1:at=40", &took);
  EXPECT_THAT(job.error(), HasSubstr("desync over "));
  ExpectOnlyProcessOneBlamed(job.error());
  EXPECT_LT(took, absl::Seconds(60)) << job.error();
}

// A command job (a shell script, per_device: 4 processes on 2 workers) whose rank 2 goes silent
// at step 20 while the others keep writing heartbeats to their report files (as a process
// waiting in a collective does, from a thread): the stall is attributed to rank 2's device.
constexpr char kStallingScript[] = R"(#!/bin/sh
# Reports 20 steps, then rank 2 goes silent; the others heartbeat, waiting for it.
step=0
while [ $step -lt 20 ]; do
  step=$((step + 1))
  echo "{\"type\":\"step\",\"step\":$step,\"metrics\":{\"loss\":1.0}}" >>"$SUBSTRAX_REPORT_FILE"
  sleep 0.1
done
if [ "$RANK" = 2 ]; then echo "rank 2: stuck"; exec sleep 3600; fi
while :; do echo '{"type":"heartbeat"}' >>"$SUBSTRAX_REPORT_FILE"; sleep 0.2; done
)";

TEST(HangTest, ACommandsProcessWhoseReportFileWentSilentIsNamed) {
  const std::string programs = TempDir("hang_command_programs");
  const std::string script = programs + "/stalling.sh";
  std::ofstream(script) << kStallingScript;
  std::filesystem::permissions(script, std::filesystem::perms::owner_all);
  ChaosClusterOptions options;
  options.worker_flags = {"--programs-dir", programs, "--allow-command-jobs"};
  ChaosCluster cluster("hang_command", options);
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(absl::StrCat(
      "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: stalling}\nspec:\n"
      "  command: {argv: [", script, "], processes: per_device}\n"
      "  mesh: {data_parallel_size: 4}\n  steps: 100\n  progress_timeout_seconds: 6\n"));
  ASSERT_FALSE(absl::StartsWith(id, "error")) << id;
  std::optional<v1::Job> ended = cluster.WaitForEnd(id, absl::Minutes(2));
  ASSERT_TRUE(ended.has_value()) << cluster.Logs();
  std::fprintf(stderr, "the job's error: %s\n", ended->error().c_str());
  EXPECT_EQ(ended->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(ended->error(), HasSubstr("stalled at step 20: device 2 (process 1 (worker w-"));
  EXPECT_THAT(ended->error(), HasSubstr("stopped reporting at "));
  EXPECT_THAT(ended->error(), HasSubstr("(step 20); the others reported until"));
  EXPECT_THAT(ended->error(), Not(HasSubstr("device 0 (")));
  EXPECT_THAT(ended->error(), Not(HasSubstr("device 1 (")));
  EXPECT_THAT(ended->error(), Not(HasSubstr("device 3 (")));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

// `substraxctl diagnose` on a job that has stalled but not yet reached its progress timeout:
// which rank the others wait for, what it does, and the tables of the relayed activity.
TEST(HangTest, DiagnoseNamesTheRankTheOthersWaitForWhileTheJobHangs) {
  ChaosCluster cluster("hang_diagnose", WithFailpoint("hang_at_step:process=1:at=30", "120s"));
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  std::string spec = kJob;
  spec.replace(spec.find("progress_timeout_seconds: 8"), 27, "progress_timeout_seconds: 300");
  const std::string id = cluster.Submit(spec);
  ASSERT_FALSE(absl::StartsWith(id, "error")) << id;
  CommandResult diagnosis;
  const bool named = PollUntil(
      [&] {
        diagnosis = cluster.Ctl({"diagnose", id});
        return absl::StrContains(diagnosis.out, "has not entered it: in data since");
      },
      absl::Minutes(1));
  std::fprintf(stderr, "substraxctl diagnose:\n%s\n", diagnosis.out.c_str());
  ASSERT_TRUE(named) << diagnosis.out << diagnosis.err << cluster.Logs();
  EXPECT_EQ(diagnosis.exit_code, 0);
  EXPECT_THAT(diagnosis.out, HasSubstr("Waiting:  all_reduce #"));
  EXPECT_THAT(diagnosis.out, HasSubstr("of process 1 (worker w-"));
  EXPECT_THAT(diagnosis.out, HasSubstr("Processes:"));
  EXPECT_THAT(diagnosis.out, HasSubstr("Collectives (entered more than completed"));
  // Process 1's devices are in their data phase; process 0's in their collective phase.
  EXPECT_THAT(diagnosis.out, HasSubstr("   data   "));
  EXPECT_THAT(diagnosis.out, HasSubstr("   collective   "));
  ASSERT_EQ(cluster.Ctl({"cancel", id}).exit_code, 0);
  ASSERT_TRUE(cluster.WaitForEnd(id, absl::Minutes(1)).has_value());
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
