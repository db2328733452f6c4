// Tests of Cluster: admission to queues at submit, and preemption as the state machine carries
// it out: the victim asked to stop
// (and keeping its devices) while its processes checkpoint, requeued without using a restart,
// the preemptor started on its devices, the deadline, and a coordinator restart in the middle.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/cluster.h"
#include "coordinator/cluster_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;
using ::testing::SizeIs;

v1::SchedulingConfig TwoClasses() {
  v1::SchedulingConfig config = scheduling::DefaultSchedulingConfig();
  config.clear_priority_classes();
  v1::PriorityClass* low = config.add_priority_classes();
  low->set_name("low");
  low->set_value(0);
  v1::PriorityClass* high = config.add_priority_classes();
  high->set_name("high");
  high->set_value(1000);
  config.set_default_priority_class("low");
  config.set_preemption_grace_seconds(20);
  return config;
}

v1::JobSpec WithClass(v1::JobSpec spec, const std::string& priority_class) {
  spec.set_priority_class(priority_class);
  return spec;
}

// The stop events among a worker's events.
std::vector<v1::StopAttempt> Stops(const std::vector<v1::WatchAssignmentsResponse>& events) {
  std::vector<v1::StopAttempt> stops;
  for (const v1::WatchAssignmentsResponse& e : events) {
    if (e.has_stop()) stops.push_back(e.stop());
  }
  return stops;
}

class PreemptionTest : public ClusterTest {
 protected:
  void SetUp() override {
    ClusterTest::SetUp();
    options_.scheduling = TwoClasses();
    options_.restart_backoff = absl::Seconds(30);  // a preemption must not wait for it
    cluster_ = MakeCluster(state_);
    RegisterTwoWorkers();
  }

  // A low-priority job on all 4 devices, then a high-priority one that needs them.
  void PreemptLowForHigh() {
    low_ = Submit(WithClass(Spec("low", 4), "low"));
    ASSERT_EQ(Get(low_).state(), v1::JOB_STATE_RUNNING);
    Poll("w-1");
    Poll("w-2");
    high_ = Submit(WithClass(Spec("high", 4), "high"));
  }

  std::string low_, high_;
};

TEST_F(PreemptionTest, AHigherPriorityJobPreemptsAndTheVictimKeepsItsDevicesUntilItStops) {
  PreemptLowForHigh();
  const v1::Job victim = Get(low_);
  EXPECT_EQ(victim.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(victim.priority_class(), "low");
  EXPECT_EQ(victim.preemption().for_job(), high_);
  EXPECT_THAT(victim.transitions().rbegin()->reason(),
              HasSubstr(absl::StrCat("preempted for job ", high_)));
  EXPECT_THAT(victim.transitions().rbegin()->reason(),
              HasSubstr("asked to checkpoint and stop within 20s"));
  for (const std::string w : {"w-1", "w-2"}) {
    std::vector<v1::StopAttempt> stops = Stops(Poll(w));
    ASSERT_THAT(stops, SizeIs(1)) << w;
    EXPECT_TRUE(stops[0].preempt());
    EXPECT_EQ(stops[0].grace().seconds(), 20);
    EXPECT_EQ(stops[0].attempt(), 1);
  }
  // The preemptor waits for the devices; the victim's attempt still works (its checkpoint).
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_PENDING);
  EXPECT_TRUE(cluster_->CheckAttemptRunning(low_, 1).ok());

  // One process stopped: still waiting for the other.
  ASSERT_TRUE(ReportStatus(low_, 1, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
  EXPECT_EQ(Get(low_).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_PENDING);
  // A stopped process that reports success before its last step has stopped too.
  ASSERT_TRUE(ReportStatus(low_, 1, "w-2", 1, v1::RUNNER_STATE_SUCCEEDED).ok());

  const v1::Job requeued = Get(low_);
  EXPECT_EQ(requeued.state(), v1::JOB_STATE_PENDING);
  EXPECT_FALSE(requeued.has_preemption());
  EXPECT_EQ(requeued.preemptions(), 1);
  EXPECT_FALSE(requeued.has_next_attempt_time());  // no backoff
  EXPECT_THAT(requeued.transitions(requeued.transitions_size() - 1).reason(),
              HasSubstr("its processes stopped"));
  EXPECT_THAT(requeued.transitions(requeued.transitions_size() - 1).reason(),
              HasSubstr("device-seconds of work lost since the attempt started"));
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_RUNNING);

  // When the devices free up, the victim runs again: a preemption used no restart
  // (max_restarts is 0).
  ASSERT_TRUE(ReportStatus(high_, 1, "w-1", 0, v1::RUNNER_STATE_SUCCEEDED).ok());
  ASSERT_TRUE(ReportStatus(high_, 1, "w-2", 1, v1::RUNNER_STATE_SUCCEEDED).ok());
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_SUCCEEDED);
  const v1::Job resumed = Get(low_);
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(resumed.attempt(), 2);
  // Its processes failing now is a failure like any other: no restarts left.
  ASSERT_TRUE(ReportStatus(low_, 2, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
  EXPECT_EQ(Get(low_).state(), v1::JOB_STATE_FAILED);
}

TEST_F(PreemptionTest, ProcessesThatDoNotStopAreGivenUpOnAtTheDeadline) {
  PreemptLowForHigh();
  RunFor(absl::Seconds(20), {"w-1", "w-2"});
  EXPECT_EQ(Get(low_).state(), v1::JOB_STATE_RUNNING);  // grace + heartbeat timeout
  RunFor(absl::Seconds(11), {"w-1", "w-2"});
  const v1::Job requeued = Get(low_);
  EXPECT_EQ(requeued.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(requeued.transitions(requeued.transitions_size() - 1).reason(),
              HasSubstr("did not all stop within the grace"));
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(PreemptionTest, ANonPreemptibleJobIsForAdminsAndNeverPreempted) {
  v1::JobSpec pinned = WithClass(Spec("pinned", 4), "low");
  pinned.set_preemptible(false);
  EXPECT_EQ(cluster_->SubmitJob(pinned, "alice").status().code(),
            absl::StatusCode::kPermissionDenied);
  absl::StatusOr<v1::Job> admin = cluster_->SubmitJob(pinned, "root", /*admin=*/true);
  ASSERT_TRUE(admin.ok()) << admin.status();
  high_ = Submit(WithClass(Spec("high", 4), "high"));
  EXPECT_FALSE(Get(admin->id()).has_preemption());
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_PENDING);
}

TEST_F(PreemptionTest, ARestartedCoordinatorGoesOnWithThePreemption) {
  PreemptLowForHigh();
  Poll("w-1");
  Poll("w-2");
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  Register("w-1", "a", 2);
  Register("w-2", "b", 2);
  const v1::Job victim = Get(low_);
  EXPECT_EQ(victim.state(), v1::JOB_STATE_RUNNING);  // stopped or running, never both
  EXPECT_EQ(victim.preemption().for_job(), high_);
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_PENDING);
  // Its stop events again, for daemons that may not have had them.
  for (const std::string w : {"w-1", "w-2"}) {
    std::vector<v1::StopAttempt> stops = Stops(Poll(w));
    ASSERT_THAT(stops, SizeIs(1)) << w;
    EXPECT_TRUE(stops[0].preempt());
  }
  ASSERT_TRUE(ReportStatus(low_, 1, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
  ASSERT_TRUE(ReportStatus(low_, 1, "w-2", 1, v1::RUNNER_STATE_FAILED).ok());
  EXPECT_EQ(Get(low_).state(), v1::JOB_STATE_PENDING);
  EXPECT_EQ(Get(low_).preemptions(), 1);
  EXPECT_EQ(Get(high_).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(PreemptionTest, SubmitAdmitsToAQueueByOwnerRoleAndQuota) {
  v1::SchedulingConfig config = TwoClasses();
  config.clear_queues();
  v1::QueueConfig* research = config.add_queues();
  research->set_name("research");
  v1::DeviceQuota* quota = research->add_quotas();
  quota->set_backend("cpu");
  quota->set_devices(2);
  research->mutable_submitters()->add_owners("alice");
  research->mutable_submitters()->add_roles("admin");
  config.set_default_queue("research");
  cluster_->SetSchedulingConfig(config);

  v1::JobSpec two = Spec("two", 2);
  absl::StatusOr<v1::Job> alice = cluster_->SubmitJob(two, "alice");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->queue(), "research");
  EXPECT_EQ(alice->priority_class(), "low");
  absl::StatusOr<v1::Job> bob = cluster_->SubmitJob(two, "bob", false, "", {"submitter"});
  EXPECT_EQ(bob.status().code(), absl::StatusCode::kPermissionDenied) << bob.status();
  EXPECT_TRUE(cluster_->SubmitJob(two, "carol", false, "", {"admin"}).ok());
  // More than the queue could ever hold.
  absl::StatusOr<v1::Job> four = cluster_->SubmitJob(Spec("four", 4), "alice");
  EXPECT_EQ(four.status().code(), absl::StatusCode::kResourceExhausted) << four.status();
  EXPECT_THAT(four.status().message(), HasSubstr("research"));
  v1::JobSpec elsewhere = two;
  elsewhere.set_queue("vision");
  absl::StatusOr<v1::Job> unknown = cluster_->SubmitJob(elsewhere, "alice");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument) << unknown.status();
  EXPECT_THAT(unknown.status().message(), HasSubstr("research"));
}

}  // namespace
}  // namespace substrax
