// Who may reach the coordinator, and what they may do there, with the real coordinator binary
// over mutual TLS on loopback. Every refusal is checked for its status and for what it must
// not have done (no job, no worker, no key written).
//
// Callers play users (certificates with O=substrax:<role>, or bearer tokens) and workers
// (certificates whose CN is the worker id) through gRPC stubs; tests/e2e_test has the real
// daemons and runners doing the same over TLS.
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <optional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/keepalive.h"
#include "rpc/pki.h"
#include "rpc/transport.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"
#include "tests/chaos/harness.h"
#include "tests/credentials.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kCoordinator[] = "coordinator/substrax-coordinator";

// A job that fits one worker of 2 devices.
v1::JobSpec Spec(const std::string& name) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_model()->set_type(v1::MODEL_TYPE_LINEAR);
  spec.mutable_data()->set_format(v1::DATA_FORMAT_SYNTHETIC);
  auto* synthetic = spec.mutable_data()->mutable_synthetic();
  synthetic->set_task(v1::SYNTHETIC_TASK_REGRESSION);
  synthetic->set_num_train_examples(64);
  synthetic->set_num_features(4);
  synthetic->set_num_outputs(1);
  spec.mutable_optimizer()->set_type("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.1);
  spec.mutable_mesh()->set_data_parallel_size(2);
  spec.mutable_batch()->set_global_batch_size(8);
  spec.set_steps(1000000);
  return spec;
}

// A report of `step` from the first device of `a`'s process.
v1::ReportStepsRequest StepOf(const v1::Assignment& a, int64_t step) {
  v1::ReportStepsRequest steps;
  steps.set_job_id(a.job_id());
  steps.set_attempt(a.attempt());
  v1::StepReport* r = steps.add_reports();
  r->set_step(step);
  r->set_device_id(a.local_device_ids(0));
  (*r->mutable_values())["loss"] = 0.5;
  return steps;
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(10)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

// One caller's stubs.
struct Client {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::JobService::Stub> jobs;
  std::unique_ptr<v1::MetricsService::Stub> metrics;
  std::unique_ptr<v1::CoordinatorService::Stub> coordinator;

  grpc::Status Submit(const std::string& name, std::string* id = nullptr) {
    return Submit(Spec(name), id);
  }
  grpc::Status Submit(const v1::JobSpec& spec, std::string* id = nullptr) {
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    grpc::Status status = jobs->SubmitJob(Context().get(), request, &response);
    if (id != nullptr) *id = response.job().id();
    return status;
  }
  grpc::Status Cancel(const std::string& id) {
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::CancelJobResponse response;
    return jobs->CancelJob(Context().get(), request, &response);
  }
  grpc::Status Delete(const std::string& id) {
    v1::DeleteJobRequest request;
    request.set_job_id(id);
    v1::DeleteJobResponse response;
    return jobs->DeleteJob(Context().get(), request, &response);
  }
  grpc::Status List(v1::ListJobsResponse* response) {
    return jobs->ListJobs(Context().get(), v1::ListJobsRequest(), response);
  }
  grpc::Status Workers(v1::ListWorkersResponse* response) {
    return jobs->ListWorkers(Context().get(), v1::ListWorkersRequest(), response);
  }
  grpc::Status Query(const std::string& id) {
    v1::QueryMetricsRequest request;
    request.set_job_id(id);
    v1::QueryMetricsResponse response;
    return metrics->QueryMetrics(Context().get(), request, &response);
  }
  grpc::Status Register(const std::string& worker_id,
                        const std::vector<std::string>& checkpoint_roots = {}) {
    v1::RegisterWorkerRequest request;
    for (const std::string& root : checkpoint_roots) request.add_checkpoint_roots(root);
    request.set_worker_id(worker_id);
    request.set_host("host-" + worker_id);
    request.set_incarnation("inc-" + worker_id);
    request.set_address("127.0.0.1");
    for (int i = 0; i < 2; ++i) {
      v1::Device* d = request.add_devices();
      d->set_local_index(i);
      d->set_kind(v1::DEVICE_KIND_CPU);
    }
    v1::RegisterWorkerResponse response;
    return coordinator->RegisterWorker(Context().get(), request, &response);
  }
  grpc::Status Heartbeat(const std::string& worker_id) {
    v1::HeartbeatRequest request;
    request.set_worker_id(worker_id);
    request.set_incarnation("inc-" + worker_id);
    v1::HeartbeatResponse response;
    return coordinator->Heartbeat(Context().get(), request, &response);
  }
  // The first start event of `worker_id`'s assignment stream within `timeout`.
  std::optional<v1::Assignment> NextAssignment(const std::string& worker_id,
                                               absl::Duration timeout = absl::Seconds(10)) {
    v1::WatchAssignmentsRequest request;
    request.set_worker_id(worker_id);
    request.set_incarnation("inc-" + worker_id);
    auto context = Context(timeout);
    auto reader = coordinator->WatchAssignments(context.get(), request);
    v1::WatchAssignmentsResponse event;
    while (reader->Read(&event)) {
      if (event.has_start()) {
        context->TryCancel();
        return event.start();
      }
    }
    return std::nullopt;
  }
  grpc::Status ShipLogs(const std::string& as_worker, const std::string& job_id,
                        const std::string& data) {
    v1::ShipLogsRequest request;
    request.set_worker_id(as_worker);
    request.set_job_id(job_id);
    request.set_attempt(1);
    request.set_process_index(0);
    request.set_host("host-" + as_worker);
    request.set_data(data);
    request.set_eof(true);
    v1::ShipLogsResponse response;
    return coordinator->ShipLogs(Context().get(), request, &response);
  }
  // ReadLogs of the job's latest attempt; the texts of the lines in *texts.
  grpc::Status ReadLogs(const std::string& job_id, std::vector<std::string>* texts) {
    v1::ReadLogsRequest request;
    request.set_job_id(job_id);
    auto context = Context();
    auto reader = jobs->ReadLogs(context.get(), request);
    v1::ReadLogsResponse response;
    while (reader->Read(&response)) {
      for (const v1::LogLine& line : response.lines()) texts->push_back(line.text());
    }
    return reader->Finish();
  }
  grpc::Status KeySet(const v1::Assignment& scope_of, const std::string& secret,
                      const std::string& key, const std::string& value) {
    v1::KeyValueSetRequest request;
    request.mutable_scope()->set_job_id(scope_of.job_id());
    request.mutable_scope()->set_attempt(scope_of.attempt());
    request.mutable_scope()->set_secret(secret);
    request.set_key(key);
    request.set_value(value);
    request.set_allow_overwrite(true);
    v1::KeyValueSetResponse response;
    return coordinator->KeyValueSet(Context().get(), request, &response);
  }
  grpc::Status KeyGet(const v1::Assignment& scope_of, const std::string& secret,
                      const std::string& key, std::string* value) {
    v1::KeyValueGetRequest request;
    request.mutable_scope()->set_job_id(scope_of.job_id());
    request.mutable_scope()->set_attempt(scope_of.attempt());
    request.mutable_scope()->set_secret(secret);
    request.set_key(key);
    v1::KeyValueGetResponse response;
    grpc::Status status = coordinator->KeyValueGet(Context().get(), request, &response);
    *value = response.value();
    return status;
  }
  grpc::Status BarrierIn(const v1::Assignment& scope_of, const std::string& secret) {
    v1::BarrierRequest request;
    request.mutable_scope()->set_job_id(scope_of.job_id());
    request.mutable_scope()->set_attempt(scope_of.attempt());
    request.mutable_scope()->set_secret(secret);
    request.set_barrier_id("b");
    request.set_participant(0);
    request.set_num_participants(2);
    request.mutable_timeout()->set_seconds(1);
    v1::BarrierResponse response;
    return coordinator->Barrier(Context().get(), request, &response);
  }
};

// A coordinator over mutual TLS, with a token file; certificate files re-read every second.
class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("security-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    pki_ = std::make_unique<TestPki>(dir_ + "/tls");
    bob_token_ = pki::RandomToken();
    WriteTokens({{"bob", "submitter", bob_token_}});
    std::vector<std::string> argv = {Runfile(kCoordinator),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--metrics-listen",
                                     "",
                                     "--state-dir",
                                     dir_ + "/state",
                                     "--address-file",
                                     dir_ + "/address",
                                     "--auth-config",
                                     dir_ + "/tokens.yaml",
                                     "--tls-reload-interval=1s",
                                     // Fake workers never heartbeat; their leases outlast the test.
                                     "--heartbeat-timeout=10m"};
    for (std::string& flag : pki_->CoordinatorFlags()) argv.push_back(std::move(flag));
    coordinator_argv_ = argv;
    StartCoordinator();
    admin_transport_ = pki_->Issue("admin", "admin");
    admin_ = For(admin_transport_);
  }

  // Starts the coordinator on its state directory and waits for its address.
  void StartCoordinator() {
    std::remove((dir_ + "/address").c_str());
    address_.clear();
    coordinator_ = std::make_unique<Process>(
        coordinator_argv_, absl::StrCat(dir_, "/coordinator-", ++coordinator_starts_, ".log"));
    ASSERT_TRUE(PollUntil(
        [&] {
          std::ifstream in(dir_ + "/address");
          return static_cast<bool>(std::getline(in, address_)) && !address_.empty();
        },
        absl::Seconds(30)))
        << coordinator_->Log();
  }

  void TearDown() override {
    coordinator_->Signal(SIGTERM);
    EXPECT_EQ(coordinator_->Wait(absl::Seconds(30)), 0) << coordinator_->Log();
    // Nothing outlives the test: no process still names its directory.
    EXPECT_TRUE(PollUntil([&] { return ProcessesMentioning(dir_).empty(); }, absl::Seconds(10)));
  }

  void WriteTokens(const std::vector<std::array<std::string, 3>>& tokens) {
    std::string yaml = "tokens:\n";
    for (const auto& [name, role, token] : tokens) {
      absl::StrAppend(&yaml, "- name: ", name, "\n  role: ", role, "\n  sha256: ",
                      pki::Sha256Hex(token), "\n");
    }
    const std::string path = dir_ + "/tokens.yaml";
    std::ofstream(path + ".new") << yaml;
    std::rename((path + ".new").c_str(), path.c_str());
  }

  Client For(const TransportOptions& transport) {
    Client c;
    // Its own connections: a caller never rides on another's handshake.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        MakeChannel(address_, transport, args);
    EXPECT_TRUE(channel.ok()) << channel.status();
    c.channel = *channel;
    c.jobs = v1::JobService::NewStub(c.channel);
    c.metrics = v1::MetricsService::NewStub(c.channel);
    c.coordinator = v1::CoordinatorService::NewStub(c.channel);
    return c;
  }

  Client WithToken(const std::string& token) {
    TransportOptions t;
    t.ca_file = pki_->ca_file();
    t.token_file = absl::StrCat(dir_, "/token-", ++tokens_written_);
    std::ofstream(t.token_file) << token << "\n";
    return For(t);
  }

  // The coordinator holds no job and no worker: what a refused caller must leave behind.
  void ExpectNothingDone() {
    v1::ListJobsResponse jobs;
    ASSERT_TRUE(admin_.List(&jobs).ok());
    EXPECT_EQ(jobs.jobs_size(), 0);
    v1::ListWorkersResponse workers;
    ASSERT_TRUE(admin_.Workers(&workers).ok());
    EXPECT_EQ(workers.workers_size(), 0);
  }

  std::string dir_;
  std::unique_ptr<TestPki> pki_;
  std::vector<std::string> coordinator_argv_;
  int coordinator_starts_ = 0;
  std::unique_ptr<Process> coordinator_;
  std::string address_;
  std::string bob_token_;
  int tokens_written_ = 0;
  TransportOptions admin_transport_;
  Client admin_;
};

// Logs: only the worker that ran a process ships its log; only readers read it.
TEST_F(SecurityTest, LogsComeFromTheirWorkerAndGoToReadersOnly) {
  Client w1 = For(pki_->Issue("w-1", "worker"));
  Client w2 = For(pki_->Issue("w-2", "worker"));
  ASSERT_TRUE(w1.Register("w-1").ok());
  std::string id;
  ASSERT_TRUE(admin_.Submit("logged", &id).ok());
  ASSERT_TRUE(w1.NextAssignment("w-1").has_value());  // process 0 of attempt 1 runs on w-1

  EXPECT_TRUE(w1.ShipLogs("w-1", id, "from w-1\n").ok());
  grpc::Status other = w2.ShipLogs("w-2", id, "forged\n");
  EXPECT_EQ(other.error_code(), grpc::StatusCode::PERMISSION_DENIED) << other.error_message();
  EXPECT_EQ(w2.ShipLogs("w-1", id, "forged\n").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(admin_.ShipLogs("w-1", id, "forged\n").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  std::vector<std::string> texts;
  ASSERT_TRUE(For(pki_->Issue("vera", "viewer")).ReadLogs(id, &texts).ok());
  EXPECT_EQ(texts, std::vector<std::string>({"from w-1"}));
  TransportOptions anonymous;
  anonymous.ca_file = pki_->ca_file();
  std::vector<std::string> none;
  grpc::Status nobody = For(anonymous).ReadLogs(id, &none);
  EXPECT_EQ(nobody.error_code(), grpc::StatusCode::UNAUTHENTICATED) << nobody.error_message();
  grpc::Status worker = w1.ReadLogs(id, &none);
  EXPECT_EQ(worker.error_code(), grpc::StatusCode::PERMISSION_DENIED) << worker.error_message();
  EXPECT_TRUE(none.empty());
}

// Each way in without valid credentials is shut, and leaves nothing behind.
TEST_F(SecurityTest, NoValidCredentialsNoEntry) {
  // Plaintext against the TLS port: no handshake, no call.
  Client plaintext = For(InsecureTransport());
  v1::ListJobsResponse list;
  EXPECT_EQ(plaintext.List(&list).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(plaintext.Submit("p").error_code(), grpc::StatusCode::UNAVAILABLE);

  // TLS but no client certificate and no token: every service refuses, saying what is missing.
  TransportOptions anonymous;
  anonymous.ca_file = pki_->ca_file();
  Client nobody = For(anonymous);
  for (const grpc::Status& s :
       {nobody.Submit("n"), nobody.List(&list), nobody.Query("x"), nobody.Register("w-1"),
        nobody.Heartbeat("w-1")}) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("no client certificate and no bearer token"));
  }

  // A certificate from another CA, and an expired one from ours: the handshake fails.
  TestPki other(dir_ + "/other", "another-ca");
  TransportOptions foreign = other.Issue("mallory", "admin");
  foreign.ca_file = pki_->ca_file();  // she trusts our server; we do not trust her CA
  Client mallory = For(foreign);
  EXPECT_EQ(mallory.Submit("m").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(mallory.Register("w-1").error_code(), grpc::StatusCode::UNAVAILABLE);
  const absl::Time now = absl::Now();
  Client expired =
      For(pki_->Issue("old-admin", "admin", now - absl::Hours(48), now - absl::Hours(24)));
  EXPECT_EQ(expired.Submit("e").error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(expired.Register("w-1").error_code(), grpc::StatusCode::UNAVAILABLE);

  // A token nobody was given: refused, without saying how it differs.
  Client guesser = WithToken(pki::Sha256Hex("guess"));
  grpc::Status guessed = guesser.Submit("g");
  EXPECT_EQ(guessed.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(guessed.error_message(), "the bearer token is not recognized");

  ExpectNothingDone();
}

// Viewers read, submitters submit and cancel their own jobs, admins cancel any; workers are
// not users and users are not workers.
TEST_F(SecurityTest, RolesAndOwnership) {
  ASSERT_TRUE(For(pki_->Issue("w-1", "worker")).Register("w-1").ok());
  Client viewer = For(pki_->Issue("vera", "viewer"));
  Client alice = For(pki_->Issue("alice", "submitter"));
  Client bob = WithToken(bob_token_);

  grpc::Status by_viewer = viewer.Submit("v");
  EXPECT_EQ(by_viewer.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(by_viewer.error_message(), HasSubstr("needs the role admin, submitter"));
  EXPECT_THAT(by_viewer.error_message(), HasSubstr("vera (viewer, by certificate)"));

  std::string alices, bobs;
  ASSERT_TRUE(alice.Submit("alices", &alices).ok());
  ASSERT_TRUE(bob.Submit("bobs", &bobs).ok());
  v1::ListJobsResponse list;
  ASSERT_TRUE(viewer.List(&list).ok());
  ASSERT_EQ(list.jobs_size(), 2);
  for (const v1::Job& job : list.jobs()) {
    EXPECT_EQ(job.owner(), job.id() == alices ? "alice" : "bob");
  }
  // Metrics are for readers too (the job has none yet: NOT_FOUND, not a refusal).
  const grpc::Status query = viewer.Query(alices);
  EXPECT_NE(query.error_code(), grpc::StatusCode::PERMISSION_DENIED) << query.error_message();
  EXPECT_NE(query.error_code(), grpc::StatusCode::UNAUTHENTICATED) << query.error_message();

  // A viewer cancels nothing; a submitter only its own.
  EXPECT_EQ(viewer.Cancel(alices).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  grpc::Status cross = bob.Cancel(alices);
  EXPECT_EQ(cross.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(cross.error_message(), HasSubstr("which alice submitted"));
  ASSERT_TRUE(admin_.List(&list).ok());
  for (const v1::Job& job : list.jobs()) {
    EXPECT_NE(job.state(), v1::JOB_STATE_CANCELLED) << job.id();
  }
  EXPECT_TRUE(alice.Cancel(alices).ok());
  EXPECT_TRUE(admin_.Cancel(bobs).ok());
  EXPECT_EQ(bob.Delete(alices).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(alice.Delete(alices).ok());
  EXPECT_TRUE(admin_.Delete(bobs).ok());

  // Roles do not cross between users and workers.
  Client worker = For(pki_->Issue("w-2", "worker"));
  EXPECT_EQ(worker.Submit("w").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(worker.List(&list).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(admin_.Register("w-3").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A client certificate without a role may do nothing.
  grpc::Status roleless = For(pki_->Issue("nobody", "")).List(&list);
  EXPECT_EQ(roleless.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(roleless.error_message(), HasSubstr("O=substrax:<role>"));
  // The server's own certificate is not a client's (no clientAuth): refused at the handshake.
  TransportOptions server_cert;
  server_cert.ca_file = pki_->ca_file();
  server_cert.cert_file = pki_->dir() + "/coordinator.crt";
  server_cert.key_file = pki_->dir() + "/coordinator.key";
  EXPECT_EQ(For(server_cert).List(&list).error_code(), grpc::StatusCode::UNAVAILABLE);
}

// Checkpoints are their owner's: a job writes, resumes and logs only in its submitter's
// directory under a checkpoint root; an admin may name any path there.
TEST_F(SecurityTest, CheckpointsBelongToTheirOwner) {
  ASSERT_TRUE(For(pki_->Issue("w-1", "worker")).Register("w-1", {"/ckpt"}).ok());
  Client alice = For(pki_->Issue("alice", "submitter"));
  Client bob = WithToken(bob_token_);
  v1::JobSpec spec = Spec("weights");
  spec.mutable_checkpoint()->set_directory("/ckpt/alice/run");
  std::string alices;
  ASSERT_TRUE(alice.Submit(spec, &alices).ok());

  // Bob can neither write into alice's directory (and rotate her checkpoints away with his
  // keep_last) nor resume from it (and read her weights).
  grpc::Status into = bob.Submit(spec);
  EXPECT_EQ(into.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(into.error_message(),
              HasSubstr("spec.checkpoint.directory: '/ckpt/alice/run' is not in the submitter's "
                        "own directory: a job writes and resumes checkpoints only under "
                        "/ckpt/bob"));
  v1::JobSpec resume = spec;
  resume.mutable_checkpoint()->set_directory("/ckpt/bob/run");
  resume.set_resume_from("/ckpt/alice/run");
  grpc::Status from = bob.Submit(resume);
  EXPECT_EQ(from.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(from.error_message(), HasSubstr("spec.resume_from: '/ckpt/alice/run'"));
  EXPECT_THAT(from.error_message(), HasSubstr("only under /ckpt/bob"));
  // A symbolic-looking escape is no way around it either.
  resume.set_resume_from("/ckpt/bob/../alice/run");
  EXPECT_EQ(bob.Submit(resume).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::ListJobsResponse list;
  ASSERT_TRUE(admin_.List(&list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).id(), alices);
  EXPECT_EQ(list.jobs(0).checkpoint_owner_directory(), "alice");

  // Alice resumes from her own earlier job's checkpoints; an admin may use any path.
  v1::JobSpec again = spec;
  again.mutable_checkpoint()->set_directory("/ckpt/alice/run-2");
  again.set_resume_from("/ckpt/alice/run");
  EXPECT_TRUE(alice.Submit(again).ok());
  v1::JobSpec admins = spec;
  admins.mutable_checkpoint()->set_directory("/ckpt/shared/run");
  admins.set_resume_from("/ckpt/alice/run");
  EXPECT_TRUE(admin_.Submit(admins).ok());
}

// A worker registers, heartbeats, watches and reports only as itself.
TEST_F(SecurityTest, AWorkerActsOnlyAsItself) {
  Client w1 = For(pki_->Issue("w-1", "worker"));
  Client w2 = For(pki_->Issue("w-2", "worker"));
  grpc::Status posing = w1.Register("w-2");
  EXPECT_EQ(posing.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(posing.error_message(), HasSubstr("the certificate of worker w-1 cannot act as "
                                                "worker w-2"));
  ExpectNothingDone();

  ASSERT_TRUE(w1.Register("w-1").ok());
  ASSERT_TRUE(w2.Register("w-2").ok());
  // Re-registering another worker (a new incarnation would fail its jobs) is refused too.
  EXPECT_EQ(w1.Register("w-2").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(w1.Heartbeat("w-2").error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(w1.Heartbeat("w-1").ok());

  std::string id;
  ASSERT_TRUE(admin_.Submit("owned", &id).ok());
  // One of the two runs it (the job fills one worker); the other's stream stays quiet.
  std::optional<v1::Assignment> a = w1.NextAssignment("w-1", absl::Seconds(3));
  std::optional<v1::Assignment> b = a.has_value() ? std::nullopt : w2.NextAssignment("w-2");
  ASSERT_TRUE(a.has_value() || b.has_value());
  const v1::Assignment& on = a.has_value() ? *a : *b;
  const std::string runner = a.has_value() ? "w-1" : "w-2";
  Client& own = a.has_value() ? w1 : w2;
  Client& other = a.has_value() ? w2 : w1;
  const std::string other_id = a.has_value() ? "w-2" : "w-1";

  // The other worker cannot watch this one's stream, report its steps or end its attempt.
  v1::WatchAssignmentsRequest watch;
  watch.set_worker_id(runner);
  auto context = Context();
  v1::WatchAssignmentsResponse event;
  auto reader = other.coordinator->WatchAssignments(context.get(), watch);
  EXPECT_FALSE(reader->Read(&event));
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);

  v1::ReportStepsRequest steps;
  steps.set_job_id(on.job_id());
  steps.set_attempt(on.attempt());
  v1::StepReport* r = steps.add_reports();
  r->set_step(1);
  r->set_device_id(on.local_device_ids(0));
  (*r->mutable_values())["loss"] = 1e9;
  v1::ReportStepsResponse reported;
  grpc::Status forged = other.coordinator->ReportSteps(Context().get(), steps, &reported);
  EXPECT_EQ(forged.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(forged.error_message(), HasSubstr("a worker reports only its own devices"));

  v1::ReportAttemptStatusRequest done;
  done.set_job_id(on.job_id());
  done.set_attempt(on.attempt());
  done.set_worker_id(runner);
  done.set_process_index(on.process_index());
  done.set_state(v1::RUNNER_STATE_SUCCEEDED);
  (*done.mutable_final_metrics())["test_accuracy"] = 1.0;
  v1::ReportAttemptStatusResponse ack;
  EXPECT_EQ(other.coordinator->ReportAttemptStatus(Context().get(), done, &ack).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  done.set_worker_id(other_id);  // as itself, for a process it does not run
  EXPECT_EQ(other.coordinator->ReportAttemptStatus(Context().get(), done, &ack).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  v1::GetJobRequest get;
  get.set_job_id(id);
  v1::GetJobResponse job;
  ASSERT_TRUE(admin_.jobs->GetJob(Context().get(), get, &job).ok());
  EXPECT_EQ(job.job().state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(job.job().progress().final_metrics().empty());
  // Its own runner reports fine.
  EXPECT_TRUE(own.coordinator->ReportSteps(Context().get(), steps, &reported).ok());
}

// An attempt's rendezvous keys and barriers are its own: another attempt's processes (a
// worker's credentials and that attempt's secret) can neither read nor write them.
TEST_F(SecurityTest, RendezvousIsScopedToTheAttempt) {
  Client w1 = For(pki_->Issue("w-1", "worker"));
  Client w2 = For(pki_->Issue("w-2", "worker"));
  ASSERT_TRUE(w1.Register("w-1").ok());
  ASSERT_TRUE(w2.Register("w-2").ok());
  ASSERT_TRUE(admin_.Submit("first").ok());
  ASSERT_TRUE(admin_.Submit("second").ok());
  // Each job fills one worker (2 devices).
  std::optional<v1::Assignment> a = w1.NextAssignment("w-1");
  std::optional<v1::Assignment> b = w2.NextAssignment("w-2");
  ASSERT_TRUE(a.has_value() && b.has_value());
  ASSERT_NE(a->job_id(), b->job_id());
  ASSERT_NE(a->rendezvous_secret(), b->rendezvous_secret());

  ASSERT_TRUE(w2.KeySet(*b, b->rendezvous_secret(), "gloo/0", "10.0.0.2:4000").ok());
  std::string value;
  // Attempt A's process, with its own secret, on B's scope: refused both ways.
  grpc::Status read = w1.KeyGet(*b, a->rendezvous_secret(), "gloo/0", &value);
  EXPECT_EQ(read.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(read.error_message(), HasSubstr("wrong or missing rendezvous secret"));
  EXPECT_EQ(value, "");
  EXPECT_EQ(w1.KeySet(*b, a->rendezvous_secret(), "gloo/0", "6.6.6.6:1").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(w1.KeySet(*b, "", "gloo/0", "6.6.6.6:1").error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(w1.BarrierIn(*b, a->rendezvous_secret()).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // B's key is as B wrote it.
  ASSERT_TRUE(w2.KeyGet(*b, b->rendezvous_secret(), "gloo/0", &value).ok());
  EXPECT_EQ(value, "10.0.0.2:4000");
  // A user with every role cannot touch rendezvous either.
  EXPECT_EQ(admin_.KeyGet(*b, b->rendezvous_secret(), "gloo/0", &value).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// A job's process holds its attempt's token, not its worker's certificate: with it, it reports
// and meets its peers for its own attempt only, and only while that attempt runs; everything a
// worker daemon or a user calls is refused.
TEST_F(SecurityTest, AnAttemptTokenActsOnlyForItsAttemptWhileItRuns) {
  Client w1 = For(pki_->Issue("w-1", "worker"));
  Client w2 = For(pki_->Issue("w-2", "worker"));
  ASSERT_TRUE(w1.Register("w-1").ok());
  ASSERT_TRUE(w2.Register("w-2").ok());
  std::string id;
  ASSERT_TRUE(admin_.Submit("tokened", &id).ok());
  ASSERT_TRUE(admin_.Submit("other").ok());
  // Each job fills one worker (2 devices).
  std::optional<v1::Assignment> a = w1.NextAssignment("w-1");
  std::optional<v1::Assignment> b = w2.NextAssignment("w-2");
  ASSERT_TRUE(a.has_value() && b.has_value());
  if (a->job_id() != id) std::swap(a, b);
  ASSERT_EQ(a->job_id(), id);
  ASSERT_FALSE(a->attempt_token().empty());
  ASSERT_NE(a->attempt_token(), b->attempt_token());
  Client job = WithToken(a->attempt_token());

  // Its own reports and rendezvous.
  const v1::ReportStepsRequest steps = StepOf(*a, 1);
  v1::ReportStepsResponse reported;
  grpc::Status own = job.coordinator->ReportSteps(Context().get(), steps, &reported);
  EXPECT_TRUE(own.ok()) << own.error_message();
  v1::ReportCheckpointsRequest checkpoints;
  checkpoints.set_job_id(a->job_id());
  checkpoints.set_attempt(a->attempt());
  v1::ReportCheckpointsResponse listed;
  grpc::Status checkpointed =
      job.coordinator->ReportCheckpoints(Context().get(), checkpoints, &listed);
  EXPECT_TRUE(checkpointed.ok()) << checkpointed.error_message();
  ASSERT_TRUE(job.KeySet(*a, a->rendezvous_secret(), "gloo/0", "10.0.0.1:4000").ok());
  std::string value;
  ASSERT_TRUE(job.KeyGet(*a, a->rendezvous_secret(), "gloo/0", &value).ok());
  EXPECT_EQ(value, "10.0.0.1:4000");
  // In a barrier only as its own process.
  v1::BarrierRequest barrier;
  barrier.mutable_scope()->set_job_id(a->job_id());
  barrier.mutable_scope()->set_attempt(a->attempt());
  barrier.mutable_scope()->set_secret(a->rendezvous_secret());
  barrier.set_barrier_id("b");
  barrier.set_participant(a->process_index() + 1);
  barrier.set_num_participants(2);
  barrier.mutable_timeout()->set_seconds(1);
  v1::BarrierResponse passed;
  grpc::Status posing = job.coordinator->Barrier(Context().get(), barrier, &passed);
  EXPECT_EQ(posing.error_code(), grpc::StatusCode::PERMISSION_DENIED) << posing.error_message();
  EXPECT_THAT(posing.error_message(), HasSubstr("a process takes part as its own index"));

  // Not another job's attempt, even with that attempt's secret.
  grpc::Status cross = job.KeySet(*b, b->rendezvous_secret(), "gloo/0", "6.6.6.6:1");
  EXPECT_EQ(cross.error_code(), grpc::StatusCode::PERMISSION_DENIED) << cross.error_message();
  EXPECT_THAT(cross.error_message(), HasSubstr("acts only for its own attempt"));
  v1::ReportStepsRequest theirs = steps;
  theirs.set_job_id(b->job_id());
  theirs.mutable_reports(0)->set_device_id(b->local_device_ids(0));
  EXPECT_EQ(job.coordinator->ReportSteps(Context().get(), theirs, &reported).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  // Nothing of its worker's, nothing of a user's.
  v1::ListJobsResponse list;
  v1::ReportAttemptStatusRequest done;
  done.set_job_id(a->job_id());
  done.set_attempt(a->attempt());
  done.set_worker_id("w-1");
  done.set_process_index(a->process_index());
  done.set_state(v1::RUNNER_STATE_SUCCEEDED);
  v1::ReportAttemptStatusResponse ack;
  v1::WatchAssignmentsRequest watch;
  watch.set_worker_id("w-1");
  auto watching = Context();
  auto reader = job.coordinator->WatchAssignments(watching.get(), watch);
  v1::WatchAssignmentsResponse event;
  EXPECT_FALSE(reader->Read(&event));
  for (const grpc::Status& s :
       {job.Register("w-1"), job.Heartbeat("w-1"), job.ShipLogs("w-1", id, "forged\n"),
        job.coordinator->ReportAttemptStatus(Context().get(), done, &ack), reader->Finish(),
        job.Submit("j"), job.List(&list), job.Cancel(id), job.Delete(id), job.Query(id)}) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("(job, by attempt token)"));
  }
  // A changed token is nobody's.
  std::string forged = a->attempt_token();
  forged.back() = forged.back() == '0' ? '1' : '0';
  EXPECT_EQ(WithToken(forged).coordinator->ReportSteps(Context().get(), steps, &reported)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // Once the attempt has ended the token admits nothing more.
  ASSERT_TRUE(admin_.Cancel(id).ok());
  grpc::Status ended = job.coordinator->ReportSteps(Context().get(), steps, &reported);
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::PERMISSION_DENIED) << ended.error_message();
  EXPECT_THAT(ended.error_message(), HasSubstr("valid only while that attempt runs"));
  EXPECT_THAT(ended.error_message(), HasSubstr("has ended"));
  grpc::Status late = job.KeyGet(*a, a->rendezvous_secret(), "gloo/0", &value);
  EXPECT_EQ(late.error_code(), grpc::StatusCode::PERMISSION_DENIED) << late.error_message();
  EXPECT_THAT(late.error_message(), HasSubstr("has ended"));
}

// An attempt token is stateless: a restarted coordinator (same state directory, same key)
// still admits it for the attempt that kept running.
TEST_F(SecurityTest, AnAttemptTokenOutlivesACoordinatorRestart) {
  Client w1 = For(pki_->Issue("w-1", "worker"));
  ASSERT_TRUE(w1.Register("w-1").ok());
  std::string id;
  ASSERT_TRUE(admin_.Submit("restarted", &id).ok());
  std::optional<v1::Assignment> a = w1.NextAssignment("w-1");
  ASSERT_TRUE(a.has_value());
  v1::ReportStepsResponse reported;
  grpc::Status before = WithToken(a->attempt_token())
                            .coordinator->ReportSteps(Context().get(), StepOf(*a, 1), &reported);
  ASSERT_TRUE(before.ok()) << before.error_message();

  coordinator_->Signal(SIGTERM);
  ASSERT_EQ(coordinator_->Wait(absl::Seconds(30)), 0) << coordinator_->Log();
  StartCoordinator();
  Client job = WithToken(a->attempt_token());
  grpc::Status after = job.coordinator->ReportSteps(Context().get(), StepOf(*a, 2), &reported);
  EXPECT_TRUE(after.ok()) << after.error_message() << coordinator_->Log();
  std::string value;
  ASSERT_TRUE(job.KeySet(*a, a->rendezvous_secret(), "k", "v").ok());
  ASSERT_TRUE(job.KeyGet(*a, a->rendezvous_secret(), "k", &value).ok());
  EXPECT_EQ(value, "v");
}

// Tokens and certificates change without a restart: a new token file is read, and new
// certificate files (even a new CA) are served once written.
TEST_F(SecurityTest, CredentialsRotateWithoutARestart) {
  const std::string carol = pki::RandomToken();
  v1::ListJobsResponse list;
  EXPECT_EQ(WithToken(carol).List(&list).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  WriteTokens({{"carol", "viewer", carol}});
  Client carol_client = WithToken(carol);
  EXPECT_TRUE(PollUntil([&] { return carol_client.List(&list).ok(); }, absl::Seconds(20)));
  // Bob's token was dropped by the new file.
  EXPECT_EQ(WithToken(bob_token_).List(&list).error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // A new CA and server certificate over the files the coordinator was started with.
  TestPki next(dir_ + "/next", "next-ca");
  for (const char* file : {"ca.crt", "coordinator.crt", "coordinator.key"}) {
    const std::string from = next.dir() + "/" + file, to = pki_->dir() + "/" + file;
    std::ofstream(to + ".new") << ReadFile(from);
    ASSERT_EQ(std::rename((to + ".new").c_str(), to.c_str()), 0);
  }
  TransportOptions next_admin = next.Issue("admin2", "admin");
  EXPECT_TRUE(PollUntil([&] { return For(next_admin).List(&list).ok(); }, absl::Seconds(30)))
      << coordinator_->Log();
  // Holders of the old CA's certificates are out (on a new connection; one made before the
  // rotation lives on until it closes, as TLS sessions do).
  EXPECT_EQ(For(admin_transport_).List(&list).error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace substrax::testing
