// Preemption with real processes: a coordinator started with a --queues file of two priority
// classes, 2 agents x 2 CPU devices.
//
//   - A low-priority built-in job that checkpoints only when asked is preempted by a
//     high-priority one: it writes its preemption checkpoint, stops, waits PENDING, and resumes
//     from that checkpoint (not step 0) once the high one has succeeded; both SUCCEED, the low
//     one without using a restart (max_restarts 0).
//   - A coordinator killed (SIGKILL) while a command job is being preempted (its checkpoint
//     takes seconds): restarted, it goes on with the preemption; the victim ends stopped, never
//     both stopped and running (no two of its runners alive at once), resumes from its
//     checkpoint, and no attempt is counted twice (it succeeds with max_restarts 0).
// Each ends with the /proc check that no process outlived its purpose.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kJaxEnv[] = "/opt/substrax/jax";

constexpr char kQueues[] = R"(queues:
  - name: research
    quotas: [{backend: cpu, devices: 4}]
priority_classes:
  - {name: low, value: 0}
  - {name: high, value: 1000}
default_priority_class: low
preemption_grace_seconds: GRACE
)";

constexpr char kBuiltin[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: NAME}
spec:
  priority_class: CLASS
  model: {type: mlp, hidden_sizes: [64, 64], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 8192, num_test_examples: 2048,
                num_features: 32, noise: 2.0}
  optimizer: {type: adam, learning_rate: 0.003}
  mesh: {data_parallel_size: 4}
  batch: {global_batch_size: 128}
  steps: STEPS
  seed: 7
  report_every_steps: 20
  max_restarts: 0
  EXTRA
)";

std::string Builtin(const std::string& name, const std::string& priority_class, int steps,
                    const std::string& extra = "") {
  return absl::StrReplaceAll(kBuiltin, {{"NAME", name},
                                        {"CLASS", priority_class},
                                        {"STEPS", absl::StrCat(steps)},
                                        {"EXTRA", extra}});
}

std::string Reasons(const v1::Job& job) {
  std::string out;
  for (const v1::JobTransition& t : job.transitions()) absl::StrAppend(&out, t.reason(), "\n");
  return out;
}

struct PreemptionCluster {
  std::string files;
  std::string checkpoints;
  std::unique_ptr<ChaosCluster> cluster;
};

// `grace`: the queues file's preemption_grace_seconds. The policy preempts only a job whose
// estimate runs past ten graces (it waits for a sooner end), so a short grace keeps the jobs
// short.
PreemptionCluster Start(const std::string& name, int grace) {
  PreemptionCluster c;
  c.files = TempDir(name + "_files");
  c.checkpoints = c.files + "/checkpoints";
  std::filesystem::create_directories(c.checkpoints);
  const std::string queues = c.files + "/queues.yaml";
  std::ofstream(queues) << absl::StrReplaceAll(kQueues, {{"GRACE", absl::StrCat(grace)}});
  ChaosClusterOptions options;
  options.stop_grace = "1s";  // the preemption's own grace is longer: it wins
  options.coordinator_flags = {"--queues", queues, "--restart-backoff", "1s"};
  options.worker_flags = {"--checkpoint-root", c.checkpoints, "--allow-command-jobs"};
  if (access(absl::StrCat(kJaxEnv, "/bin").c_str(), F_OK) == 0) {
    options.worker_flags.push_back("--python-env");
    options.worker_flags.push_back(absl::StrCat("jax=", kJaxEnv));
  }
  c.cluster = std::make_unique<ChaosCluster>(name, options);
  return c;
}

// Polls until `id` is RUNNING at step >= `step`; false at the deadline or if it ended.
bool RunningAt(ChaosCluster& cluster, const std::string& id, int64_t step) {
  return PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        return job.has_value() && job->state() == v1::JOB_STATE_RUNNING &&
               job->progress().step() >= step;
      },
      absl::Minutes(2));
}

TEST(PreemptionTest, ALowPriorityJobCheckpointsWhenPreemptedAndResumesFromThatCheckpoint) {
  PreemptionCluster c = Start("preempt_builtin", 2);
  ChaosCluster& cluster = *c.cluster;
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  // Checkpoints only when asked: a scheduled one would hide where the resume came from.
  const std::string low = cluster.Submit(Builtin(
      "low", "low", 20000,
      absl::StrCat("checkpoint: {directory: ", c.checkpoints, "/anonymous/low, every_seconds: 86400}")));
  ASSERT_FALSE(absl::StartsWith(low, "error")) << low;
  ASSERT_TRUE(RunningAt(cluster, low, 200)) << cluster.Logs();

  const std::string high = cluster.Submit(Builtin("high", "high", 200));
  ASSERT_FALSE(absl::StartsWith(high, "error")) << high;
  std::optional<v1::Job> done_high = cluster.WaitForEnd(high, absl::Minutes(3));
  ASSERT_TRUE(done_high.has_value()) << cluster.Logs();
  EXPECT_EQ(done_high->state(), v1::JOB_STATE_SUCCEEDED) << done_high->error();

  std::optional<v1::Job> done_low = cluster.WaitForEnd(low, absl::Minutes(4));
  ASSERT_TRUE(done_low.has_value()) << cluster.Logs();
  ASSERT_EQ(done_low->state(), v1::JOB_STATE_SUCCEEDED) << done_low->error() << cluster.Logs();
  EXPECT_EQ(done_low->preemptions(), 1);
  EXPECT_EQ(done_low->attempt(), 2);
  const std::string reasons = Reasons(*done_low);
  EXPECT_THAT(reasons, HasSubstr(absl::StrCat("preempted for job ", high)));
  // Its checkpoint at the step it stopped, and the resume from it (not from step 0).
  EXPECT_GE(done_low->resumed_from_step(), 200) << reasons;
  EXPECT_THAT(reasons, HasSubstr(absl::StrCat("resumed from the checkpoint of step ",
                                              done_low->resumed_from_step())));
  EXPECT_THAT(reasons, HasSubstr(absl::StrCat("since its checkpoint of step ",
                                              done_low->resumed_from_step())));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(PreemptionTest, ACoordinatorKilledMidPreemptionLeavesTheVictimStoppedNeverBoth) {
  if (access(absl::StrCat(kJaxEnv, "/bin/python").c_str(), X_OK) != 0) {
    if (InCi()) FAIL() << "the JAX venv is missing";
    GTEST_SKIP() << "the JAX venv (with the substrax package) is missing: make python";
  }
  PreemptionCluster c = Start("preempt_kill", 6);
  ChaosCluster& cluster = *c.cluster;
  const std::string script = c.files + "/preemptible_job.py";
  std::filesystem::copy_file(Runfile("tests/chaos/preemptible_job.py"), script);
  RunnerWatch watch(cluster.dir());
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string low = cluster.Submit(absl::StrCat(
      "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: victim}\nspec:\n"
      "  command: {python_env: jax, argv: [python, ", script,
      "], env: {JOB_STOP_SECONDS: \"3\"}}\n  mesh: {data_parallel_size: 4}\n  steps: 400\n"
      "  report_every_steps: 10\n  max_restarts: 0\n  checkpoint: {directory: ", c.checkpoints,
      "/anonymous/victim}\n"));
  ASSERT_FALSE(absl::StartsWith(low, "error")) << low;
  ASSERT_TRUE(RunningAt(cluster, low, 50)) << cluster.Logs();

  const std::string high = cluster.Submit(Builtin("high", "high", 100));
  ASSERT_FALSE(absl::StartsWith(high, "error")) << high;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(low);
        return job.has_value() && job->has_preemption();
      },
      absl::Seconds(30)))
      << cluster.Logs();
  // Killed while the victim writes its checkpoint (3 s); back at once on the same state.
  cluster.coordinator().Signal(SIGKILL);
  ASSERT_TRUE(cluster.coordinator().Wait(absl::Seconds(30)).has_value());
  cluster.StartCoordinator();

  std::optional<v1::Job> done_high = cluster.WaitForEnd(high, absl::Minutes(3));
  ASSERT_TRUE(done_high.has_value()) << cluster.Logs();
  EXPECT_EQ(done_high->state(), v1::JOB_STATE_SUCCEEDED) << done_high->error();
  std::optional<v1::Job> done_low = cluster.WaitForEnd(low, absl::Minutes(3));
  ASSERT_TRUE(done_low.has_value()) << cluster.Logs();
  ASSERT_EQ(done_low->state(), v1::JOB_STATE_SUCCEEDED) << done_low->error() << cluster.Logs();
  EXPECT_EQ(done_low->preemptions(), 1) << Reasons(*done_low);
  EXPECT_EQ(done_low->attempt(), 2) << Reasons(*done_low);
  EXPECT_GE(done_low->resumed_from_step(), 50) << Reasons(*done_low);
  EXPECT_EQ(watch.Overlaps(), 0) << "two runners of one job were alive at once";
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
