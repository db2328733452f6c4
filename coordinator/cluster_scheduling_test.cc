// Tests of Cluster: gang scheduling: the queue, placements, assignments, cancelling, the bound
// on active jobs and the version clients wait on.
#include "coordinator/cluster.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/cluster_test_util.h"
#include "coordinator/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

TEST_F(ClusterTest, GangSchedulingIsAllOrNothingAndFifo) {
  RegisterTwoWorkers();
  const std::string small = Submit(Spec("small", 2));
  const std::string big = Submit(Spec("big", 4));
  const std::string later = Submit(Spec("later", 2));
  EXPECT_EQ(Get(small).state(), v1::JOB_STATE_RUNNING);
  // The big job takes no partial devices, and the later small one does not jump the queue.
  const v1::Job waiting = Get(big);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(waiting.mesh().devices(), IsEmpty());
  EXPECT_EQ(waiting.transitions().rbegin()->reason(),
            "submitted; waiting for 4 devices; 2 free of 4 in pool cpu; no reservation: a "
            "running job in pool cpu has no estimate (max_duration_seconds)");
  EXPECT_EQ(Get(later).state(), v1::JOB_STATE_PENDING);
  // Without an estimate it is not backfilled into the 2 free devices.
  EXPECT_THAT(Get(later).transitions().rbegin()->reason(),
              HasSubstr("behind job " + big + ", first in line for pool cpu"));
  EXPECT_THAT(Get(later).transitions().rbegin()->reason(),
              HasSubstr("without an estimate of its duration"));
  EXPECT_THAT(Poll("w-2"), IsEmpty());  // the small job fits on w-1 alone

  ASSERT_TRUE(cluster_->CancelJob(small, "").ok());
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(Get(big).mesh().devices(), SizeIs(4));
  EXPECT_EQ(Get(later).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(later).transitions().rbegin()->reason(),
              HasSubstr("waiting for 2 devices; 0 free of 4 in pool cpu"));

  std::vector<v1::Job> pending = cluster_->ListJobs({v1::JOB_STATE_PENDING});
  ASSERT_THAT(pending, SizeIs(1));
  EXPECT_EQ(pending[0].id(), later);
  std::vector<v1::Job> all = cluster_->ListJobs({});
  ASSERT_THAT(all, SizeIs(3));
  EXPECT_EQ(all[0].id(), later);  // newest first
  EXPECT_EQ(all[2].id(), small);
}

TEST_F(ClusterTest, AYoungerJobWithAnEstimateIsBackfilledWhenItCannotDelayTheHead) {
  RegisterTwoWorkers();
  v1::JobSpec running = Spec("running", 2);
  running.set_max_duration_seconds(600);  // the head's reservation: 10 minutes from now
  const std::string first = Submit(running);
  const std::string big = Submit(Spec("big", 4));
  v1::JobSpec longer = Spec("longer", 2);
  longer.set_max_duration_seconds(3600);
  v1::JobSpec shorter = Spec("shorter", 2);
  shorter.set_max_duration_seconds(300);
  const std::string late = Submit(longer);
  const std::string quick = Submit(shorter);
  EXPECT_EQ(Get(first).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(big).transitions().rbegin()->reason(), HasSubstr("reserved for"));
  // It would still run when the head could start: it waits.
  EXPECT_EQ(Get(late).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(late).transitions().rbegin()->reason(),
              HasSubstr("the reservation of job " + big));
  // It ends before the head could start: it runs now on the idle devices.
  const v1::Job backfilled = Get(quick);
  EXPECT_EQ(backfilled.state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(backfilled.transitions().rbegin()->reason(), HasSubstr("backfilled"));
}

TEST_F(ClusterTest, AJobTheClusterCannotHoldDoesNotBlockTheQueue) {
  const std::string huge = Submit(Spec("huge", 8));
  EXPECT_THAT(Get(huge).transitions().rbegin()->reason(),
              HasSubstr("waiting for 8 devices: no worker is alive"));
  RegisterTwoWorkers();
  EXPECT_THAT(Get(huge).transitions().rbegin()->reason(), HasSubstr("cannot hold the mesh"));
  EXPECT_EQ(Get(Submit(Spec("fits", 4))).state(), v1::JOB_STATE_RUNNING);
  // More workers arrive: the huge job waits until the running one frees its devices.
  Register("w-3", "c", 2);
  Register("w-4", "d", 2);
  EXPECT_EQ(Get(huge).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(huge).transitions().rbegin()->reason(), HasSubstr("4 free of 8 in pool cpu"));
}

TEST_F(ClusterTest, AssignmentsFollowTheProcessIndexRule) {
  // Registered in the order b, a: the mesh and process order follow the cluster's order.
  Register("w-2", "b", 2);
  Register("w-1", "a", 2);
  const std::string job = Submit(Spec("hybrid", 2, 2));
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  const v1::Mesh mesh = Get(job).mesh();
  ASSERT_THAT(mesh.devices(), SizeIs(4));
  EXPECT_THAT(mesh.axis_names(), ElementsAre("data", "model"));

  // Expected: process p is the p-th distinct worker_id in row-major device order.
  std::vector<std::string> order;
  std::map<std::string, std::vector<int>> local;
  for (const v1::Device& d : mesh.devices()) {
    EXPECT_FALSE(d.worker_id().empty());
    EXPECT_EQ(d.name(), "cpu");  // as registered
    if (local[d.worker_id()].empty()) order.push_back(d.worker_id());
    local[d.worker_id()].push_back(d.id());
  }
  ASSERT_THAT(order, SizeIs(2));
  EXPECT_EQ(order[0], "w-2");
  for (int p = 0; p < 2; ++p) {
    std::vector<v1::WatchAssignmentsResponse> events = Poll(order[p]);
    ASSERT_THAT(events, SizeIs(1));
    const v1::Assignment& a = events[0].start();
    EXPECT_EQ(a.job_id(), job);
    EXPECT_EQ(a.attempt(), 1);
    EXPECT_EQ(a.process_index(), p);
    EXPECT_EQ(a.num_processes(), 2);
    EXPECT_EQ(std::vector<int>(a.local_device_ids().begin(), a.local_device_ids().end()),
              local[order[p]]);
    EXPECT_EQ(a.rendezvous_prefix(), job + "/attempt-1");
    EXPECT_EQ(a.spec().name(), "hybrid");
    EXPECT_EQ(a.mesh().SerializeAsString(), mesh.SerializeAsString());
    ASSERT_EQ(a.layouts().count("batch/inputs"), 1u);
    const v1::ShardLayout& batch = a.layouts().at("batch/inputs");
    EXPECT_THAT(batch.global_shape(), ElementsAre(4));  // 2 per device x data axis 2
    EXPECT_EQ(batch.num_replicas(), 2);
  }
  auto mesh_response = cluster_->GetMesh(job);
  ASSERT_TRUE(mesh_response.ok()) << mesh_response.status();
  EXPECT_EQ(mesh_response->layouts().count("batch/inputs"), 1u);
  EXPECT_THAT(cluster_->ListWorkers()[0].job_ids(), ElementsAre(job));
}

TEST_F(ClusterTest, PlacementsRecordHowLongASchedulableJobWaitedForDevices) {
  options_.restart_backoff = absl::Seconds(2);
  cluster_ = MakeCluster(state_);
  const std::string job = Submit(Spec("waits", 4, 1, 1));
  EXPECT_THAT(cluster_->TakePlacements(), IsEmpty());  // no worker yet
  now_ += absl::Seconds(7);
  RegisterTwoWorkers();
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  std::vector<Placement> placed = cluster_->TakePlacements();
  ASSERT_THAT(placed, SizeIs(1));
  EXPECT_EQ(placed[0].job_id, job);
  EXPECT_EQ(placed[0].attempt, 1);
  EXPECT_FALSE(placed[0].restart);
  EXPECT_EQ(placed[0].waited, absl::Seconds(7));  // from its submission
  EXPECT_THAT(cluster_->TakePlacements(), IsEmpty());  // taken once

  // The restart's backoff ends 2 s after the failure; w-2 is gone until 14 s after it: the
  // 12 s between count, the backoff does not.
  ASSERT_TRUE(ReportStatus(job, 1, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
  now_ += absl::Seconds(11);  // w-2's lease expires, w-1 keeps heartbeating
  ASSERT_TRUE(cluster_->Heartbeat("w-1", "inc-1").ok());
  cluster_->Tick();
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_PENDING);
  now_ += absl::Seconds(3);
  Register("w-2", "b", 2, "inc-2");
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  placed = cluster_->TakePlacements();
  ASSERT_THAT(placed, SizeIs(1));
  EXPECT_EQ(placed[0].attempt, 2);
  EXPECT_TRUE(placed[0].restart);
  EXPECT_EQ(placed[0].waited, absl::Seconds(12));
}

TEST_F(ClusterTest, CancelPendingAndRunningJobs) {
  Register("w-1", "a", 2);
  const std::string running = Submit(Spec("running", 2));
  const std::string pending = Submit(Spec("pending", 2));
  Poll("w-1");

  auto cancelled = cluster_->CancelJob(pending, "");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ(cancelled->transitions().rbegin()->reason(), "cancelled by user");
  EXPECT_THAT(Poll("w-1"), IsEmpty());

  cancelled = cluster_->CancelJob(running, "superseded by v2");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
  std::vector<v1::WatchAssignmentsResponse> stop = Poll("w-1");
  ASSERT_THAT(stop, SizeIs(1));
  EXPECT_EQ(stop[0].stop().reason(), "superseded by v2");
  EXPECT_THAT(ended_, ElementsAre(std::make_pair(running, 1)));

  auto again = cluster_->CancelJob(running, "");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("CANCELLED"));
  EXPECT_THAT(again.status().message(), HasSubstr("superseded by v2"));
  EXPECT_EQ(cluster_->CancelJob("nope", "").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->GetMesh(pending).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(cluster_->GetMesh(running).ok());  // the last attempt's mesh stays
}

TEST_F(ClusterTest, ActiveJobsAreBoundedAndEndedOnesMakeRoom) {
  options_.max_active_jobs = 2;
  cluster_ = MakeCluster(state_);
  const std::string a = Submit(Spec("a", 1));
  Submit(Spec("b", 1));
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(Spec("c", 1));
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("--max-active-jobs 2"));
  // Nothing of the refused job was kept, and its number is not skipped.
  EXPECT_THAT(cluster_->ListJobs({}), SizeIs(2));
  ASSERT_TRUE(cluster_->CancelJob(a, "").ok());
  EXPECT_EQ(Submit(Spec("c", 1)), "c-3");
}

TEST_F(ClusterTest, VersionAndAwaitChange) {
  const uint64_t start = cluster_->version();
  // Nothing changes: the wait times out and returns the same version.
  EXPECT_EQ(cluster_->AwaitChange(start, absl::Milliseconds(1)), start);
  // A change made by another thread wakes the waiter (a long timeout it never reaches).
  std::thread submitter([this] { Submit(Spec("train", 1)); });
  const uint64_t seen = cluster_->AwaitChange(start, absl::Seconds(60));
  submitter.join();
  EXPECT_GT(seen, start);
  // Assignment queues count too.
  const uint64_t before = cluster_->version();
  Register("w-1", "a", 1);  // the queued job starts on it
  EXPECT_GT(cluster_->version(), before);
  EXPECT_EQ(Get("train-1").state(), v1::JOB_STATE_RUNNING);
  EXPECT_GT(cluster_->AwaitChange(before, absl::ZeroDuration()), before);
}

}  // namespace
}  // namespace substrax
