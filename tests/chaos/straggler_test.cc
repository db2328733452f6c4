// Stragglers with real processes: 2 agents x 2 CPU devices run a built-in job; process 1's
// runner is slowed by a SIGSTOP/SIGCONT duty cycle (stopped half of every 200 ms). The
// coordinator flags its devices as stragglers (compute or data time well above the others'),
// and only those: `get` shows them and the job's history has the transition. The job is
// compute-bound (a large batch on a small model), as training jobs are, so that the stopped
// time lands in its compute phase. Ends with the /proc check that no process outlived it.
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"
#include "tests/proc.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: slowed}
spec:
  model: {type: mlp, hidden_sizes: [256, 256], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 32768, num_test_examples: 512,
                num_features: 64, noise: 1.0}
  optimizer: {type: adam, learning_rate: 0.003}
  mesh: {data_parallel_size: 4}
  batch: {global_batch_size: 4096}
  steps: 1000000
  report_every_steps: 2
)";

TEST(StragglerTest, ARankSlowedByAStopDutyCycleIsFlaggedAndOnlyIt) {
  ChaosClusterOptions options;
  options.collective_timeout = "60s";
  ChaosCluster cluster("straggler", options);
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(kJob);
  ASSERT_FALSE(absl::StartsWith(id, "error")) << id;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        return job.has_value() && job->progress().step() >= 20;
      },
      absl::Minutes(2)))
      << cluster.Logs();
  pid_t slowed = 0;
  for (const RunnerProcess& r : RunnersUnder(cluster.dir())) {
    if (r.launch.find(id + "-attempt-1-process-1") != std::string::npos) slowed = r.pid;
  }
  ASSERT_NE(slowed, 0) << "no runner of process 1";

  // The fault: stopped 100 ms of every 200 ms, until the test has its answer.
  std::atomic<bool> done{false};
  std::thread duty([&] {
    while (!done.load()) {
      kill(slowed, SIGSTOP);
      absl::SleepFor(absl::Milliseconds(100));
      kill(slowed, SIGCONT);
      absl::SleepFor(absl::Milliseconds(100));
    }
  });
  std::optional<v1::Job> flagged;
  const bool seen = PollUntil(
      [&] {
        flagged = cluster.Get(id);
        return flagged.has_value() && flagged->stragglers_size() > 0;
      },
      absl::Minutes(2));
  const CommandResult get = cluster.Ctl({"get", id});
  done.store(true);
  duty.join();
  kill(slowed, SIGCONT);
  ASSERT_TRUE(seen) << cluster.Logs();
  for (const v1::Straggler& s : flagged->stragglers()) {
    EXPECT_EQ(s.process_index(), 1) << s.ShortDebugString();  // the waiting ranks are not
    for (const v1::Device& d : flagged->mesh().devices()) {
      if (d.id() == s.device_id()) {
        EXPECT_EQ(s.worker_id(), d.worker_id());
      }
    }
    EXPECT_GE(s.ratio(), 1.5);
  }
  EXPECT_THAT(get.out, HasSubstr("(a straggler)"));
  std::string reasons;
  for (const v1::JobTransition& t : flagged->transitions()) absl::StrAppend(&reasons, t.reason());
  EXPECT_THAT(reasons, HasSubstr("straggler: device "));
  EXPECT_THAT(reasons, HasSubstr("(process 1, worker w-"));
  EXPECT_THAT(reasons, ::testing::Not(HasSubstr("(process 0, worker w-")));

  ASSERT_EQ(cluster.Ctl({"cancel", id}).exit_code, 0);
  std::optional<v1::Job> ended = cluster.WaitForEnd(id, absl::Minutes(1));
  ASSERT_TRUE(ended.has_value());
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
