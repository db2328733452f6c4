// Runner signals: a runner leads its own process group, ends on SIGTERM wherever it is (the
// daemon's blocked SIGTERM is not inherited: the runner's own handler stops it after the next
// report's step, worker/runtime/preemption.h), and a cancelled job's runner is gone well within
// the stop grace period. Ends with the /proc check.
#include <signal.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

// The process group of `pid` (field 5 of /proc/<pid>/stat), or -1.
int ProcessGroup(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::stringstream s;
  s << in.rdbuf();
  const std::string stat = s.str();
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return -1;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(paren + 2), ' ');
  return fields.size() > 2 ? std::stoi(fields[2]) : -1;
}

// Waits for the job's single runner to report steps; its pid.
pid_t RunningRunner(ChaosCluster& cluster, const std::string& id) {
  std::vector<RunnerProcess> runners;
  EXPECT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        runners = RunnersUnder(cluster.dir());
        return job.has_value() && job->progress().step() > 0 && runners.size() == 1;
      },
      absl::Seconds(60)))
      << cluster.Logs();
  return runners.empty() ? 0 : runners[0].pid;
}

TEST(RunnerSignalsTest, SigtermEndsARunnerAndCancelStopsItWithinTheGrace) {
  ChaosClusterOptions options;
  options.workers = 1;
  options.cpu_devices_per_worker = 1;
  options.stop_grace = "30s";  // so that an end within seconds is SIGTERM's, not SIGKILL's
  ChaosCluster cluster("runner_signals", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(30))) << cluster.Logs();

  // SIGTERM from outside: the runner stops at its next report (every 10 steps), and the attempt
  // fails naming it.
  const std::string first = cluster.Submit(SyntheticJob("term", 1, 100000));
  const pid_t runner = RunningRunner(cluster, first);
  ASSERT_GT(runner, 0);
  EXPECT_EQ(ProcessGroup(runner), runner) << "a runner leads its own process group";
  const absl::Time sent = absl::Now();
  kill(runner, SIGTERM);
  EXPECT_TRUE(PollUntil([&] { return RunnersUnder(cluster.dir()).empty(); }, absl::Seconds(5)));
  EXPECT_LT(absl::Now() - sent, absl::Seconds(5));
  std::optional<v1::Job> job = cluster.WaitForEnd(first, absl::Seconds(30));
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job->error(), HasSubstr("by SIGTERM"));

  // Cancel: the stop reaches the daemon, whose SIGTERM ends the runner long before the grace
  // would have brought SIGKILL, unless the runner's next step report, refused, ends it first.
  const std::string second = cluster.Submit(SyntheticJob("cancel", 1, 100000));
  ASSERT_GT(RunningRunner(cluster, second), 0);
  grpc::ClientContext context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(second);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(cluster.jobs()->CancelJob(&context, cancel, &cancelled).ok());
  const absl::Time cancelled_at = absl::Now();
  EXPECT_TRUE(PollUntil([&] { return RunnersUnder(cluster.dir()).empty(); }, absl::Seconds(5)))
      << cluster.Logs();
  EXPECT_LT(absl::Now() - cancelled_at, absl::Seconds(5));
  EXPECT_TRUE(PollUntil(
      [&] {
        const std::string logs = cluster.Logs();
        // SIGTERM from its daemon (the runner stops at its next report), or the runner ending
        // itself when the coordinator refused its next report (the refused call is named when
        // it was ReportSteps).
        return logs.find("by SIGTERM (preempted); no checkpoint") != std::string::npos ||
               logs.find("failed: stopped by the coordinator: attempt 1 of job cancel-2 has "
                         "ended: the job is CANCELLED") != std::string::npos ||
               logs.find("failed: stopped by the coordinator: ReportSteps: attempt 1 of job "
                         "cancel-2 has ended: the job is CANCELLED") != std::string::npos;
      },
      absl::Seconds(5)))
      << cluster.Logs();

  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
