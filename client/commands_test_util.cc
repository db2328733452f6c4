#include "client/commands_test_util.h"

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/job_spec_builder.h"

namespace substrax::ctl {

std::string GoodSpecYaml() {
  return testing::JobSpecBuilder("demo")
      .Model("{type: linear}")
      .SyntheticData("{task: regression, num_train_examples: 100, num_features: 4}")
      .Optimizer("{type: sgd, learning_rate: 0.01}")
      .DataParallel(2)
      .Batch("{global_batch_size: 10}")
      .Steps(100)
      .Yaml();
}

v1::Job MakeJob(const std::string& id, v1::JobState state, int64_t step) {
  v1::Job job;
  job.set_id(id);
  job.mutable_spec()->set_name("demo");
  job.set_state(state);
  job.set_attempt(state == v1::JOB_STATE_PENDING ? 0 : 1);
  job.mutable_create_time()->set_seconds(1714564800);
  job.mutable_update_time()->set_seconds(1714564860);
  job.mutable_progress()->set_step(step);
  job.mutable_progress()->set_total_steps(100);
  (*job.mutable_progress()->mutable_metrics())["loss"] = 1.0 / (1 + step);
  auto* t = job.add_transitions();
  t->set_to(v1::JOB_STATE_PENDING);
  t->set_reason("submitted");
  if (state != v1::JOB_STATE_PENDING) {
    t = job.add_transitions();
    t->set_from(v1::JOB_STATE_PENDING);
    t->set_to(v1::JOB_STATE_RUNNING);
    t->set_attempt(1);
    t->set_reason("scheduled on 2 devices of 1 worker");
  }
  return job;
}

grpc::Status FakeJobService::SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                                       v1::SubmitJobResponse* response) {
  absl::MutexLock lock(&mu_);
  ++submits_;
  last_spec_ = request->spec();
  request_ids_.push_back(request->request_id());
  if (fail_submits_ > 0) {
    --fail_submits_;
    return grpc::Status(fail_code_, "the coordinator is restarting (a failure the test asked for)");
  }
  if (request->spec().name() == "too-big") {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "the mesh needs 64 devices; the cluster has 4");
  }
  *response->mutable_job() = MakeJob(request->spec().name() + "-1", v1::JOB_STATE_PENDING, 0);
  return grpc::Status::OK;
}

grpc::Status FakeJobService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                    v1::GetJobResponse* response) {
  if (request->job_id() != "demo-1") {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("job ", request->job_id(), " not found"));
  }
  *response->mutable_job() = MakeJob("demo-1", v1::JOB_STATE_RUNNING, 40);
  return grpc::Status::OK;
}

grpc::Status FakeJobService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                                      v1::ListJobsResponse* response) {
  absl::MutexLock lock(&mu_);
  last_list_ = *request;
  // Two pages, to check that every page is read.
  if (request->page_token().empty()) {
    *response->add_jobs() = MakeJob("demo-2", v1::JOB_STATE_PENDING, 0);
    response->set_next_page_token("p2");
  } else {
    *response->add_jobs() = MakeJob("demo-1", v1::JOB_STATE_RUNNING, 40);
  }
  return grpc::Status::OK;
}

grpc::Status FakeJobService::CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                                       v1::CancelJobResponse* response) {
  absl::MutexLock lock(&mu_);
  last_cancel_ = *request;
  if (request->job_id() == "done-1") {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "job done-1 already SUCCEEDED");
  }
  *response->mutable_job() = MakeJob(request->job_id(), v1::JOB_STATE_CANCELLED, 40);
  return grpc::Status::OK;
}

grpc::Status FakeJobService::DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                                       v1::DeleteJobResponse*) {
  if (request->job_id() == "demo-1") {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "job demo-1 is RUNNING: only an ended job can be deleted");
  }
  return grpc::Status::OK;
}

grpc::Status FakeJobService::ReadLogs(grpc::ServerContext*, const v1::ReadLogsRequest* request,
                                      grpc::ServerWriter<v1::ReadLogsResponse>* writer) {
  last_logs_request = *request;
  if (request->job_id() == "nope-1") {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job nope-1");
  }
  v1::ReadLogsResponse first;
  first.add_notices("process 0 (host host-a): [... 10 earlier bytes dropped ...]");
  v1::LogLine* line = first.add_lines();
  line->set_attempt(1);
  line->set_host("host-a");
  line->set_text("step 10/100 loss=0.5");
  writer->Write(first);
  v1::ReadLogsResponse second;
  line = second.add_lines();
  line->set_attempt(1);
  line->set_process_index(1);
  line->set_host("host-b");
  line->set_text("ready");
  writer->Write(second);
  return grpc::Status::OK;
}

grpc::Status FakeJobService::WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                                      grpc::ServerWriter<v1::WatchJobResponse>* writer) {
  auto send = [&](v1::Job job) {
    v1::WatchJobResponse update;
    *update.mutable_job() = std::move(job);
    writer->Write(update);
  };
  const std::string& id = request->job_id();
  if (id == "nope-1") return grpc::Status(grpc::StatusCode::NOT_FOUND, "job nope-1 not found");
  send(MakeJob(id, v1::JOB_STATE_PENDING, 0));
  send(MakeJob(id, v1::JOB_STATE_RUNNING, 0));
  send(MakeJob(id, v1::JOB_STATE_RUNNING, 50));
  v1::Job same_step = MakeJob(id, v1::JOB_STATE_RUNNING, 50);
  same_step.mutable_progress()->set_samples_per_second(99);  // no new plain line
  // More of the step's devices reported: its loss changes (the trend keeps the latest).
  (*same_step.mutable_progress()->mutable_metrics())["loss"] = 0.6;
  send(same_step);
  if (id == "fails-1") {
    v1::Job failed = MakeJob(id, v1::JOB_STATE_FAILED, 50);
    failed.set_error("worker local-1 (host local-1) lease expired");
    send(failed);
    return grpc::Status::OK;
  }
  if (id == "cut-1") return grpc::Status::OK;  // ends before the job does
  if (id == "slow-1") {  // a straggler is flagged while it runs
    v1::Job slowed = same_step;
    v1::JobTransition* t = slowed.add_transitions();
    t->set_from(v1::JOB_STATE_RUNNING);
    t->set_to(v1::JOB_STATE_RUNNING);
    t->set_reason("straggler: device 3 (process 1, worker w-2 (host b)): its compute time is "
                  "1.84x the other devices' median");
    send(slowed);
  }
  send(MakeJob(id, v1::JOB_STATE_RUNNING, 100));
  v1::Job done = MakeJob(id, v1::JOB_STATE_SUCCEEDED, 100);
  (*done.mutable_progress()->mutable_final_metrics())["test_accuracy"] = 0.88123;
  send(done);
  return grpc::Status::OK;
}

grpc::Status FakeJobService::ListQueues(grpc::ServerContext*, const v1::ListQueuesRequest*,
                                        v1::ListQueuesResponse* response) {
  response->set_policy(v1::SCHEDULING_POLICY_QUEUES);
  v1::QueueState* research = response->add_queues();
  research->set_name("research");
  research->set_cohort("lab");
  v1::QueueDevices* cpu = research->add_devices();
  cpu->set_backend("cpu");
  cpu->set_quota(16);
  cpu->set_used(20);
  cpu->set_borrowed(4);
  (*research->mutable_pending())["high"] = 2;
  (*research->mutable_pending())["low"] = 5;
  research->set_fair_share(0.5);
  response->add_queues()->set_name("vision");
  response->set_default_queue("research");
  v1::PriorityClass* high = response->add_priority_classes();
  high->set_name("high");
  high->set_value(1000);
  response->add_priority_classes()->set_name("low");
  response->set_default_priority_class("low");
  response->set_config_source("/etc/substrax/queues.yaml");
  response->set_config_error("queues[1].quotas[0].backend: unknown backend 'tpu'");
  return grpc::Status::OK;
}

grpc::Status FakeJobService::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                         v1::ListWorkersResponse* response) {
  // The stand-in coordinator of the local-cluster test lists the workers it was told of.
  const char* local = std::getenv("FAKE_LOCAL_WORKERS");
  const int n = local == nullptr ? 1 : std::atoi(local);
  for (int i = 0; i < n; ++i) {
    v1::Worker* w = response->add_workers();
    w->set_worker_id(local == nullptr ? "w-0" : absl::StrCat("local-", i));
    w->set_host(w->worker_id());
    w->set_state(v1::WORKER_STATE_ALIVE);
    v1::Device* d = w->add_devices();
    d->set_id(i);
    d->set_host(w->host());
    d->set_worker_id(w->worker_id());
    d->set_name("cpu");
  }
  return grpc::Status::OK;
}

grpc::Status FakeJobService::GetMesh(grpc::ServerContext*, const v1::GetMeshRequest*,
                                     v1::GetMeshResponse* response) {
  v1::Mesh* mesh = response->mutable_mesh();
  mesh->add_axis_names("data");
  mesh->add_shape(2);
  for (int i = 0; i < 2; ++i) {
    v1::Device* d = mesh->add_devices();
    d->set_id(i);
    d->set_host(absl::StrCat("local-", i));
    d->set_worker_id(d->host());
    d->set_kind(v1::DEVICE_KIND_CPU);
  }
  return grpc::Status::OK;
}

std::unique_ptr<grpc::Server> StartFakes(FakeJobService* jobs, FakeMetricsService* metrics,
                                         const std::string& host, std::string* address,
                                         const TransportOptions& transport) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":0"), MakeServerCredentials(transport), &port);
  builder.RegisterService(jobs);
  builder.RegisterService(metrics);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = absl::StrCat(host, ":", port);
  return server;
}

void CommandsTest::SetUp() {
  std::string address;
  server_ = StartFakes(&jobs_, &metrics_, "127.0.0.1", &address);
  ctx_.coordinator = address;
  ctx_.transport.insecure = true;
  ctx_.timeout = absl::Seconds(5);
  ctx_.out = &out_;
  ctx_.err = &err_;
  ctx_.zone = absl::UTCTimeZone();
  // Each reading of the clock is 10 s after the previous one.
  ctx_.clock = [this] { return absl::FromUnixSeconds(1714564800) + absl::Seconds(10 * ++ticks_); };
}

void CommandsTest::TearDown() { server_->Shutdown(); }

std::string CommandsTest::WriteFile(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir();
  if (path.back() != '/') path += "/";
  path += name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace substrax::ctl
