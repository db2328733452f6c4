// Tests of Cluster: registration, leases and heartbeats, incarnations, and the assignment stream
// workers poll.
#include "coordinator/cluster.h"

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

TEST_F(ClusterTest, RegistrationAssignsClusterWideDeviceIds) {
  v1::RegisterWorkerResponse a = Register("w-1", "a", 2);
  v1::RegisterWorkerResponse b = Register("", "b", 3);  // worker_id defaults to the host
  ASSERT_THAT(a.devices(), SizeIs(2));
  ASSERT_THAT(b.devices(), SizeIs(3));
  EXPECT_EQ(a.devices(0).id(), 0);
  EXPECT_EQ(a.devices(1).id(), 1);
  EXPECT_EQ(b.devices(0).id(), 2);
  EXPECT_EQ(b.devices(2).id(), 4);
  EXPECT_EQ(b.devices(1).worker_id(), "b");
  EXPECT_EQ(b.devices(1).host(), "b");
  EXPECT_EQ(b.devices(1).name(), "cpu");
  EXPECT_EQ(a.heartbeat_interval().seconds(), 1);
  EXPECT_EQ(a.heartbeat_timeout().seconds(), 10);

  // A new incarnation of w-1 keeps its ids; a retry with the same incarnation answers the same.
  EXPECT_EQ(Register("w-1", "a", 2, "inc-2").devices(1).id(), 1);
  EXPECT_EQ(Register("w-1", "a", 2, "inc-2").devices(1).id(), 1);
  std::vector<v1::Worker> workers = cluster_->ListWorkers();
  ASSERT_THAT(workers, SizeIs(2));
  EXPECT_EQ(workers[0].worker_id(), "w-1");
  EXPECT_EQ(workers[0].incarnation(), "inc-2");
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(workers[1].address(), "b:7000");
}

TEST_F(ClusterTest, RegistrationRejectsBadRequests) {
  v1::RegisterWorkerRequest request;
  request.set_host("a");
  request.set_incarnation("inc-1");
  EXPECT_EQ(cluster_->RegisterWorker(request).status().code(),
            absl::StatusCode::kInvalidArgument);  // no devices
  request.add_devices()->set_local_index(0);
  request.add_devices()->set_local_index(0);
  auto repeated = cluster_->RegisterWorker(request);
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(repeated.status().message(), HasSubstr("devices[1].local_index"));
  request.mutable_devices(1)->set_local_index(1);
  request.clear_incarnation();
  EXPECT_EQ(cluster_->RegisterWorker(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  request.set_incarnation("inc-1");
  request.clear_host();
  EXPECT_EQ(cluster_->RegisterWorker(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster_->ListWorkers(), IsEmpty());
}

TEST_F(ClusterTest, HeartbeatsKeepTheLease) {
  Register("w-1", "a", 1);
  RunFor(absl::Seconds(60), {"w-1"});
  std::vector<v1::Worker> workers = cluster_->ListWorkers();
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(workers[0].seconds_since_heartbeat(), 0);
  now_ += absl::Seconds(10);  // exactly the timeout: not yet expired
  cluster_->Tick();
  EXPECT_EQ(cluster_->ListWorkers()[0].state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(cluster_->ListWorkers()[0].seconds_since_heartbeat(), 10);

  EXPECT_EQ(cluster_->Heartbeat("nobody", "inc-1").code(), absl::StatusCode::kNotFound);
  absl::Status stale = cluster_->Heartbeat("w-1", "inc-0");
  EXPECT_EQ(stale.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.message(), HasSubstr("stale"));
  int64_t cursor = 0;
  EXPECT_EQ(cluster_->PollAssignments("w-1", "inc-0", &cursor).status().code(),
            absl::StatusCode::kAborted);
}

TEST_F(ClusterTest, ExpiredLeaseFailsTheRunningAttempt) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  Poll("w-1");
  RunFor(absl::Seconds(11), {"w-1"});  // w-2 falls silent

  const v1::Job failed = Get(job);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(),
              HasSubstr("worker w-2 (host b) missed heartbeats for 10s: it died, was preempted "
                        "or lost the network; check its log"));
  EXPECT_THAT(failed.error(), HasSubstr("attempt 1, process 1 (devices 2, 3)"));
  EXPECT_EQ(failed.transitions().rbegin()->reason(), failed.error());
  EXPECT_EQ(cluster_->ListWorkers()[1].state(), v1::WORKER_STATE_DEAD);

  // The survivor is told to stop; the dead worker must re-register.
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-1");
  ASSERT_THAT(events, SizeIs(1));
  EXPECT_EQ(events[0].stop().job_id(), job);
  EXPECT_THAT(events[0].stop().reason(), HasSubstr("missed heartbeats"));
  absl::Status dead = cluster_->Heartbeat("w-2", "inc-1");
  EXPECT_EQ(dead.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(dead.message(), HasSubstr("declared dead"));
  EXPECT_THAT(ended_, ElementsAre(std::make_pair(job, 1)));

  // Re-registering (same process, back from a partition) makes it schedulable again.
  Register("w-2", "b", 2);
  EXPECT_EQ(cluster_->ListWorkers()[1].state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(Get(Submit(Spec("again", 4))).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(ClusterTest, ReRegistrationFailsTheOldIncarnationsAttempts) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  Poll("w-1");
  Register("w-2", "b", 2, "inc-2");
  const v1::Job failed = Get(job);
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), HasSubstr("worker w-2 restarted"));
  EXPECT_THAT(Poll("w-1"), SizeIs(1));  // stop
  EXPECT_EQ(cluster_->Heartbeat("w-2", "inc-1").code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(cluster_->Heartbeat("w-2", "inc-2").ok());
  EXPECT_THAT(Poll("w-2", "inc-2"), IsEmpty());  // a new process starts with a new queue
}

v1::HeartbeatRequest Beat(const std::string& worker,
                          std::vector<std::tuple<std::string, int, int, bool>> runners) {
  v1::HeartbeatRequest request;
  request.set_worker_id(worker);
  request.set_incarnation("inc-1");
  for (const auto& [job, attempt, process, ended] : runners) {
    v1::RunnerRef* r = request.add_runners();
    r->set_job_id(job);
    r->set_attempt(attempt);
    r->set_process_index(process);
    r->set_ended(ended);
  }
  return request;
}

TEST_F(ClusterTest, AStreamResumesAfterItsLastEventAndAnotherEpochStartsOver) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("resume", 4));
  std::string epoch;
  int64_t cursor = 0;
  auto first = cluster_->PollAssignments("w-1", "inc-1", "", &cursor);
  ASSERT_TRUE(first.ok());
  ASSERT_THAT(*first, SizeIs(1));
  EXPECT_EQ((*first)[0].cursor(), 1);
  EXPECT_EQ((*first)[0].epoch(), cluster_->epoch());
  // The same position again: nothing replayed.
  int64_t resumed = (*first)[0].cursor();
  EXPECT_THAT(*cluster_->PollAssignments("w-1", "inc-1", cluster_->epoch(), &resumed), IsEmpty());
  // A position from another coordinator run: everything the queue holds.
  int64_t stale = 7;
  EXPECT_THAT(*cluster_->PollAssignments("w-1", "inc-1", "another-epoch", &stale), SizeIs(1));
  ASSERT_TRUE(cluster_->CancelJob(job, "").ok());
  auto stop = cluster_->PollAssignments("w-1", "inc-1", cluster_->epoch(), &resumed);
  ASSERT_THAT(*stop, SizeIs(1));
  EXPECT_TRUE((*stop)[0].has_stop());
  EXPECT_EQ((*stop)[0].cursor(), 2);
}

TEST_F(ClusterTest, HeartbeatsStopStrayRunnersAndFailAttemptsWhoseRunnerIsMissing) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("reconcile", 4));
  // A runner of an attempt that does not exist, and one of a process w-1 does not run.
  auto answer = cluster_->Heartbeat(
      Beat("w-1", {{job, 1, 0, false}, {job, 7, 0, false}, {job, 1, 1, false}}));
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_THAT(answer->stop(), SizeIs(2));
  EXPECT_EQ(answer->stop(0).attempt(), 7);
  EXPECT_THAT(answer->stop(0).reason(), HasSubstr("has no attempt 7"));
  EXPECT_THAT(answer->stop(1).reason(), HasSubstr("process 1 of attempt 1 is not worker w-1"));
  // Not yet listed by w-2: not missing.
  ASSERT_TRUE(cluster_->Heartbeat(Beat("w-2", {})).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  // Listed as ended (its outcome on the way): not missing either.
  ASSERT_TRUE(cluster_->Heartbeat(Beat("w-1", {{job, 1, 0, true}})).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_RUNNING);
  // Gone without an outcome: the attempt fails and names it.
  ASSERT_TRUE(cluster_->Heartbeat(Beat("w-1", {})).ok());
  EXPECT_EQ(Get(job).state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(Get(job).error(), HasSubstr("the runner of process 0 is missing: worker w-1"));
  // Its runner, should it come back, is told to stop.
  answer = cluster_->Heartbeat(Beat("w-1", {{job, 1, 0, false}}));
  ASSERT_THAT(answer->stop(), SizeIs(1));
  EXPECT_THAT(answer->stop(0).reason(), HasSubstr("has ended"));
}

TEST_F(ClusterTest, RegistrationRefusesDataRootsThatAreNotNormalizedAbsolutePaths) {
  for (const char* bad : {"data", "/data/", "/data/../etc", ""}) {
    v1::RegisterWorkerRequest request;
    request.set_worker_id("w-1");
    request.set_host("a");
    request.set_incarnation("inc-1");
    request.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
    request.add_data_roots(bad);
    absl::StatusOr<v1::RegisterWorkerResponse> response = cluster_->RegisterWorker(request);
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(response.status().message(), HasSubstr("worker w-1: data_roots[0]")) << bad;
  }
}

// A heartbeat of w-1 (incarnation inc-1) that acknowledges the events up to (epoch, cursor).
absl::Status Acknowledge(Cluster& cluster, const std::string& epoch, int64_t cursor) {
  v1::HeartbeatRequest request;
  request.set_worker_id("w-1");
  request.set_incarnation("inc-1");
  request.set_watch_epoch(epoch);
  request.set_watch_cursor(cursor);
  return cluster.Heartbeat(request).status();
}

TEST_F(ClusterTest, AssignmentEventsAreDroppedOnceAcknowledged) {
  Register("w-1", "a", 2);
  // Churn: 100 jobs, each started and cancelled (200 events); the daemon acknowledges as it
  // goes, in its heartbeats.
  int64_t cursor = 0;
  for (int i = 0; i < 100; ++i) {
    const std::string job = Submit(Spec("churn", 2));
    ASSERT_TRUE(cluster_->CancelJob(job, "").ok());
    auto events = cluster_->PollAssignments("w-1", "inc-1", cluster_->epoch(), &cursor);
    ASSERT_TRUE(events.ok());
    ASSERT_THAT(*events, SizeIs(2));
    ASSERT_TRUE(Acknowledge(*cluster_, cluster_->epoch(), cursor).ok());
  }
  EXPECT_EQ(cursor, 200);
  // Nothing acknowledged is kept: from the start of the queue there is nothing left to send.
  int64_t from_start = 0;
  EXPECT_THAT(*cluster_->PollAssignments("w-1", "inc-1", cluster_->epoch(), &from_start),
              IsEmpty());
  EXPECT_EQ(from_start, 200);
  // The queue goes on numbering after what it dropped.
  Submit(Spec("next", 2));
  int64_t resumed = cursor;
  auto next = cluster_->PollAssignments("w-1", "inc-1", cluster_->epoch(), &resumed);
  ASSERT_THAT(*next, SizeIs(1));
  EXPECT_EQ((*next)[0].cursor(), 201);
  // An acknowledgement of another coordinator run, or past the queue, drops nothing it should
  // not: the unacknowledged event is still served from the start.
  ASSERT_TRUE(Acknowledge(*cluster_, "another-epoch", 201).ok());
  int64_t again = 0;
  EXPECT_THAT(*cluster_->PollAssignments("w-1", "inc-1", cluster_->epoch(), &again), SizeIs(1));
  ASSERT_TRUE(Acknowledge(*cluster_, cluster_->epoch(), 1000).ok());
  again = 0;
  EXPECT_THAT(*cluster_->PollAssignments("w-1", "inc-1", cluster_->epoch(), &again), IsEmpty());
}

TEST_F(ClusterTest, DeadWorkersAreForgottenAfterTheirRetention) {
  options_.dead_worker_retention = absl::Minutes(1);
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  RunFor(absl::Seconds(30), {"w-1"});  // w-2 misses heartbeats: dead after 10 s
  ASSERT_THAT(cluster_->ListWorkers(), SizeIs(2));
  EXPECT_EQ(cluster_->ListWorkers()[1].state(), v1::WORKER_STATE_DEAD);
  RunFor(absl::Seconds(40), {"w-1"});  // dead for less than a minute
  EXPECT_THAT(cluster_->ListWorkers(), SizeIs(2));
  RunFor(absl::Seconds(5), {"w-1"});
  ASSERT_THAT(cluster_->ListWorkers(), SizeIs(1));
  EXPECT_EQ(cluster_->ListWorkers()[0].worker_id(), "w-1");
  // Gone from the store too, so a restart does not bring it back.
  absl::StatusOr<StateStore::Snapshot> stored = state_.Load();
  ASSERT_TRUE(stored.ok());
  ASSERT_THAT(stored->workers, SizeIs(1));
  EXPECT_EQ(stored->workers[0].worker_id(), "w-1");
  // Coming back, it registers as a new worker, with new device ids.
  v1::RegisterWorkerResponse back = Register("w-2", "b", 2, "inc-2");
  ASSERT_THAT(back.devices(), SizeIs(2));
  EXPECT_EQ(back.devices(0).id(), 4);
}

TEST_F(ClusterTest, AtTheWorkerLimitTheLongestDeadWorkerMakesRoom) {
  options_.dead_worker_retention = absl::ZeroDuration();  // forgotten only to make room
  options_.max_workers = 20;  // limits::kMaxWorkers in production
  cluster_ = MakeCluster(state_);
  std::vector<std::string> alive;
  for (int i = 0; i < options_.max_workers; ++i) {
    alive.push_back(absl::StrCat("w-", i));
    Register(alive.back(), absl::StrCat("h-", i), 1);
  }
  v1::RegisterWorkerRequest late;
  late.set_worker_id("late");
  late.set_host("h-late");
  late.set_incarnation("inc-1");
  late.add_devices()->set_kind(v1::DEVICE_KIND_CPU);
  absl::StatusOr<v1::RegisterWorkerResponse> refused = cluster_->RegisterWorker(late);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(), HasSubstr("all of them alive"));

  // w-7 dies, then w-3: w-7 has been dead longest.
  alive.erase(std::find(alive.begin(), alive.end(), "w-7"));
  RunFor(absl::Seconds(11), alive);
  alive.erase(std::find(alive.begin(), alive.end(), "w-3"));
  RunFor(absl::Seconds(11), alive);
  ASSERT_TRUE(cluster_->RegisterWorker(late).ok());
  std::vector<std::string> known;
  for (const v1::Worker& w : cluster_->ListWorkers()) known.push_back(w.worker_id());
  EXPECT_EQ(known.size(), static_cast<size_t>(options_.max_workers));
  EXPECT_EQ(std::count(known.begin(), known.end(), "w-7"), 0);
  EXPECT_EQ(std::count(known.begin(), known.end(), "w-3"), 1);
  EXPECT_EQ(known.back(), "late");
}

}  // namespace
}  // namespace substrax
