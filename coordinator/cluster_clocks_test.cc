// Tests of Cluster: the two clocks. Every duration (finished_job_ttl, max_duration_seconds,
// restart backoff) runs on the lease clock: a step of the wall clock expires nothing, and
// instants loaded from the store are re-based once against the lease clock.
#include "coordinator/cluster.h"

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/cluster_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

// The worker that runs process 0 of the job's attempt.
std::string WorkerOf(const v1::Job& job) { return job.mesh().devices(0).worker_id(); }

TEST_F(ClusterTest, AWallClockJumpMovesNoDurationTheLeaseClocksOwnAdvanceDoes) {
  ASSERT_EQ(options_.finished_job_ttl, absl::Hours(7 * 24));  // the default, under the jump
  options_.restart_backoff = absl::Hours(1);
  options_.max_restart_backoff = absl::Hours(1);
  options_.default_progress_timeout = absl::Hours(10);  // not under test here
  split_clocks_ = true;
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string ended = Submit(Spec("ended", 1));
  ASSERT_TRUE(ReportStatus(ended, 1, WorkerOf(Get(ended)), 0, v1::RUNNER_STATE_SUCCEEDED).ok());
  v1::JobSpec timed_spec = Spec("timed", 1);
  timed_spec.set_max_duration_seconds(3600);
  const std::string timed = Submit(timed_spec);
  const std::string backing = Submit(Spec("backing", 1, 1, /*max_restarts=*/1));
  ASSERT_TRUE(ReportStatus(backing, 1, WorkerOf(Get(backing)), 0, v1::RUNNER_STATE_FAILED).ok());
  ASSERT_EQ(Get(ended).state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(Get(timed).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Get(backing).state(), v1::JOB_STATE_PENDING);

  // The wall clock jumps 8 days ahead (a bad NTP step): the ended job is not past its TTL,
  // the running one not past its max_duration, the backoff not over.
  now_ += absl::Hours(8 * 24);
  RunFor(absl::Seconds(2), {"w-1", "w-2"});
  EXPECT_EQ(Get(ended).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Get(timed).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(backing).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(backing).attempt(), 1);

  // An hour on the lease clock: max_duration and the backoff are over.
  RunFor(absl::Hours(1), {"w-1", "w-2"});
  EXPECT_EQ(Get(timed).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(timed).error(), HasSubstr("max_duration_seconds (3600 s)"));
  EXPECT_EQ(Get(backing).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(backing).attempt(), 2);
  EXPECT_EQ(Get(ended).state(), v1::JOB_STATE_SUCCEEDED);
  // A week after it ended, on the lease clock: the TTL deletes it.
  lease_now_ += absl::Hours(7 * 24) - absl::Minutes(59);
  cluster_->Tick();
  EXPECT_EQ(cluster_->GetJob(ended).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterTest, StoredInstantsAreRebasedOnceAtLoad) {
  options_.finished_job_ttl = absl::Hours(2);
  split_clocks_ = true;
  cluster_ = MakeCluster(state_);
  Register("w-1", "a", 2);
  const std::string ended = Submit(Spec("ended", 1));
  ASSERT_TRUE(ReportStatus(ended, 1, "w-1", 0, v1::RUNNER_STATE_SUCCEEDED).ok());

  // The coordinator restarts an hour later on a machine whose monotonic clock started over.
  now_ += absl::Hours(1);
  cluster_.reset();
  lease_now_ = absl::FromUnixSeconds(7);
  cluster_ = MakeCluster(state_);
  ASSERT_NE(cluster_, nullptr);
  // An hour of its TTL is left, on the lease clock, whatever the wall clock does from now on.
  now_ += absl::Hours(8 * 24);
  lease_now_ += absl::Minutes(59);
  cluster_->Tick();
  EXPECT_EQ(Get(ended).state(), v1::JOB_STATE_SUCCEEDED);
  lease_now_ += absl::Minutes(2);
  cluster_->Tick();
  EXPECT_EQ(cluster_->GetJob(ended).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace substrax
