// Tests of Cluster: how attempts end: success, failures and their root cause, restarts with
// back-off, elastic restarts, stalls, non-finite losses, the job's maximum duration.
#include "coordinator/cluster.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/cluster_test_util.h"
#include "coordinator/limits.h"
#include "coordinator/state_store.h"
#include "core/job_spec_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

TEST_F(ClusterTest, RunnerFailureEndsTheJobWithTheRootCause) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  Poll("w-1");
  Poll("w-2");
  ASSERT_TRUE(ReportStatus(job, 1, "w-2", 1, v1::RUNNER_STATE_RUNNING).ok());
  ASSERT_TRUE(ReportStatus(job, 1, "w-2", 1, v1::RUNNER_STATE_FAILED).ok());

  const v1::Job failed = Get(job);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("runner of process 1 on worker w-2 (host b) exited with "
                                        "status 1: loss is NaN at step 7; stderr: Traceback: boom"));
  std::vector<v1::WatchAssignmentsResponse> stop = Poll("w-1");
  ASSERT_THAT(stop, SizeIs(1));
  EXPECT_EQ(stop[0].stop().reason(), failed.error());
  EXPECT_THAT(Poll("w-2"), IsEmpty());  // its runner is gone already
  EXPECT_EQ(cluster_->CheckAttemptRunning(job, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReportStatus(job, 1, "w-1", 0, v1::RUNNER_STATE_FAILED).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ReportStatus("nope", 1, "w-1", 0, v1::RUNNER_STATE_FAILED).code(),
            absl::StatusCode::kNotFound);
  // Devices are free again.
  EXPECT_EQ(Get(Submit(Spec("next", 4))).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(ClusterTest, FailedAttemptRestartsUpToMaxRestartsWithEveryTransitionRecorded) {
  options_.restart_backoff = absl::ZeroDuration();  // restart at once
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4, 1, /*max_restarts=*/1));
  ASSERT_TRUE(ReportStatus(job, 1, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
  v1::Job restarted = Get(job);
  EXPECT_EQ(restarted.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(restarted.attempt(), 2);
  EXPECT_TRUE(restarted.error().empty());
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-2");
  ASSERT_THAT(events, SizeIs(3));  // start 1, stop 1, start 2
  EXPECT_EQ(events[1].stop().attempt(), 1);
  EXPECT_EQ(events[2].start().attempt(), 2);
  EXPECT_EQ(events[2].start().rendezvous_prefix(), job + "/attempt-2");
  EXPECT_EQ(cluster_->CheckAttemptRunning(job, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cluster_->CheckAttemptRunning(job, 2).ok());

  ASSERT_TRUE(ReportStatus(job, 2, "w-2", 1, v1::RUNNER_STATE_FAILED).ok());
  const v1::Job failed = Get(job);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("attempt 2, process 1"));
  EXPECT_THAT(States(failed),
              ElementsAre(v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_PENDING,
                          v1::JOB_STATE_RUNNING, v1::JOB_STATE_FAILED));
  const std::vector<int> attempts = {0, 1, 1, 2, 2};
  for (int i = 0; i < failed.transitions_size(); ++i) {
    const v1::JobTransition& t = failed.transitions(i);
    EXPECT_EQ(t.attempt(), attempts[i]) << i;
    EXPECT_FALSE(t.reason().empty()) << i;
    EXPECT_EQ(t.time().seconds(), 1700000000) << i;
    if (i > 0) {
      EXPECT_EQ(t.from(), failed.transitions(i - 1).to()) << i;
    }
  }
  EXPECT_THAT(failed.transitions(1).reason(),
              HasSubstr("scheduled on 4 devices of 2 workers (w-1, w-2)"));
  EXPECT_THAT(failed.transitions(2).reason(), HasSubstr("restarting (restart 1 of 1)"));
  EXPECT_THAT(failed.transitions(4).reason(), HasSubstr("no restarts left"));
  EXPECT_THAT(ended_, ElementsAre(std::make_pair(job, 1), std::make_pair(job, 2)));
}

TEST_F(ClusterTest, ElasticJobRestartsOnTheDevicesLeftAndKeepsItsCheckpoints) {
  options_.restart_backoff = absl::ZeroDuration();
  cluster_ = MakeCluster(state_);
  Register("w-1", "a", 2, "inc-1", {}, {"/ckpt"});
  Register("w-2", "b", 2, "inc-1", {}, {"/ckpt"});
  v1::JobSpec spec = Spec("elastic", 4, 1, /*max_restarts=*/1);
  spec.mutable_mesh()->set_min_data_parallel_size(2);
  spec.mutable_checkpoint()->set_directory("/ckpt/elastic");
  spec.mutable_checkpoint()->set_every_steps(5);
  v1::JobSpec outside = spec;
  outside.mutable_checkpoint()->set_directory("/elsewhere");
  EXPECT_THAT(cluster_->SubmitJob(outside).status().message(),
              HasSubstr("is not under a checkpoint root of any worker (/ckpt)"));
  const std::string job = Submit(spec);
  ASSERT_EQ(Get(job).mesh().devices_size(), 4);

  // Only process 0's worker reports checkpoints, and only of the job's directory.
  v1::ReportCheckpointsRequest report;
  report.set_job_id(job);
  report.set_attempt(1);
  report.mutable_resumed()->set_step(0);
  v1::CheckpointRecord* record = report.mutable_listing()->add_checkpoints();
  record->set_step(5);
  record->set_path("/ckpt/elastic/step-000000000005");
  record->set_mesh("(data=4)");
  EXPECT_EQ(cluster_->ReportCheckpoints(report, "w-2").code(),
            absl::StatusCode::kFailedPrecondition);
  v1::ReportCheckpointsRequest stray = report;
  stray.mutable_listing()->mutable_checkpoints(0)->set_path("/ckpt/other/step-000000000005");
  EXPECT_EQ(cluster_->ReportCheckpoints(stray, "w-1").code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(cluster_->ReportCheckpoints(report, "w-1").ok());
  EXPECT_EQ(Get(job).checkpoints_size(), 1);
  // A first attempt that starts from the beginning is no news.
  EXPECT_THAT(Get(job).transitions().rbegin()->reason(), HasSubstr("scheduled on 4 devices"));

  // w-2 is gone for good: the next attempt runs on w-1's two devices, the global batch kept.
  RunFor(options_.heartbeat_timeout + absl::Seconds(2), {"w-1"});
  const v1::Job restarted = Get(job);
  ASSERT_EQ(restarted.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(restarted.attempt(), 2);
  EXPECT_EQ(restarted.mesh().devices_size(), 2);
  EXPECT_THAT(restarted.transitions().rbegin()->reason(),
              HasSubstr("elastic: data axis 2 of at most 4, the global batch kept"));
  const std::vector<v1::WatchAssignmentsResponse> events = Poll("w-1");
  ASSERT_FALSE(events.empty());
  const v1::Assignment& start = events.back().start();
  EXPECT_EQ(start.attempt(), 2);
  EXPECT_EQ(start.spec().mesh().data_parallel_size(), 2);
  EXPECT_EQ(start.spec().batch().global_batch_size(), 8);
  EXPECT_EQ(start.spec().batch().per_device_batch_size(), 4);
  EXPECT_EQ(Get(job).checkpoints_size(), 1);  // kept across attempts

  report.set_attempt(2);
  report.mutable_resumed()->set_step(5);
  report.mutable_resumed()->set_path("/ckpt/elastic/step-000000000005");
  report.mutable_resumed()->add_skipped("step 10: shard file process-00001.safetensors is damaged");
  report.clear_listing();
  ASSERT_TRUE(cluster_->ReportCheckpoints(report, "w-1").ok());
  EXPECT_EQ(Get(job).resumed_from_step(), 5);
  EXPECT_THAT(Get(job).transitions().rbegin()->reason(),
              HasSubstr("attempt 2 resumed from the checkpoint of step 5 "
                        "(/ckpt/elastic/step-000000000005); skipped step 10: shard file "
                        "process-00001.safetensors is damaged"));
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(ClusterTest, SucceedsWhenEveryProcessHasSucceeded) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  EXPECT_EQ(ReportStatus(job, 1, "w-2", 0, v1::RUNNER_STATE_SUCCEEDED).code(),
            absl::StatusCode::kFailedPrecondition);  // w-2 runs process 1, not 0
  ASSERT_TRUE(ReportStatus(job, 1, "w-1", 0, v1::RUNNER_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(ReportStatus(job, 1, "w-2", 1, v1::RUNNER_STATE_SUCCEEDED).ok());
  const v1::Job done = Get(job);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.progress().final_metrics().at("test_accuracy"), 0.875);
  EXPECT_EQ(done.transitions().rbegin()->reason(), "all 2 processes succeeded");
  EXPECT_THAT(ended_, ElementsAre(std::make_pair(job, 1)));
  EXPECT_THAT(Poll("w-1"), SizeIs(1));  // only its start: no stop after success
  EXPECT_THAT(cluster_->ListWorkers()[0].job_ids(), IsEmpty());
  auto cancel = cluster_->CancelJob(job, "");
  EXPECT_EQ(cancel.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cancel.status().message(), HasSubstr("SUCCEEDED"));
}

TEST_F(ClusterTest, AStalledProcessFailsTheAttemptNamingItsStepAndWorker) {
  RegisterTwoWorkers();
  v1::JobSpec spec = Spec("stall", 4);
  spec.set_progress_timeout_seconds(5);
  const std::string job = Submit(spec);
  // Process 0 (w-1, devices 0 and 1) goes on; process 1 (w-2) stops after step 10.
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 10, {{0, 1.0}, {2, 1.0}})).ok());
  for (int s = 1; s <= 5; ++s) {
    RunFor(absl::Seconds(1), {"w-1", "w-2"});
    ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 10 + s, {{0, 1.0}})).ok());
  }
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  RunFor(absl::Seconds(1), {"w-1", "w-2"});
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).error(),
              HasSubstr("stalled at step 10 on process 1 (worker w-2 (host b)): no new step for 5s"));
}

TEST_F(ClusterTest, ACommandsProgressTimeoutStartsAtItsFirstReport) {
  RegisterTwoCommandWorkers();
  v1::JobSpec spec =
      testing::JobSpecBuilder("cmd").Command("{argv: [/opt/p/train.sh]}").DataParallel(4).Proto();
  spec.set_progress_timeout_seconds(5);
  const std::string job = Submit(spec);
  ASSERT_FALSE(job.empty());
  // Nobody reports: the command may never, and runs on (until it exits, its
  // max_duration_seconds or a cancel).
  RunFor(absl::Seconds(60), {"w-1", "w-2"});
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  // Process 0 reports once; from then on its timeout runs, while process 1 still never reported.
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 3, {{0, 1.0}, {1, 1.0}})).ok());
  RunFor(absl::Seconds(5), {"w-1", "w-2"});
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  RunFor(absl::Seconds(1), {"w-1", "w-2"});
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).error(),
              HasSubstr("stalled at step 3 on process 0 (worker w-1 (host a)): no new step for 5s"));
}

TEST_F(ClusterTest, ANonFiniteLossFailsTheAttemptNamingStepAndDevice) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("nan", 4));
  absl::Status refused =
      cluster_->ReportSteps(Steps(job, 1, 30, {{0, 0.5}, {3, std::nan("")}}));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).error(),
              HasSubstr("the loss is nan at step 30 on device 3 (process 1, worker w-2 (host b))"));
}

TEST_F(ClusterTest, RestartsBackOffExponentiallyAndShowWhen) {
  options_.restart_backoff = absl::Seconds(2);
  options_.max_restart_backoff = absl::Seconds(5);
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("flaky", 4, 1, 3));
  for (int attempt = 1, wait = 2; attempt <= 3; ++attempt, wait = std::min(wait * 2, 5)) {
    ASSERT_EQ(Get(job).attempt(), attempt);
    ASSERT_TRUE(ReportStatus(job, attempt, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
    v1::Job pending = Get(job);
    EXPECT_EQ(pending.state(), v1::JOB_STATE_PENDING);
    EXPECT_EQ(FromProtoTime(pending.next_attempt_time()), now_ + absl::Seconds(wait));
    EXPECT_THAT(pending.transitions().rbegin()->reason(),
                HasSubstr(absl::StrCat("after a backoff of ", wait, "s; waiting for the restart "
                                       "backoff to end")));
    RunFor(absl::Seconds(wait - 1), {"w-1", "w-2"});
    EXPECT_EQ(Get(job).state(), v1::JOB_STATE_PENDING) << "restart " << attempt;
    RunFor(absl::Seconds(1), {"w-1", "w-2"});
    EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING) << "restart " << attempt;
    EXPECT_FALSE(Get(job).has_next_attempt_time());
  }
}

TEST_F(ClusterTest, ErrorsThatRetryingCannotFixFailTheJobAtOnce) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("missing-data", 4, 1, 5));
  v1::ReportAttemptStatusRequest request;
  request.set_job_id(job);
  request.set_attempt(1);
  request.set_worker_id("w-1");
  request.set_process_index(0);
  request.set_state(v1::RUNNER_STATE_FAILED);
  request.set_exit_code(1);
  request.set_error("/data/train.csv: No such file or directory");
  request.set_error_code(static_cast<int>(absl::StatusCode::kNotFound));
  ASSERT_TRUE(cluster_->ReportAttemptStatus(request).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(Get(job).attempt(), 1);
  EXPECT_THAT(Get(job).transitions().rbegin()->reason(),
              HasSubstr("No such file or directory; not restarted: retrying cannot help"));
}

TEST_F(ClusterTest, MaxDurationEndsTheJobWhateverItsRestarts) {
  RegisterTwoWorkers();
  v1::JobSpec spec = Spec("deadline", 4, 1, 5);
  spec.set_max_duration_seconds(10);
  const std::string job = Submit(spec);
  RunFor(absl::Seconds(10), {"w-1", "w-2"});
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 5, {{0, 1.0}, {2, 1.0}})).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  RunFor(absl::Seconds(1), {"w-1", "w-2"});
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).error(), HasSubstr("longer than its max_duration_seconds (10 s)"));
  EXPECT_THAT(Poll("w-2").back().stop().reason(), HasSubstr("max_duration_seconds"));
}

TEST_F(ClusterTest, ErrorTextAndTransitionsAreBounded) {
  options_.restart_backoff = absl::ZeroDuration();
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4, 1, /*max_restarts=*/100));
  for (int attempt = 1; attempt <= 40; ++attempt) {
    v1::ReportAttemptStatusRequest failed;
    failed.set_job_id(job);
    failed.set_attempt(attempt);
    failed.set_worker_id("w-1");
    failed.set_state(v1::RUNNER_STATE_FAILED);
    failed.set_exit_code(1);
    failed.set_stderr_tail(std::string(100000, 'x'));
    ASSERT_TRUE(cluster_->ReportAttemptStatus(failed).ok()) << attempt;
    cluster_->Tick();  // restarts at once
  }
  const v1::Job j = Get(job);
  EXPECT_LE(j.transitions_size(), limits::kMaxTransitionsKept);
  EXPECT_EQ(j.transitions(0).reason(), "submitted");
  EXPECT_LT(j.ByteSizeLong(), 400000u);
  // The newest failure (before its restart): the stderr tail cut, saying how much.
  EXPECT_THAT(j.transitions(j.transitions_size() - 2).reason(), HasSubstr("more bytes)"));
}

}  // namespace
}  // namespace substrax
