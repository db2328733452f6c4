// Chaos 4, stall: a SIGSTOPped runner of a single-process job fails its attempt with
// "stalled at step S on process P (worker, host)" within the progress timeout; a SIGSTOPped
// process of a 2-process job makes its peer's collective time out, and the failure names the
// stopped process. Afterwards no runner is left (the stopped one is SIGKILLed after the grace).
#include <signal.h>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

// Waits until the job has reported steps and its runner of process `process` is up.
pid_t ReportingRunner(ChaosCluster& cluster, const std::string& id, int process) {
  pid_t pid = 0;
  EXPECT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        if (!job.has_value() || job->progress().step() == 0) return false;
        for (const RunnerProcess& r : RunnersUnder(cluster.dir())) {
          if (r.launch.find(absl::StrCat("-process-", process, ".")) != std::string::npos) {
            pid = r.pid;
          }
        }
        return pid != 0;
      },
      absl::Seconds(60)))
      << cluster.Logs();
  return pid;
}

TEST(StallTest, AStoppedSingleProcessRunnerFailsWithinTheProgressTimeout) {
  ChaosClusterOptions options;
  options.workers = 1;
  options.cpu_devices_per_worker = 1;
  ChaosCluster cluster("stall_single", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(SyntheticJob("hang", 1, 1000000, /*max_restarts=*/0) +
                                        "  progress_timeout_seconds: 3\n");
  const pid_t runner = ReportingRunner(cluster, id, 0);
  ASSERT_GT(runner, 0);
  kill(runner, SIGSTOP);
  const absl::Time stopped = absl::Now();
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(20));
  // The timeout counts from the last new step (before the SIGSTOP), checked every tick.
  EXPECT_LT(absl::Now() - stopped, absl::Seconds(3) + absl::Seconds(2));
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->error(), HasSubstr("stalled at step "));
  EXPECT_THAT(job->error(),
              HasSubstr("on process 0 (worker w-1 (host host-a)): no new step for 3s"));
  EXPECT_THAT(job->error(), HasSubstr("suspended"));
  // SIGTERM cannot end a stopped process; SIGKILL after the 2 s grace does.
  EXPECT_TRUE(PollUntil([&] { return RunnersUnder(cluster.dir()).empty(); }, absl::Seconds(8)))
      << cluster.Logs();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(StallTest, AStoppedPeerIsNamedWhenTheOthersCollectiveTimesOut) {
  ChaosClusterOptions options;
  options.workers = 2;
  options.cpu_devices_per_worker = 1;
  options.collective_timeout = "3s";
  ChaosCluster cluster("stall_peer", options);
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(SyntheticJob("peer", 2, 1000000, /*max_restarts=*/0) +
                                        "  progress_timeout_seconds: 60\n");
  const pid_t runner = ReportingRunner(cluster, id, 1);
  ASSERT_GT(runner, 0);
  kill(runner, SIGSTOP);
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(30));
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << cluster.Logs();
  EXPECT_THAT(job->error(), HasSubstr("runner of process 0"));
  EXPECT_THAT(job->error(), HasSubstr("process 1 on worker w-"));
  EXPECT_THAT(job->error(), HasSubstr("is suspended (stopped by a signal)"));
  EXPECT_TRUE(PollUntil([&] { return RunnersUnder(cluster.dir()).empty(); }, absl::Seconds(8)))
      << cluster.Logs();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
