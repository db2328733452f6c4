// Chaos 1, stream break: a TCP proxy between the daemons (and their runners) and the coordinator
// resets every connection mid-job, three times. Exactly once per (job, attempt, process): no
// assignment is run by a second runner, the job SUCCEEDS in attempt 1, and afterwards no
// process of the cluster is left (/proc).
#include <signal.h>

#include <iostream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

TEST(StreamBreakTest, ResetConnectionsNeverStartASecondRunner) {
  ChaosClusterOptions options;
  options.through_proxy = true;
  ChaosCluster cluster("stream_break", options);
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  RunnerWatch watch(cluster.dir());

  const std::string id = cluster.Submit(SyntheticJob("blip", 4, 2000));
  ASSERT_EQ(id.rfind("error", 0), std::string::npos) << id;
  // Reset everything after the first reports, and twice more as the job goes on.
  int64_t last_step = 0;
  for (int reset = 0; reset < 3; ++reset) {
    std::optional<v1::Job> job;
    ASSERT_TRUE(PollUntil(
        [&] {
          job = cluster.Get(id);
          return job.has_value() && (job->progress().step() > last_step + 100 ||
                                     job->state() != v1::JOB_STATE_RUNNING);
        },
        absl::Seconds(60)))
        << cluster.Logs();
    ASSERT_EQ(job->state(), v1::JOB_STATE_RUNNING)
        << "the job ended before reset " << reset + 1 << ": " << job->DebugString()
        << cluster.Logs();
    last_step = job->progress().step();
    EXPECT_GT(cluster.proxy()->ResetAll(), 0);
  }

  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(120));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString() << cluster.Logs();
  EXPECT_EQ(job->attempt(), 1) << job->DebugString();
  EXPECT_GT(last_step, 0) << "the connections were never reset mid-job";
  // The resets did break the daemons' assignment streams.
  EXPECT_THAT(cluster.Logs(), ::testing::HasSubstr("assignment stream ended"));

  // Every runner has exited by now; what ran, ran exactly once.
  EXPECT_TRUE(PollUntil([&] { return RunnersUnder(cluster.dir()).empty(); }, absl::Seconds(15)));
  const auto seen = watch.Seen();
  EXPECT_EQ(seen.size(), 2u) << cluster.Logs();
  for (const auto& [launch, pids] : seen) {
    EXPECT_EQ(pids.size(), 1u) << launch << " ran in " << pids.size() << " processes";
    EXPECT_THAT(launch, ::testing::HasSubstr("-attempt-1-process-"));
  }
  EXPECT_EQ(watch.Overlaps(), 0);
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
