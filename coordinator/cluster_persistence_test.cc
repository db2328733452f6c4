// Tests of Cluster: a coordinator restart: a new Cluster on the same state store (in memory or
// SQLite) sees what the old one did.
#include "coordinator/cluster.h"

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "coordinator/cluster_test_util.h"
#include "coordinator/state_store.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::SizeIs;

// Runs a cluster's life on `state`, then a second Cluster on the same state must see it all.
void ExpectRestartKeepsEverything(StateStore& state) {
  absl::Time now = absl::FromUnixSeconds(1700000000);
  auto clock = [&now] { return now; };
  std::string running, done, waiting;
  v1::Job done_before;
  v1::QueryMetricsResponse metrics_before;
  {
    auto cluster = Cluster::Create({}, clock, &state);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    Cluster& c = **cluster;
    for (const char* w : {"w-1", "w-2"}) {
      v1::RegisterWorkerRequest request;
      request.set_worker_id(w);
      request.set_host(std::string("host-") + w);
      request.set_incarnation("inc-1");
      request.add_devices()->set_local_index(0);
      request.add_devices()->set_local_index(1);
      ASSERT_TRUE(c.RegisterWorker(request).ok());
    }
    done = c.SubmitJob(Spec("done", 4)).value().id();
    ASSERT_TRUE(c.ReportSteps(Steps(done, 1, 10, {{0, 1.0}, {3, 2.0}})).ok());
    for (int p = 0; p < 2; ++p) {
      v1::ReportAttemptStatusRequest s;
      s.set_job_id(done);
      s.set_attempt(1);
      s.set_worker_id(p == 0 ? "w-1" : "w-2");
      s.set_process_index(p);
      s.set_state(v1::RUNNER_STATE_SUCCEEDED);
      (*s.mutable_final_metrics())["test_loss"] = 0.25;
      ASSERT_TRUE(c.ReportAttemptStatus(s).ok());
    }
    running = c.SubmitJob(Spec("running", 4)).value().id();
    ASSERT_TRUE(c.ReportSteps(Steps(running, 1, 20, {{0, 3.0}, {1, 3.0}, {2, 3.0}, {3, 3.0}})).ok());
    waiting = c.SubmitJob(Spec("waiting", 2)).value().id();
    done_before = c.GetJob(done).value();
    v1::QueryMetricsRequest q;
    q.set_job_id(done);
    q.set_reduction(v1::REDUCTION_NONE);
    metrics_before = c.QueryMetrics(q).value();
  }
  now += absl::Minutes(5);
  auto cluster = Cluster::Create({}, clock, &state);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*c.GetJob(done), done_before))
      << c.GetJob(done)->DebugString() << "\n" << done_before.DebugString();
  EXPECT_EQ(c.GetJob(done)->progress().final_metrics().at("test_loss"), 0.25);
  v1::QueryMetricsRequest q;
  q.set_job_id(done);
  q.set_reduction(v1::REDUCTION_NONE);
  EXPECT_EQ(c.QueryMetrics(q)->SerializeAsString(), metrics_before.SerializeAsString());

  // The running job keeps its devices (its workers got a fresh lease), and its progress.
  EXPECT_EQ(c.GetJob(running)->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(c.GetJob(running)->progress().step(), 20);
  EXPECT_TRUE(c.CheckAttemptRunning(running, 1).ok());
  EXPECT_EQ(c.GetJob(waiting)->state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(c.GetJob(waiting)->transitions().rbegin()->reason(),
              HasSubstr("submitted; waiting for 2 devices; 0 free of 4 in pool cpu"));
  std::vector<v1::Worker> workers = c.ListWorkers();
  ASSERT_THAT(workers, SizeIs(2));
  EXPECT_EQ(workers[0].state(), v1::WORKER_STATE_ALIVE);
  EXPECT_EQ(workers[0].seconds_since_heartbeat(), 0);
  EXPECT_THAT(workers[1].job_ids(), ElementsAre(running));
  // Job numbers keep counting; device ids stay.
  EXPECT_EQ(c.SubmitJob(Spec("next", 1)).value().id(), "next-4");
  EXPECT_TRUE(c.Heartbeat("w-1", "inc-1").ok());

  // Its workers never come back: the lease runs out as usual.
  now += absl::Seconds(11);
  c.Tick();
  EXPECT_EQ(c.GetJob(running)->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(c.GetJob(running)->error(), HasSubstr("missed heartbeats"));
}

TEST(ClusterRestartTest, InMemoryStateSurvivesARestart) {
  InMemoryStateStore state;
  ExpectRestartKeepsEverything(state);
}

TEST(ClusterRestartTest, SqliteStateSurvivesARestart) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/cluster-restart";
  std::filesystem::remove_all(dir);
  auto state = SqliteStateStore::Open(dir);
  ASSERT_TRUE(state.ok()) << state.status();
  ExpectRestartKeepsEverything(**state);
}

TEST(ClusterRestartTest, ARestartQueuesTheStartEventsOfRunningAttemptsAgain) {
  InMemoryStateStore state;
  absl::Time now = absl::FromUnixSeconds(1700000000);
  auto clock = [&now] { return now; };
  std::string job;
  {
    auto cluster = Cluster::Create({}, clock, &state);
    ASSERT_TRUE(cluster.ok());
    v1::RegisterWorkerRequest request;
    request.set_worker_id("w-1");
    request.set_host("a");
    request.set_incarnation("inc-1");
    request.add_devices()->set_local_index(0);
    ASSERT_TRUE((*cluster)->RegisterWorker(request).ok());
    job = (*cluster)->SubmitJob(Spec("again", 1)).value().id();
  }
  auto cluster = Cluster::Create({}, clock, &state);
  ASSERT_TRUE(cluster.ok());
  int64_t cursor = 1;  // the daemon had received the start event from the first run
  auto events = (*cluster)->PollAssignments("w-1", "inc-1", "the-first-run", &cursor);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_THAT(*events, SizeIs(1));
  EXPECT_EQ((*events)[0].start().job_id(), job);
  EXPECT_EQ((*events)[0].start().attempt(), 1);
  EXPECT_EQ((*events)[0].start().mesh().devices_size(), 1);
}

TEST(ClusterRestartTest, AnAcknowledgedSuccessSurvivesARestart) {
  InMemoryStateStore state;
  absl::Time now = absl::FromUnixSeconds(1700000000);
  auto clock = [&now] { return now; };
  std::string job;
  auto success = [&](Cluster& c, int p) {
    v1::ReportAttemptStatusRequest s;
    s.set_job_id(job);
    s.set_attempt(1);
    s.set_worker_id(p == 0 ? "w-1" : "w-2");
    s.set_process_index(p);
    s.set_state(v1::RUNNER_STATE_SUCCEEDED);
    if (p == 0) (*s.mutable_final_metrics())["test_accuracy"] = 0.5;
    return c.ReportAttemptStatus(s);
  };
  {
    auto cluster = Cluster::Create({}, clock, &state);
    ASSERT_TRUE(cluster.ok());
    for (const char* w : {"w-1", "w-2"}) {
      v1::RegisterWorkerRequest request;
      request.set_worker_id(w);
      request.set_host(w);
      request.set_incarnation("inc-1");
      request.add_devices()->set_local_index(0);
      ASSERT_TRUE((*cluster)->RegisterWorker(request).ok());
    }
    job = (*cluster)->SubmitJob(Spec("two", 2)).value().id();
    ASSERT_TRUE(success(**cluster, 0).ok());
  }
  auto cluster = Cluster::Create({}, clock, &state);
  ASSERT_TRUE(cluster.ok());
  EXPECT_EQ((*cluster)->GetJob(job)->state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(success(**cluster, 1).ok());
  const v1::Job done = (*cluster)->GetJob(job).value();
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done.attempt(), 1);
  EXPECT_EQ(done.progress().final_metrics().at("test_accuracy"), 0.5);
}

TEST_F(ClusterTest, RestartLoadsProgressNotHistory) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, step, {{0, 1.0 / step}, {1, 1.0 / step},
                                                         {2, 1.0 / step}, {3, 1.0 / step}}))
                    .ok());
  }
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  const v1::Job loaded = Get(job);
  EXPECT_EQ(loaded.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(loaded.progress().step(), 5);
  EXPECT_EQ(loaded.progress().metrics().at("loss"), 0.2);
}

}  // namespace
}  // namespace substrax
