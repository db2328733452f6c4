#include "coordinator/cluster_test_util.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "core/job_spec_builder.h"

namespace substrax {
v1::JobSpec Spec(const std::string& name, int dp, int mp, int max_restarts) {
  return testing::JobSpecBuilder(name)
      .DataParallel(dp, mp)
      .Set("max_restarts", absl::StrCat(max_restarts))
      .Proto();
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

void ClusterTest::SetUp() { cluster_ = MakeCluster(state_); }

std::unique_ptr<Cluster> ClusterTest::MakeCluster(StateStore& state) {
  auto cluster = Cluster::Create(
      options_, [this] { return now_; }, &state,
      [this] { return split_clocks_ ? lease_now_ : now_; });
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return nullptr;
  (*cluster)->SetAttemptEndedCallback(
      [this](const std::string& job, int attempt) { ended_.push_back({job, attempt}); });
  return *std::move(cluster);
}

v1::RegisterWorkerResponse ClusterTest::Register(
    const std::string& worker_id, const std::string& host, int num_devices,
    const std::string& incarnation, const std::vector<std::string>& data_roots,
    const std::vector<std::string>& checkpoint_roots) {
  return Register(worker_id, host, num_devices, incarnation, data_roots, checkpoint_roots,
                  v1::RegisterWorkerRequest());
}

v1::RegisterWorkerResponse ClusterTest::Register(
    const std::string& worker_id, const std::string& host, int num_devices,
    const std::string& incarnation, const std::vector<std::string>& data_roots,
    const std::vector<std::string>& checkpoint_roots, v1::RegisterWorkerRequest request) {
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

void ClusterTest::RegisterTwoWorkers() {
  Register("w-1", "a", 2);
  Register("w-2", "b", 2);
}

void ClusterTest::RegisterTwoCommandWorkers() {
  v1::RegisterWorkerRequest commands;
  commands.add_programs_dirs("/opt/p");
  commands.set_runs_commands(true);
  Register("w-1", "a", 2, "inc-1", {}, {}, commands);
  Register("w-2", "b", 2, "inc-1", {}, {}, commands);
}

std::vector<v1::WatchAssignmentsResponse> ClusterTest::Poll(const std::string& worker_id,
                                                            const std::string& incarnation) {
  auto events = cluster_->PollAssignments(worker_id, incarnation, &cursors_[worker_id]);
  EXPECT_TRUE(events.ok()) << events.status();
  return events.ok() ? *events : std::vector<v1::WatchAssignmentsResponse>{};
}

std::string ClusterTest::Submit(const v1::JobSpec& spec) {
  auto job = cluster_->SubmitJob(spec);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? job->id() : "";
}

v1::Job ClusterTest::Get(const std::string& job_id) {
  auto job = cluster_->GetJob(job_id);
  EXPECT_TRUE(job.ok()) << job.status();
  return job.ok() ? *job : v1::Job{};
}

absl::Status ClusterTest::ReportStatus(const std::string& job_id, int attempt,
                                       const std::string& worker, int process,
                                       v1::RunnerState state) {
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

void ClusterTest::RunFor(absl::Duration d, const std::vector<std::string>& alive) {
  for (absl::Duration t; t < d; t += absl::Seconds(1)) {
    now_ += absl::Seconds(1);
    lease_now_ += absl::Seconds(1);
    for (const std::string& w : alive) EXPECT_TRUE(cluster_->Heartbeat(w, "inc-1").ok()) << w;
    cluster_->Tick();
  }
}

std::vector<v1::JobState> ClusterTest::States(const v1::Job& job) {
  std::vector<v1::JobState> states;
  for (const auto& t : job.transitions()) states.push_back(t.to());
  return states;
}

}  // namespace substrax
