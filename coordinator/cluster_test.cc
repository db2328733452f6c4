#include "coordinator/cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "coordinator/limits.h"
#include "core/job_spec.h"
#include "rpc/proto_time.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr char kSpecYaml[] = R"yaml(
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: NAME}
spec:
  model: {type: mlp, hidden_sizes: [8], num_classes: 2}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 64, num_features: 4, num_outputs: 2}
  optimizer: {type: sgd, learning_rate: 0.1}
  mesh: MESH
  batch: {per_device_batch_size: 2}
  steps: 10
  max_restarts: RESTARTS
)yaml";

// A data-parallel job of `dp` devices, or a hybrid one when mp > 1.
v1::JobSpec Spec(const std::string& name, int dp, int mp = 1, int max_restarts = 0) {
  const std::string mesh =
      mp > 1 ? absl::StrCat("{type: hybrid, data_parallel_size: ", dp,
                            ", model_parallel_size: ", mp, "}")
             : absl::StrCat("{data_parallel_size: ", dp, "}");
  const std::string yaml = absl::StrReplaceAll(
      kSpecYaml, {{"NAME", name}, {"MESH", mesh}, {"RESTARTS", absl::StrCat(max_restarts)}});
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override { cluster_ = MakeCluster(state_); }

  std::unique_ptr<Cluster> MakeCluster(StateStore& state) {
    auto cluster = Cluster::Create(options_, [this] { return now_; }, &state);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (!cluster.ok()) return nullptr;
    (*cluster)->SetAttemptEndedCallback(
        [this](const std::string& job, int attempt) { ended_.push_back({job, attempt}); });
    return *std::move(cluster);
  }

  v1::RegisterWorkerResponse Register(const std::string& worker_id, const std::string& host,
                                      int num_devices, const std::string& incarnation = "inc-1",
                                      const std::vector<std::string>& data_roots = {},
                                      const std::vector<std::string>& checkpoint_roots = {}) {
    v1::RegisterWorkerRequest request;
    for (const std::string& root : checkpoint_roots) request.add_checkpoint_roots(root);
    request.set_worker_id(worker_id);
    request.set_host(host);
    request.set_incarnation(incarnation);
    request.set_address(host + ":7000");
    for (const std::string& root : data_roots) request.add_data_roots(root);
    for (int i = 0; i < num_devices; ++i) {
      v1::Device* d = request.add_devices();
      d->set_local_index(i);
      d->set_kind(v1::DEVICE_KIND_CPU);
      d->set_name("cpu");
    }
    auto response = cluster_->RegisterWorker(request);
    EXPECT_TRUE(response.ok()) << response.status();
    cursors_.erase(worker_id);
    return response.ok() ? *response : v1::RegisterWorkerResponse{};
  }

  // Two workers with two devices each: w-1 on host a (devices 0, 1), w-2 on host b (2, 3).
  void RegisterTwoWorkers() {
    Register("w-1", "a", 2);
    Register("w-2", "b", 2);
  }

  // The events of `worker_id` since the last Poll.
  std::vector<v1::WatchAssignmentsResponse> Poll(const std::string& worker_id,
                                                 const std::string& incarnation = "inc-1") {
    auto events = cluster_->PollAssignments(worker_id, incarnation, &cursors_[worker_id]);
    EXPECT_TRUE(events.ok()) << events.status();
    return events.ok() ? *events : std::vector<v1::WatchAssignmentsResponse>{};
  }

  std::string Submit(const v1::JobSpec& spec) {
    auto job = cluster_->SubmitJob(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->id() : "";
  }

  v1::Job Get(const std::string& job_id) {
    auto job = cluster_->GetJob(job_id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job{};
  }

  absl::Status ReportStatus(const std::string& job_id, int attempt, const std::string& worker,
                            int process, v1::RunnerState state) {
    v1::ReportAttemptStatusRequest request;
    request.set_job_id(job_id);
    request.set_attempt(attempt);
    request.set_worker_id(worker);
    request.set_process_index(process);
    request.set_state(state);
    request.set_exit_code(state == v1::RUNNER_STATE_FAILED ? 1 : 0);
    if (state == v1::RUNNER_STATE_FAILED) {
      request.set_error("loss is NaN at step 7");
      request.set_stderr_tail("Traceback: boom");
    }
    if (process == 0) (*request.mutable_final_metrics())["test_accuracy"] = 0.875;
    return cluster_->ReportAttemptStatus(request);
  }

  // Heartbeats every worker in `alive` every second for `d`, then ticks.
  void RunFor(absl::Duration d, const std::vector<std::string>& alive) {
    for (absl::Duration t; t < d; t += absl::Seconds(1)) {
      now_ += absl::Seconds(1);
      for (const std::string& w : alive) EXPECT_TRUE(cluster_->Heartbeat(w, "inc-1").ok()) << w;
      cluster_->Tick();
    }
  }

  std::vector<v1::JobState> States(const v1::Job& job) {
    std::vector<v1::JobState> states;
    for (const auto& t : job.transitions()) states.push_back(t.to());
    return states;
  }

  // Most tests see jobs wait for workers that come later, so the submit policy queues jobs the
  // alive workers cannot hold; SubmitRefusesWhatTheAliveWorkersCouldNeverHold turns it back on.
  ClusterOptions options_ = [] {
    ClusterOptions options;
    options.refuse_jobs_that_cannot_fit = false;
    return options;
  }();
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  InMemoryStateStore state_;
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, int64_t> cursors_;
  std::vector<std::pair<std::string, int>> ended_;
};

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
            "submitted; waiting for 4 free devices; 2 free on 2 alive workers");
  EXPECT_EQ(Get(later).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(later).transitions().rbegin()->reason(), HasSubstr("behind job " + big));
  EXPECT_THAT(Poll("w-2"), IsEmpty());  // the small job fits on w-1 alone

  ASSERT_TRUE(cluster_->CancelJob(small, "").ok());
  EXPECT_EQ(Get(big).state(), v1::JOB_STATE_RUNNING);
  EXPECT_THAT(Get(big).mesh().devices(), SizeIs(4));
  EXPECT_EQ(Get(later).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(later).transitions().rbegin()->reason(),
              HasSubstr("waiting for 2 free devices; 0 free on 2 alive workers"));

  std::vector<v1::Job> pending = cluster_->ListJobs({v1::JOB_STATE_PENDING});
  ASSERT_THAT(pending, SizeIs(1));
  EXPECT_EQ(pending[0].id(), later);
  std::vector<v1::Job> all = cluster_->ListJobs({});
  ASSERT_THAT(all, SizeIs(3));
  EXPECT_EQ(all[0].id(), later);  // newest first
  EXPECT_EQ(all[2].id(), small);
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
  EXPECT_THAT(Get(huge).transitions().rbegin()->reason(), HasSubstr("4 free on 4 alive workers"));
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

v1::ReportStepsRequest Steps(const std::string& job, int attempt, int64_t step,
                             const std::vector<std::pair<int, double>>& losses) {
  v1::ReportStepsRequest request;
  request.set_job_id(job);
  request.set_attempt(attempt);
  for (const auto& [device, loss] : losses) {
    v1::StepReport* r = request.add_reports();
    r->set_step(step);
    r->set_device_id(device);
    (*r->mutable_values())["loss"] = loss;
    (*r->mutable_values())["step"] = static_cast<double>(step);
    r->set_samples_per_second(100);
  }
  return request;
}

TEST_F(ClusterTest, ReportsFeedProgressAndQueries) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  const uint64_t before = cluster_->version();
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 5, {{0, 1.0}, {1, 2.0}, {2, 3.0}, {3, 4.0}}))
                  .ok());
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 10, {{0, 0.5}, {2, 1.5}})).ok());
  EXPECT_GT(cluster_->version(), before);

  const v1::JobProgress progress = Get(job).progress();
  EXPECT_EQ(progress.step(), 10);
  EXPECT_EQ(progress.total_steps(), 10);
  EXPECT_EQ(progress.metrics().at("loss"), 1.0);  // mean of the two devices that reported
  EXPECT_EQ(progress.metrics().at("step"), 10);
  // Every device's latest rate: devices 0 and 2 at step 10, devices 1 and 3 at step 5.
  EXPECT_EQ(progress.samples_per_second(), 400);

  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  query.set_group_by(v1::GROUP_BY_HOST);
  auto response = cluster_->QueryMetrics(query);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_THAT(response->series(), SizeIs(2));
  EXPECT_EQ(response->series(1).group(), "b");  // host set from the mesh
  EXPECT_EQ(response->series(1).points(1).value(), 1.5);
  EXPECT_EQ(response->series(1).points(1).num_values(), 1);

  absl::Status outside = cluster_->ReportSteps(Steps(job, 1, 15, {{9, 1.0}}));
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("device 9"));
  EXPECT_EQ(cluster_->ReportSteps(Steps(job, 2, 15, {{0, 1.0}})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cluster_->ReportSteps(Steps("nope", 1, 15, {{0, 1.0}})).code(),
            absl::StatusCode::kNotFound);
  query.set_job_id("nope");
  EXPECT_EQ(cluster_->QueryMetrics(query).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(ClusterTest, SubmitRefusesWhatTheAliveWorkersCouldNeverHold) {
  options_.refuse_jobs_that_cannot_fit = true;
  cluster_ = MakeCluster(state_);
  auto nobody = cluster_->SubmitJob(Spec("early", 2));
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(nobody.status().message(), HasSubstr("the cluster has 0 alive workers"));
  RegisterTwoWorkers();
  auto huge = cluster_->SubmitJob(Spec("huge", 8));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(),
              HasSubstr("spec.mesh: data-parallel mesh of 8 devices, but only 4 are available"));
  EXPECT_THAT(huge.status().message(), HasSubstr("the cluster has 2 alive workers"));
  v1::JobSpec checkpointed = Spec("checkpointed", 2);
  checkpointed.mutable_checkpoint()->set_directory("/tmp/ckpt");
  checkpointed.mutable_checkpoint()->set_every_steps(5);
  // No worker offers a checkpoint root.
  EXPECT_EQ(cluster_->SubmitJob(checkpointed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster_->SubmitJob(checkpointed).status().message(),
              HasSubstr("spec.checkpoint.directory: '/tmp/ckpt' is not under a checkpoint root: "
                        "no worker has reported any checkpoint root"));
  EXPECT_THAT(cluster_->ListJobs({}), IsEmpty());
  // Fits, though busy: admitted, and waits.
  EXPECT_EQ(Get(Submit(Spec("first", 4))).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(Submit(Spec("second", 4))).state(), v1::JOB_STATE_PENDING);
}

TEST_F(ClusterTest, BadSpecIsRejectedWithTheFieldAndTheClusterStillWorks) {
  Register("w-1", "a", 2);
  v1::JobSpec bad = Spec("bad", 2);
  bad.mutable_mesh()->set_data_parallel_size(0);
  bad.mutable_optimizer()->set_learning_rate(-1);
  auto rejected = cluster_->SubmitJob(bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(), HasSubstr("spec.optimizer.learning_rate"));
  EXPECT_THAT(cluster_->ListJobs({}), IsEmpty());
  const std::string good = Submit(Spec("good", 2));
  EXPECT_EQ(good, "good-1");
  EXPECT_EQ(Get(good).state(), v1::JOB_STATE_RUNNING);
}

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
    ASSERT_TRUE(c.ReportSteps(Steps(running, 1, 20, {{1, 3.0}})).ok());
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
              HasSubstr("submitted; waiting for 2 free devices"));
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

namespace substrax {
namespace {

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

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

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

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

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

// --- retention, limits, what runners report about the data -----------------------------------

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

TEST_F(ClusterTest, DeleteJobRemovesAnEndedJobAndItsPoints) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 5, {{0, 1.0}})).ok());
  absl::Status running = cluster_->DeleteJob(job);
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(running.message(), HasSubstr("cancel it first"));
  ASSERT_TRUE(cluster_->CancelJob(job, "").ok());
  ASSERT_TRUE(cluster_->DeleteJob(job).ok());
  EXPECT_EQ(cluster_->GetJob(job).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->DeleteJob(job).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*state_.CountReports(), 0);
  EXPECT_TRUE(state_.Load()->jobs.empty());
}

TEST_F(ClusterTest, EndedJobsExpireByAgeAndCount) {
  options_.max_finished_jobs = 2;
  options_.finished_job_ttl = absl::Hours(1);
  cluster_ = MakeCluster(state_);
  std::vector<std::string> ids;
  for (const char* name : {"a", "b", "c"}) {
    ids.push_back(Submit(Spec(name, 1)));
    ASSERT_TRUE(cluster_->CancelJob(ids.back(), "").ok());
    now_ += absl::Minutes(1);
  }
  cluster_->Tick();
  // Three ended, two kept: the oldest went.
  EXPECT_EQ(cluster_->GetJob(ids[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cluster_->GetJob(ids[1]).ok());
  EXPECT_EQ(state_.Load()->jobs.size(), 2u);
  now_ += absl::Hours(1);
  cluster_->Tick();
  EXPECT_THAT(cluster_->ListJobs({}), IsEmpty());
  EXPECT_TRUE(state_.Load()->jobs.empty());
}

TEST_F(ClusterTest, MetricHistoryIsPrunedToAWindowAndAStride) {
  options_.metrics_raw_steps = 100;
  options_.metrics_history_every = 50;
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 1));
  for (int64_t step = 10; step <= 400; step += 10) {
    ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, step, {{0, 1.0}})).ok());
  }
  auto kept = state_.ReadReports(job, 1);
  ASSERT_TRUE(kept.ok());
  std::set<int64_t> steps;
  for (const auto& r : *kept) steps.insert(r.step());
  // Prunes run every quarter window (26 steps of growth), the last at step 380: from 280 on
  // every point stays; well before, only the multiples of 50.
  for (int64_t step = 10; step < 250; step += 10) {
    EXPECT_EQ(steps.count(step), step % 50 == 0 ? 1u : 0u) << step;
  }
  for (int64_t step = 280; step <= 400; step += 10) EXPECT_EQ(steps.count(step), 1u) << step;
  // The query reads the same history.
  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  auto series = cluster_->QueryMetrics(query);
  ASSERT_TRUE(series.ok()) << series.status();
  EXPECT_EQ(series->series(0).points_size(), static_cast<int>(steps.size()));
}

TEST_F(ClusterTest, QueriesReadEarlierAttemptsFromTheStore) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4, 1, /*max_restarts=*/1));
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 5, {{0, 9.0}})).ok());
  ASSERT_TRUE(ReportStatus(job, 1, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
  RunFor(absl::Seconds(5), {"w-1", "w-2"});  // past the restart backoff
  ASSERT_EQ(Get(job).attempt(), 2);
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 2, 5, {{0, 1.0}})).ok());
  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  EXPECT_EQ(cluster_->QueryMetrics(query)->series(0).points(0).value(), 1.0);
  query.set_attempt(1);
  auto first = cluster_->QueryMetrics(query);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->attempt(), 1);
  EXPECT_EQ(first->series(0).points(0).value(), 9.0);
  query.set_attempt(3);
  EXPECT_THAT(cluster_->QueryMetrics(query).status().message(),
              HasSubstr("attempts with metrics: 1, 2"));
}

TEST_F(ClusterTest, RestartLoadsProgressNotHistory) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, step, {{0, 1.0 / step}})).ok());
  }
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  const v1::Job loaded = Get(job);
  EXPECT_EQ(loaded.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(loaded.progress().step(), 5);
  EXPECT_EQ(loaded.progress().metrics().at("loss"), 0.2);
}

TEST_F(ClusterTest, RunnersSayTheTotalStepsAndInputWidth) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  Register("w-1", "a", 2, "inc-1", {dir});
  Register("w-2", "b", 2);
  v1::JobSpec spec = Spec("files", 4);
  spec.mutable_data()->clear_synthetic();
  spec.mutable_data()->set_format(v1::DATA_FORMAT_IDX);
  // A FIFO nobody writes: opening it would block the coordinator forever, so this test would
  // time out if submit, progress or GetMesh read the data.
  const std::string fifo = dir + "/no-writer.fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  spec.mutable_data()->mutable_train()->set_images(fifo);
  spec.mutable_data()->mutable_train()->set_labels(fifo);
  spec.set_epochs(2);
  absl::StatusOr<v1::Job> submitted = cluster_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job = submitted->id();
  EXPECT_EQ(Get(job).progress().total_steps(), 0);
  v1::ReportStepsRequest steps = Steps(job, 1, 1, {{0, 1.0}});
  steps.mutable_reports(0)->set_total_steps(500);
  steps.mutable_reports(0)->set_input_features(784);
  ASSERT_TRUE(cluster_->ReportSteps(steps).ok());
  EXPECT_EQ(Get(job).progress().total_steps(), 500);
  EXPECT_EQ(Get(job).input_features(), 784);
  auto mesh = cluster_->GetMesh(job);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_GT(mesh->layouts().count("dense_0/kernel"), 0u);
  EXPECT_EQ(state_.Load()->jobs[0].input_features(), 784);  // stored with the job
}

TEST_F(ClusterTest, DataPathsMustLieUnderAKnownWorkersDataRoot) {
  v1::JobSpec spec = Spec("files", 2);
  spec.mutable_data()->clear_synthetic();
  spec.mutable_data()->set_format(v1::DATA_FORMAT_CSV);
  spec.mutable_data()->mutable_csv()->set_label_column("y");
  spec.mutable_data()->mutable_train()->set_path("/proc/self/environ");
  spec.set_epochs(1);
  Register("w-1", "a", 2);
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.data.train.path: '/proc/self/environ' is not under a data root: no "
                        "worker has reported any data root"));

  Register("w-2", "b", 2, "inc-1", {"/data/sets", "/srv"});
  refused = cluster_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("'/proc/self/environ' is not under a data root of any worker (/data/sets, "
                        "/srv)"));
  for (const char* bad : {"/data/sets/../../etc/passwd", "/data/setsx/a.csv", "sets/a.csv",
                          "/data/sets//a.csv"}) {
    spec.mutable_data()->mutable_train()->set_path(bad);
    refused = cluster_->SubmitJob(spec);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("spec.data.train.path")) << bad;
  }
  spec.mutable_data()->mutable_train()->set_path("/data/sets/iris.csv");
  EXPECT_TRUE(cluster_->SubmitJob(spec).ok());

  // The roots are kept with the worker: after a coordinator restart, and while it is dead (a
  // job then waits for workers instead of being refused for its mesh).
  cluster_.reset();
  options_.refuse_jobs_that_cannot_fit = false;
  cluster_ = MakeCluster(state_);
  const std::vector<v1::Worker> workers = cluster_->ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[1].data_roots_size(), 2);
  EXPECT_EQ(workers[1].data_roots(0), "/data/sets");
  now_ += absl::Minutes(1);
  cluster_->Tick();
  ASSERT_EQ(cluster_->ListWorkers()[1].state(), v1::WORKER_STATE_DEAD);
  EXPECT_TRUE(cluster_->SubmitJob(spec).ok());
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

// A program job (spec.program) of `dp` data-parallel devices; `batch` 0: none.
v1::JobSpec ProgramSpec(const std::string& name, int dp, const std::string& path,
                        int batch = 0) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(absl::StrCat(
      "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: ", name, "}\nspec:\n",
      "  program: {path: ", path, ", args: [--fast]}\n  mesh: {data_parallel_size: ", dp, "}\n",
      batch > 0 ? absl::StrCat("  batch: {global_batch_size: ", batch, "}\n") : ""));
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

// Registers a worker of `num_devices` devices of `kind` with `programs_dirs`.
absl::StatusOr<v1::RegisterWorkerResponse> RegisterWithPrograms(
    Cluster& cluster, const std::string& worker_id, const std::string& host, int num_devices,
    v1::DeviceKind kind, const std::vector<std::string>& programs_dirs) {
  v1::RegisterWorkerRequest request;
  request.set_worker_id(worker_id);
  request.set_host(host);
  request.set_incarnation("inc-1");
  request.set_address(host + ":7000");
  for (const std::string& dir : programs_dirs) request.add_programs_dirs(dir);
  for (int i = 0; i < num_devices; ++i) {
    v1::Device* d = request.add_devices();
    d->set_local_index(i);
    d->set_kind(kind);
    d->set_name(kind == v1::DEVICE_KIND_CUDA ? "NVIDIA H200" : "cpu");
  }
  return cluster.RegisterWorker(request);
}

TEST_F(ClusterTest, ProgramPathsMustLieUnderAKnownWorkersProgramsDir) {
  const v1::JobSpec spec = ProgramSpec("prog", 2, "/opt/p/train");
  // Like data and checkpoint roots: with no worker reporting one, every program is refused.
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.program.path: '/opt/p/train' is not under a programs dir: no "
                        "worker has reported any programs dir (start the worker daemons with "
                        "--programs-dir DIR)"));
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CPU,
                                   {"/opt/p", "/srv/bin"})
                  .ok());
  Register("w-2", "b", 2);
  refused = cluster_->SubmitJob(ProgramSpec("prog", 2, "/opt/px/train"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.program.path: '/opt/px/train' is not under a programs dir of any "
                        "worker (/opt/p, /srv/bin); use a directory there or start a worker "
                        "with --programs-dir"));
  const std::string id = Submit(spec);
  ASSERT_FALSE(id.empty());
  // Scheduled without a model: the assignment carries the program and no layout (no batch).
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-1");
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].has_start());
  EXPECT_EQ(events[0].start().spec().program().path(), "/opt/p/train");
  EXPECT_TRUE(events[0].start().layouts().empty());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(id).progress().total_steps(), 0);  // the runners say it
  absl::StatusOr<v1::GetMeshResponse> mesh = cluster_->GetMesh(id);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_TRUE(mesh->layouts().empty());

  // Kept with the worker, reported by ListWorkers, and across a coordinator restart.
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  const std::vector<v1::Worker> workers = cluster_->ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_THAT(workers[0].programs_dirs(), ::testing::ElementsAre("/opt/p", "/srv/bin"));
  EXPECT_TRUE(workers[1].programs_dirs().empty());
}

TEST_F(ClusterTest, ProgramJobsRunOnCpuDevicesOnlyWithTheirBatchLayout) {
  ASSERT_TRUE(
      RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CUDA, {"/opt/p"}).ok());
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-2", "b", 2, v1::DEVICE_KIND_CPU, {"/opt/p"}).ok());
  // backend auto: a built-in job would take the GPUs; a program job takes the CPU devices.
  const std::string id = Submit(ProgramSpec("prog", 2, "/opt/p/train", /*batch=*/8));
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(Poll("w-1").empty());
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-2");
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].has_start());
  const v1::Assignment& a = events[0].start();
  for (const v1::Device& d : a.mesh().devices()) EXPECT_EQ(d.kind(), v1::DEVICE_KIND_CPU);
  ASSERT_EQ(a.layouts().count("batch/inputs"), 1u);
  EXPECT_EQ(a.spec().batch().per_device_batch_size(), 4);

  // A program job larger than the CPU devices is refused when refusing is on, though GPUs idle.
  cluster_.reset();
  options_.refuse_jobs_that_cannot_fit = true;
  cluster_ = MakeCluster(state_);
  ASSERT_TRUE(
      RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CUDA, {"/opt/p"}).ok());
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-2", "b", 2, v1::DEVICE_KIND_CPU, {"/opt/p"}).ok());
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(ProgramSpec("big", 4, "/opt/p/train"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
}

TEST_F(ClusterTest, RegistrationRefusesProgramsDirsThatAreNotNormalizedAbsolutePaths) {
  for (const char* bad : {"bin", "/opt/p/", "/opt/../p", ""}) {
    absl::StatusOr<v1::RegisterWorkerResponse> response =
        RegisterWithPrograms(*cluster_, "w-1", "a", 1, v1::DEVICE_KIND_CPU, {bad});
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(response.status().message(), HasSubstr("worker w-1: programs_dirs[0]")) << bad;
  }
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

namespace substrax {
namespace {

v1::ShipLogsRequest Piece(const std::string& job, const std::string& worker, int process,
                          int64_t offset, const std::string& data, bool eof = false) {
  v1::ShipLogsRequest request;
  request.set_job_id(job);
  request.set_attempt(1);
  request.set_worker_id(worker);
  request.set_process_index(process);
  request.set_host(worker == "w-1" ? "a" : "b");
  request.set_offset(offset);
  request.set_data(data);
  request.set_eof(eof);
  return request;
}

TEST_F(ClusterTest, ShipLogsStoresEachByteOnceAndNamesTheOffsetAfterAGap) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));  // process 0 on w-1, 1 on w-2
  absl::StatusOr<int64_t> next = cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\n"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 4);
  // A retry, and one that overlaps: only the new bytes are stored.
  EXPECT_EQ(*cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\n")), 4);
  EXPECT_EQ(*cluster_->ShipLogs(Piece(job, "w-1", 0, 2, "e\ntwo\n")), 8);
  absl::StatusOr<int64_t> gap = cluster_->ShipLogs(Piece(job, "w-1", 0, 20, "x"));
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gap.status().message(), HasSubstr("expected offset 8"));
  std::vector<LogChunk> chunks = *state_.ReadLogChunks(job, 1, 0, 0, 1 << 20);
  std::string stored;
  for (const LogChunk& c : chunks) stored += c.data;
  EXPECT_EQ(stored, "one\ntwo\n");
  EXPECT_EQ(chunks[0].host, "a");

  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-2", 0, 8, "not mine\n")).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(cluster_->ShipLogs(Piece(job, "w-2", 1, 0, "mine\n")).ok());
  v1::ShipLogsRequest later = Piece(job, "w-1", 0, 8, "x\n");
  later.set_attempt(2);
  EXPECT_EQ(cluster_->ShipLogs(later).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->ShipLogs(Piece("nope-9", "w-1", 0, 0, "x\n")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-1", 0, 8, std::string(64 * 1024 + 1, 'x')))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-1", -1, 8, "x\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClusterTest, LogsArriveAfterTheAttemptEndedAndGoWithTheJob) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "start\n")).ok());
  ASSERT_TRUE(cluster_->CancelJob(job, "").ok());
  // The runner exited after the cancel: its last bytes and its end still come in.
  ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, 6, "stopping\n", /*eof=*/true)).ok());
  std::vector<LogExtent> extents = *state_.LogExtents(job, 1);
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_EQ(extents[0].end, 15);
  EXPECT_TRUE(extents[0].eof);
  ASSERT_TRUE(cluster_->DeleteJob(job).ok());
  EXPECT_TRUE(state_.LogExtents(job, 1)->empty());
  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-1", 0, 15, "late\n")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClusterTest, ARestartedCoordinatorContinuesALogWhereTheStoreEndsIt) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\n")).ok());
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  // The daemon, unsure what arrived, ships from 0 again: nothing is stored twice.
  EXPECT_EQ(*cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\ntwo\n")), 8);
  absl::StatusOr<std::vector<LogChunk>> chunks = state_.ReadLogChunks(job, 1, 0, 0, 1 << 20);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  std::string stored;
  for (const LogChunk& c : *chunks) stored += c.data;
  EXPECT_EQ(stored, "one\ntwo\n");
}

TEST_F(ClusterTest, EachProcessKeepsAtMostTheNewestLogMaxBytes) {
  options_.log_max_bytes_per_process = 64 * 1024;
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  const std::string piece(40000, 'x');
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, i * 40000, piece)).ok());
  }
  std::vector<LogExtent> extents = *state_.LogExtents(job, 1);
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_EQ(extents[0].begin, 80000);  // the two oldest pieces were dropped
  EXPECT_EQ(extents[0].end, 120000);
}

}  // namespace
}  // namespace substrax
