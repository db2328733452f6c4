// An in-process coordinator on a real gRPC port, driven by client-side agents that play worker
// daemons and runners: the second tier of tests, between units on fakes and real processes.
#include "coordinator/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/job_spec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

constexpr char kJob[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: mlp}
spec:
  model: {type: mlp, hidden_sizes: [8], num_classes: 3}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 256, num_features: 4}
  optimizer: {type: sgd, learning_rate: 0.1}
  mesh: {data_parallel_size: 4}
  batch: {global_batch_size: 32}
  steps: 10
)";

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterOptions cluster_options;
    cluster_options.log_follow_grace = absl::Milliseconds(300);
    auto cluster = Cluster::Create(cluster_options, [] { return absl::Now(); }, &state_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    CoordinatorServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "";
    // Plaintext and unrestricted: authentication has its own tests (auth_test, tests/security);
    // the rendezvous secret is checked whatever the transport.
    options.transport.insecure = true;
    options.rendezvous_key = "0123456789abcdef0123456789abcdef";
    auto auth = Authenticator::Create(/*insecure=*/true, "");
    ASSERT_TRUE(auth.ok()) << auth.status();
    auth_ = *std::move(auth);
    auto server = CoordinatorServer::Start(options, cluster_.get(), &rendezvous_, auth_.get());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                       grpc::InsecureChannelCredentials());
    coordinator_ = v1::CoordinatorService::NewStub(channel);
    jobs_ = v1::JobService::NewStub(channel);
    metrics_ = v1::MetricsService::NewStub(channel);
  }

  void TearDown() override { server_->Shutdown(); }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    return context;
  }

  // A server of cluster_ with Prometheus metrics on a free port, ticking every 20 ms.
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> StartWithMetrics() {
    CoordinatorServerOptions options;
    options.listen = "127.0.0.1:0";
    options.metrics_listen = "127.0.0.1:0";
    options.transport.insecure = true;
    options.rendezvous_key = "0123456789abcdef0123456789abcdef";
    options.tick_interval = absl::Milliseconds(20);
    return CoordinatorServer::Start(options, cluster_.get(), &rendezvous_, auth_.get());
  }

  v1::RegisterWorkerResponse Register(const std::string& id, const std::string& incarnation) {
    v1::RegisterWorkerRequest request;
    request.set_worker_id(id);
    request.set_host("host-" + id);
    request.set_incarnation(incarnation);
    for (int i = 0; i < 2; ++i) {
      v1::Device* d = request.add_devices();
      d->set_host("host-" + id);
      d->set_local_index(i);
      d->set_kind(v1::DEVICE_KIND_CPU);
    }
    v1::RegisterWorkerResponse response;
    EXPECT_TRUE(coordinator_->RegisterWorker(Context().get(), request, &response).ok());
    return response;
  }

  // The rendezvous calls a runner makes (KeyValueSet / KeyValueGet of one attempt's scope).
  grpc::Status KeyValueSet(const std::string& job_id, int attempt, const std::string& secret,
                           const std::string& key, const std::string& value) {
    v1::KeyValueSetRequest request;
    request.mutable_scope()->set_job_id(job_id);
    request.mutable_scope()->set_attempt(attempt);
    request.mutable_scope()->set_secret(secret);
    request.set_key(key);
    request.set_value(value);
    request.set_allow_overwrite(true);
    v1::KeyValueSetResponse response;
    return coordinator_->KeyValueSet(Context().get(), request, &response);
  }

  grpc::Status KeyValueGet(const std::string& job_id, int attempt, const std::string& secret,
                           const std::string& key, std::string* value) {
    v1::KeyValueGetRequest request;
    request.mutable_scope()->set_job_id(job_id);
    request.mutable_scope()->set_attempt(attempt);
    request.mutable_scope()->set_secret(secret);
    request.set_key(key);
    request.mutable_timeout()->set_seconds(10);
    v1::KeyValueGetResponse response;
    grpc::Status status = coordinator_->KeyValueGet(Context().get(), request, &response);
    *value = response.value();
    return status;
  }

  // Submits kJob on workers a and b; the job id, and the worker of each process.
  std::string SubmitOnTwoWorkers(std::vector<std::string>* workers) {
    Register("a", "inc-a");
    Register("b", "inc-b");
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = *ParseJobSpecYaml(kJob);
    v1::SubmitJobResponse submitted;
    EXPECT_TRUE(jobs_->SubmitJob(Context().get(), submit, &submitted).ok());
    for (const v1::Device& d : submitted.job().mesh().devices()) {
      if (std::find(workers->begin(), workers->end(), d.worker_id()) == workers->end()) {
        workers->push_back(d.worker_id());
      }
    }
    return submitted.job().id();
  }

  grpc::Status Ship(const std::string& job_id, const std::vector<std::string>& workers, int p,
                    int64_t offset, const std::string& data, bool eof) {
    v1::ShipLogsRequest request;
    request.set_job_id(job_id);
    request.set_attempt(1);
    request.set_worker_id(workers[p]);
    request.set_host("host-" + workers[p]);
    request.set_process_index(p);
    request.set_offset(offset);
    request.set_data(data);
    request.set_eof(eof);
    v1::ShipLogsResponse response;
    return coordinator_->ShipLogs(Context().get(), request, &response);
  }

  // A ReadLogs stream on its own thread, collecting "p<process> <text>" and notices.
  struct LogStream {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::ReadLogsResponse>> reader;
    absl::Mutex mu;
    std::vector<std::string> lines ABSL_GUARDED_BY(mu);
    bool done ABSL_GUARDED_BY(mu) = false;
    grpc::Status status;
    std::thread thread;

    std::vector<std::string> Lines() {
      absl::MutexLock lock(&mu);
      return lines;
    }
    bool AwaitDone(absl::Duration timeout) {
      absl::MutexLock lock(&mu);
      return mu.AwaitWithTimeout(absl::Condition(&done), timeout);
    }
  };
  std::unique_ptr<LogStream> Follow(const std::string& job_id) {
    auto stream = std::make_unique<LogStream>();
    stream->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    v1::ReadLogsRequest request;
    request.set_job_id(job_id);
    request.set_follow(true);
    stream->reader = jobs_->ReadLogs(&stream->context, request);
    stream->thread = std::thread([s = stream.get()] {
      v1::ReadLogsResponse response;
      while (s->reader->Read(&response)) {
        absl::MutexLock lock(&s->mu);
        for (const std::string& n : response.notices()) s->lines.push_back("notice: " + n);
        for (const v1::LogLine& l : response.lines()) {
          s->lines.push_back(absl::StrCat("p", l.process_index(), " ", l.text()));
        }
      }
      grpc::Status status = s->reader->Finish();
      absl::MutexLock lock(&s->mu);
      s->status = status;
      s->done = true;
    });
    return stream;
  }

  InMemoryStateStore state_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<Cluster> cluster_;
  Rendezvous rendezvous_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::CoordinatorService::Stub> coordinator_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::MetricsService::Stub> metrics_;
};

TEST_F(ServerTest, AJobRunsThroughAssignmentsRendezvousAndReports) {
  Register("a", "inc-a");
  Register("b", "inc-b");
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = *ParseJobSpecYaml(kJob);
  v1::SubmitJobResponse submitted;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &submitted).ok());
  const std::string id = submitted.job().id();

  // Each agent receives its start event on its assignment stream.
  std::vector<v1::Assignment> assignments;
  for (const auto& [worker, incarnation] : {std::pair{"a", "inc-a"}, std::pair{"b", "inc-b"}}) {
    v1::WatchAssignmentsRequest watch;
    watch.set_worker_id(worker);
    watch.set_incarnation(incarnation);
    auto context = Context();
    auto reader = coordinator_->WatchAssignments(context.get(), watch);
    v1::WatchAssignmentsResponse event;
    ASSERT_TRUE(reader->Read(&event));
    ASSERT_TRUE(event.has_start());
    assignments.push_back(event.start());
    context->TryCancel();
  }
  EXPECT_EQ(assignments[0].num_processes(), 2);
  EXPECT_NE(assignments[0].process_index(), assignments[1].process_index());
  EXPECT_EQ(assignments[0].mesh().devices_size(), 4);

  // The mesh with the batch layout and, since the input width is known, every parameter's.
  v1::GetMeshRequest mesh_request;
  mesh_request.set_job_id(id);
  v1::GetMeshResponse mesh;
  ASSERT_TRUE(jobs_->GetMesh(Context().get(), mesh_request, &mesh).ok());
  EXPECT_EQ(mesh.layouts().count("batch/inputs"), 1u);
  ASSERT_EQ(mesh.layouts().count("dense_0/kernel"), 1u);
  EXPECT_EQ(mesh.layouts().at("dense_0/kernel").global_shape(0), 4);
  EXPECT_EQ(mesh.layouts().at("dense_0/kernel").num_replicas(), 4);

  // Rendezvous through the coordinator's store, as Gloo does: a get waits for the set.
  const int attempt = assignments[0].attempt();
  const std::string secret = assignments[0].rendezvous_secret();
  ASSERT_EQ(secret.size(), 64u);
  EXPECT_EQ(assignments[1].rendezvous_secret(), secret);
  std::thread setter(
      [&] { EXPECT_TRUE(KeyValueSet(id, attempt, secret, "addr/0", "127.0.0.1:1234").ok()); });
  std::string got;
  const grpc::Status got_status = KeyValueGet(id, attempt, secret, "addr/0", &got);
  setter.join();
  ASSERT_TRUE(got_status.ok()) << got_status.error_message();
  EXPECT_EQ(got, "127.0.0.1:1234");
  EXPECT_EQ(KeyValueSet(id, 7, secret, "x", "y").error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // Without the attempt's secret (even over --insecure): refused, the key untouched.
  EXPECT_EQ(KeyValueSet(id, attempt, "", "addr/0", "evil").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(KeyValueGet(id, attempt, std::string(64, '0'), "addr/0", &got).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_TRUE(KeyValueGet(id, attempt, secret, "addr/0", &got).ok());
  EXPECT_EQ(got, "127.0.0.1:1234");
  auto* shared = coordinator_.get();

  // Reports, then both processes succeed.
  v1::ReportStepsRequest steps;
  steps.set_job_id(id);
  steps.set_attempt(assignments[0].attempt());
  for (const v1::Device& d : assignments[0].mesh().devices()) {
    v1::StepReport* r = steps.add_reports();
    r->set_job_id(id);
    r->set_attempt(assignments[0].attempt());
    r->set_step(10);
    r->set_device_id(d.id());
    r->set_host(d.host());
    (*r->mutable_values())["loss"] = 0.5 + d.id();
  }
  v1::ReportStepsResponse steps_response;
  ASSERT_TRUE(shared->ReportSteps(Context().get(), steps, &steps_response).ok());
  for (const v1::Assignment& a : assignments) {
    v1::ReportAttemptStatusRequest done;
    done.set_job_id(id);
    done.set_attempt(a.attempt());
    done.set_worker_id(a.mesh().devices(a.process_index() * 2).worker_id());
    done.set_process_index(a.process_index());
    done.set_state(v1::RUNNER_STATE_SUCCEEDED);
    (*done.mutable_final_metrics())["test_accuracy"] = 0.9;
    v1::ReportAttemptStatusResponse r;
    ASSERT_TRUE(shared->ReportAttemptStatus(Context().get(), done, &r).ok());
  }
  v1::GetJobRequest get;
  get.set_job_id(id);
  v1::GetJobResponse job;
  ASSERT_TRUE(jobs_->GetJob(Context().get(), get, &job).ok());
  EXPECT_EQ(job.job().state(), v1::JOB_STATE_SUCCEEDED);

  v1::QueryMetricsRequest query;
  query.set_job_id(id);
  query.add_names("loss");
  query.set_reduction(v1::REDUCTION_MEAN);
  v1::QueryMetricsResponse series;
  ASSERT_TRUE(metrics_->QueryMetrics(Context().get(), query, &series).ok());
  ASSERT_EQ(series.series_size(), 1);
  EXPECT_DOUBLE_EQ(series.series(0).points(0).value(), 0.5 + 1.5);

  // A stale incarnation is told to re-register.
  v1::HeartbeatRequest stale;
  stale.set_worker_id("a");
  stale.set_incarnation("old");
  v1::HeartbeatResponse hb;
  EXPECT_EQ(shared->Heartbeat(Context().get(), stale, &hb).error_code(),
            grpc::StatusCode::ABORTED);
}

// The server-side check of every spec, whatever client sent it: each bad spec is
// INVALID_ARGUMENT naming the field, and the coordinator keeps serving.
TEST_F(ServerTest, ListQueuesShowsTheConfigurationInForceAndWhyAReloadWasRefused) {
  v1::SchedulingConfig config = scheduling::DefaultSchedulingConfig();
  v1::QueueConfig* research = config.add_queues();
  research->set_name("research");
  research->set_cohort("lab");
  v1::DeviceQuota* quota = research->add_quotas();
  quota->set_backend("cpu");
  quota->set_devices(4);
  cluster_->SetSchedulingConfig(config);
  const std::string error = "queues[1].quotas[0].backend: unknown backend 'tpu'";
  server_->SetQueuesSource("/etc/substrax/queues.yaml", absl::FromUnixSeconds(1700000000), error);

  v1::ListQueuesResponse response;
  ASSERT_TRUE(jobs_->ListQueues(Context().get(), v1::ListQueuesRequest(), &response).ok());
  EXPECT_EQ(response.policy(), v1::SCHEDULING_POLICY_QUEUES);
  ASSERT_EQ(response.queues_size(), 2);
  EXPECT_EQ(response.queues(0).name(), "default");
  EXPECT_EQ(response.queues(1).name(), "research");
  EXPECT_EQ(response.queues(1).cohort(), "lab");
  ASSERT_EQ(response.queues(1).devices_size(), 1);
  EXPECT_EQ(response.queues(1).devices(0).quota(), 4);
  ASSERT_EQ(response.priority_classes_size(), 1);
  EXPECT_EQ(response.priority_classes(0).name(), "default");
  EXPECT_EQ(response.config_source(), "/etc/substrax/queues.yaml");
  EXPECT_EQ(response.config_load_time().seconds(), 1700000000);
  EXPECT_EQ(response.config_error(), error);
}

// The body of GET http://127.0.0.1:port/path (HTTP/1.0, the server closes), or "" on an error.
std::string HttpGet(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = absl::StrCat("GET ", path, " HTTP/1.0\r\n\r\n");
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[4096];
      for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) response.append(buffer, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// Polls /metrics on `port` until the scrape holds every string of `want` and none of `gone`
// (within 20 s); the last scrape.
std::string AwaitScrape(int port, const std::vector<std::string>& want,
                        const std::vector<std::string>& gone) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::string scrape;
  while (absl::Now() < deadline) {
    scrape = HttpGet(port, "/metrics");
    bool ok = true;
    for (const std::string& text : want) ok = ok && scrape.find(text) != std::string::npos;
    for (const std::string& text : gone) ok = ok && scrape.find(text) == std::string::npos;
    if (ok) return scrape;
    absl::SleepFor(absl::Milliseconds(20));  // polling, bounded by the deadline
  }
  ADD_FAILURE() << "no such scrape within 20 s; the last:\n" << scrape;
  return scrape;
}

TEST_F(ServerTest, QueueGaugesFollowTheConfigurationInForce) {
  auto server = StartWithMetrics();
  ASSERT_TRUE(server.ok()) << server.status();
  // Waits until the scrape shows `want` (each a line of it) and none of `gone`.
  auto await = [&](const std::vector<std::string>& want, const std::vector<std::string>& gone) {
    std::vector<std::string> lines;
    for (const std::string& line : want) lines.push_back("\n" + line + "\n");
    return AwaitScrape((*server)->metrics_port(), lines, gone);
  };
  // The built-in default: one queue without a quota, one class.
  await({R"(substrax_queue_used_devices{backend="cpu",queue="default"} 0)",
         R"(substrax_queue_used_devices{backend="cuda",queue="default"} 0)",
         R"(substrax_queue_borrowed_devices{backend="cpu",queue="default"} 0)",
         R"(substrax_queue_pending_jobs{priority_class="default",queue="default"} 0)",
         "substrax_jobs_preemptions 0", "substrax_jobs_work_lost_device_seconds 0"},
        {"substrax_queue_quota_devices{"});

  v1::SchedulingConfig config = scheduling::DefaultSchedulingConfig();
  config.mutable_queues(0)->set_name("research");
  config.set_default_queue("research");
  v1::DeviceQuota* quota = config.mutable_queues(0)->add_quotas();
  quota->set_backend("cuda");
  quota->set_devices(8);
  config.mutable_priority_classes(0)->set_name("high");
  config.set_default_priority_class("high");
  cluster_->SetSchedulingConfig(config);
  await({R"(substrax_queue_quota_devices{backend="cuda",queue="research"} 8)",
         R"(substrax_queue_used_devices{backend="cuda",queue="research"} 0)",
         R"(substrax_queue_pending_jobs{priority_class="high",queue="research"} 0)"},
        {R"(queue="default")", R"(priority_class="default")"});
  (*server)->Shutdown();
}

// What `substraxctl doctor` judges is exported per alive worker: its clock offset and how long
// until its certificate expires, as its agent's heartbeat said.
TEST_F(ServerTest, WorkerClockAndCertificateGauges) {
  auto server = StartWithMetrics();
  ASSERT_TRUE(server.ok()) << server.status();
  v1::RegisterWorkerRequest reg;
  reg.set_worker_id("g");
  reg.set_host("host-g");
  reg.set_incarnation("inc-g");
  v1::Device* d = reg.add_devices();
  d->set_host("host-g");
  d->set_kind(v1::DEVICE_KIND_CPU);
  ASSERT_TRUE(cluster_->RegisterWorker(reg).ok());
  v1::HeartbeatRequest beat;
  beat.set_worker_id("g");
  beat.set_incarnation("inc-g");
  beat.mutable_clock()->mutable_offset()->set_seconds(90);
  beat.mutable_certificate_not_after()->set_seconds(absl::ToUnixSeconds(absl::Now()) + 3600);
  ASSERT_TRUE(cluster_->Heartbeat(beat).ok());
  // The certificate: an hour from the heartbeat, less the seconds the test took (35xx).
  AwaitScrape((*server)->metrics_port(),
              {"\nsubstrax_worker_clock_offset_seconds{worker=\"g\"} 90\n",
               "\nsubstrax_worker_certificate_expiry_seconds{worker=\"g\"} 35"},
              {});
  (*server)->Shutdown();
}

TEST_F(ServerTest, BadSpecsAreRejectedWithTheirFieldPath) {
  Register("a", "inc-a");
  Register("b", "inc-b");
  const v1::JobSpec good = *ParseJobSpecYaml(kJob);
  struct Case {
    std::function<void(v1::JobSpec*)> mutate;
    const char* fragment;
  };
  const Case cases[] = {
      {[](v1::JobSpec* s) { s->mutable_mesh()->set_data_parallel_size(0); },
       "spec.mesh.data_parallel_size"},
      {[](v1::JobSpec* s) { s->mutable_mesh()->set_data_parallel_size(-3); },
       "spec.mesh.data_parallel_size: must be >= 1, got -3"},
      {[](v1::JobSpec* s) { s->mutable_batch()->set_global_batch_size(30); },
       "spec.batch.global_batch_size"},
      {[](v1::JobSpec* s) { s->mutable_model()->set_type(v1::MODEL_TYPE_UNSPECIFIED); },
       "spec.model.type"},
      {[](v1::JobSpec* s) { s->mutable_model()->clear_hidden_sizes(); },
       "spec.model.hidden_sizes"},
      {[](v1::JobSpec* s) { s->mutable_optimizer()->set_learning_rate(-1); },
       "spec.optimizer.learning_rate"},
      {[](v1::JobSpec* s) { s->clear_name(); }, "metadata.name"},
      {[](v1::JobSpec* s) { s->clear_length(); }, "give steps or epochs"},
      {[](v1::JobSpec* s) { (*s->mutable_metrics())["perplexity"] = v1::REDUCTION_MEAN; },
       "spec.metrics.perplexity"},
      {[](v1::JobSpec* s) { s->set_max_restarts(1000); }, "spec.max_restarts"},
  };
  for (const Case& c : cases) {
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = good;
    c.mutate(submit.mutable_spec());
    v1::SubmitJobResponse response;
    grpc::Status status = jobs_->SubmitJob(Context().get(), submit, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.fragment;
    EXPECT_THAT(status.error_message(), HasSubstr(c.fragment));
  }
  // Meshes the alive cluster (2 workers x 2 devices) can never hold: refused, saying what is there.
  v1::SubmitJobRequest too_big;
  *too_big.mutable_spec() = good;
  too_big.mutable_spec()->mutable_mesh()->set_data_parallel_size(8);
  too_big.mutable_spec()->mutable_batch()->clear_per_device_batch_size();
  v1::SubmitJobResponse refused;
  grpc::Status big = jobs_->SubmitJob(Context().get(), too_big, &refused);
  EXPECT_EQ(big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(big.error_message(),
              HasSubstr("spec.mesh: data-parallel mesh of 8 devices, but only 4 are available"));
  v1::SubmitJobRequest cross;
  *cross.mutable_spec() = good;
  cross.mutable_spec()->mutable_mesh()->set_type(v1::MESH_TYPE_HYBRID);
  cross.mutable_spec()->mutable_mesh()->set_data_parallel_size(1);
  cross.mutable_spec()->mutable_mesh()->set_model_parallel_size(4);
  cross.mutable_spec()->mutable_batch()->clear_per_device_batch_size();
  grpc::Status crossed = jobs_->SubmitJob(Context().get(), cross, &refused);
  EXPECT_EQ(crossed.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << crossed.error_message();
  EXPECT_THAT(crossed.error_message(), HasSubstr("spec.mesh.allow_cross_host_model_axis"));

  v1::SubmitJobRequest checkpointed;
  *checkpointed.mutable_spec() = good;
  checkpointed.mutable_spec()->mutable_checkpoint()->set_directory("/tmp/ckpt");
  checkpointed.mutable_spec()->mutable_checkpoint()->set_every_steps(5);
  grpc::Status no_root = jobs_->SubmitJob(Context().get(), checkpointed, &refused);
  EXPECT_EQ(no_root.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(no_root.error_message(), HasSubstr("spec.checkpoint.directory"));

  v1::ListJobsResponse list;
  ASSERT_TRUE(jobs_->ListJobs(Context().get(), v1::ListJobsRequest(), &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = good;
  submit.set_request_id("retry-me");
  v1::SubmitJobResponse response;
  EXPECT_TRUE(jobs_->SubmitJob(Context().get(), submit, &response).ok());
  // The same request again (its answer lost): the same job; another spec under it: refused.
  v1::SubmitJobResponse again;
  ASSERT_TRUE(jobs_->SubmitJob(Context().get(), submit, &again).ok());
  EXPECT_EQ(again.job().id(), response.job().id());
  submit.mutable_spec()->set_max_restarts(3);
  grpc::Status changed = jobs_->SubmitJob(Context().get(), submit, &again);
  EXPECT_EQ(changed.error_code(), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_THAT(changed.error_message(), HasSubstr("already made job " + response.job().id()));
  submit.set_request_id("not/plain");
  EXPECT_EQ(jobs_->SubmitJob(Context().get(), submit, &again).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ServerTest, AFollowedLogGetsLinesAsShippedAndEndsWhenEveryLogIsComplete) {
  std::vector<std::string> workers;
  const std::string id = SubmitOnTwoWorkers(&workers);
  ASSERT_EQ(workers.size(), 2u);
  std::unique_ptr<LogStream> stream = Follow(id);
  ASSERT_TRUE(Ship(id, workers, 0, 0, "one\ntw", false).ok());
  // The line arrives while the job runs; the partial one waits for its newline.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (stream->Lines().empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));  // polling a condition with a deadline
  }
  EXPECT_EQ(stream->Lines(), std::vector<std::string>({"p0 one"}));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel, &cancelled).ok());
  ASSERT_TRUE(Ship(id, workers, 0, 6, "o\n", true).ok());
  EXPECT_FALSE(stream->AwaitDone(absl::Milliseconds(100))) << "process 1's log has not ended";
  ASSERT_TRUE(Ship(id, workers, 1, 0, "bye", true).ok());
  ASSERT_TRUE(stream->AwaitDone(absl::Seconds(20)));
  stream->thread.join();
  EXPECT_TRUE(stream->status.ok()) << stream->status.error_message();
  EXPECT_EQ(stream->Lines(), std::vector<std::string>({"p0 one", "p0 two", "p1 bye"}));
}

TEST_F(ServerTest, AFollowedLogWithoutItsEndStopsAfterTheGraceAndSaysSo) {
  std::vector<std::string> workers;
  const std::string id = SubmitOnTwoWorkers(&workers);
  ASSERT_TRUE(Ship(id, workers, 0, 0, "one\n", true).ok());
  std::unique_ptr<LogStream> stream = Follow(id);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(jobs_->CancelJob(Context().get(), cancel, &cancelled).ok());
  // Process 1's daemon "died": it never ships. The stream ends after the grace (300 ms here).
  ASSERT_TRUE(stream->AwaitDone(absl::Seconds(20)));
  stream->thread.join();
  EXPECT_TRUE(stream->status.ok()) << stream->status.error_message();
  std::vector<std::string> lines = stream->Lines();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], "p0 one");
  EXPECT_THAT(lines[1], HasSubstr("process 1: the log may be incomplete"));
}

TEST_F(ServerTest, ReadLogsRefusesWhatDoesNotExistAndNegativeValues) {
  std::vector<std::string> workers;
  const std::string id = SubmitOnTwoWorkers(&workers);
  auto status_of = [&](v1::ReadLogsRequest request) {
    auto context = Context();
    auto reader = jobs_->ReadLogs(context.get(), request);
    v1::ReadLogsResponse response;
    while (reader->Read(&response)) {
    }
    return reader->Finish().error_code();
  };
  v1::ReadLogsRequest unknown;
  unknown.set_job_id("nope-1");
  EXPECT_EQ(status_of(unknown), grpc::StatusCode::NOT_FOUND);
  v1::ReadLogsRequest later;
  later.set_job_id(id);
  later.set_attempt(2);
  EXPECT_EQ(status_of(later), grpc::StatusCode::NOT_FOUND);
  v1::ReadLogsRequest negative;
  negative.set_job_id(id);
  negative.set_tail_lines(-1);
  EXPECT_EQ(status_of(negative), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ReadLogsRequest process;
  process.set_job_id(id);
  process.set_process_index(-2);
  EXPECT_EQ(status_of(process), grpc::StatusCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace substrax
