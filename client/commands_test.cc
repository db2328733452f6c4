// Drives substraxctl's command functions against a fake JobService and MetricsService on
// 127.0.0.1:0, checking stdout, stderr and exit codes. The `local` commands run this test binary
// itself as a stand-in coordinator (it serves the fake on --listen and writes --address-file)
// and as stand-in workers (`daemon`: wait for a signal); the end-to-end test with the real
// binaries lives in tests/. `plan` runs on --workers (the hybrid example reads the real
// Fashion-MNIST header; skipped where Debian's dataset-fashion-mnist is not installed) and on the
// fake's workers.
#include "client/commands.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <algorithm>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "client/local_cluster.h"
#include "client/tensorboard_export.h"
#include "core/tensorboard_writer.h"
#include "grpcpp/grpcpp.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"
#include "tensorboard/event.pb.h"

namespace substrax::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kGoodSpec[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: demo}
spec:
  model: {type: linear}
  data:
    format: synthetic
    synthetic: {task: regression, num_train_examples: 100, num_features: 4}
  optimizer: {type: sgd, learning_rate: 0.01}
  mesh: {data_parallel_size: 2}
  batch: {global_batch_size: 10}
  steps: 100
)";

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

constexpr char kHybridExample[] = "examples/fashion_mnist_mlp_hybrid.yaml";
constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// A synthetic-data mlp job on `mesh` (no data files needed).
std::string SyntheticJob(const std::string& mesh, const std::string& hidden = "[64, 32]") {
  return absl::StrCat(R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: demo}
spec:
  model: {type: mlp, hidden_sizes: )", hidden, R"(, num_classes: 10}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 100, num_features: 20}
  optimizer: {type: sgd, learning_rate: 0.1}
  mesh: )", mesh, R"(
  batch: {global_batch_size: 32}
  steps: 10
)");
}

class FakeJobService final : public v1::JobService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++submits_;
    last_spec_ = request->spec();
    if (request->spec().name() == "too-big") {
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "the mesh needs 64 devices; the cluster has 4");
    }
    *response->mutable_job() = MakeJob(request->spec().name() + "-1", v1::JOB_STATE_PENDING, 0);
    return grpc::Status::OK;
  }
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override {
    if (request->job_id() != "demo-1") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          absl::StrCat("job ", request->job_id(), " not found"));
    }
    *response->mutable_job() = MakeJob("demo-1", v1::JOB_STATE_RUNNING, 40);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override {
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
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override {
    absl::MutexLock lock(&mu_);
    last_cancel_ = *request;
    if (request->job_id() == "done-1") {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "job done-1 already SUCCEEDED");
    }
    *response->mutable_job() = MakeJob(request->job_id(), v1::JOB_STATE_CANCELLED, 40);
    return grpc::Status::OK;
  }
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse*) override {
    if (request->job_id() == "demo-1") {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "job demo-1 is RUNNING: only an ended job can be deleted");
    }
    return grpc::Status::OK;
  }
  // Two responses: a notice and a line of process 0, then a line of process 1; what it was
  // asked is kept.
  grpc::Status ReadLogs(grpc::ServerContext*, const v1::ReadLogsRequest* request,
                        grpc::ServerWriter<v1::ReadLogsResponse>* writer) override {
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
  v1::ReadLogsRequest last_logs_request;

  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::WatchJobResponse>* writer) override {
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
    send(MakeJob(id, v1::JOB_STATE_RUNNING, 100));
    v1::Job done = MakeJob(id, v1::JOB_STATE_SUCCEEDED, 100);
    (*done.mutable_progress()->mutable_final_metrics())["test_accuracy"] = 0.88123;
    send(done);
    return grpc::Status::OK;
  }
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
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
  grpc::Status GetMesh(grpc::ServerContext*, const v1::GetMeshRequest*,
                       v1::GetMeshResponse* response) override {
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

  int submits() {
    absl::MutexLock lock(&mu_);
    return submits_;
  }
  v1::JobSpec last_spec() {
    absl::MutexLock lock(&mu_);
    return last_spec_;
  }
  v1::ListJobsRequest last_list() {
    absl::MutexLock lock(&mu_);
    return last_list_;
  }
  v1::CancelJobRequest last_cancel() {
    absl::MutexLock lock(&mu_);
    return last_cancel_;
  }

 private:
  absl::Mutex mu_;
  int submits_ ABSL_GUARDED_BY(mu_) = 0;
  v1::JobSpec last_spec_ ABSL_GUARDED_BY(mu_);
  v1::ListJobsRequest last_list_ ABSL_GUARDED_BY(mu_);
  v1::CancelJobRequest last_cancel_ ABSL_GUARDED_BY(mu_);
};

class FakeMetricsService final : public v1::MetricsService::Service {
 public:
  grpc::Status QueryMetrics(grpc::ServerContext*, const v1::QueryMetricsRequest* request,
                            v1::QueryMetricsResponse* response) override {
    absl::MutexLock lock(&mu_);
    ++queries_;
    last_ = *request;
    for (const char* host : {"local-0", "local-1"}) {
      v1::MetricSeries* s = response->add_series();
      s->set_name("loss");
      s->set_group(host);
      for (int step : {100, 150}) {
        v1::MetricPoint* p = s->add_points();
        p->set_step(step);
        p->set_value(step / 1000.0);
      }
    }
    return grpc::Status::OK;
  }
  int queries() {
    absl::MutexLock lock(&mu_);
    return queries_;
  }
  v1::QueryMetricsRequest last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  absl::Mutex mu_;
  int queries_ ABSL_GUARDED_BY(mu_) = 0;
  v1::QueryMetricsRequest last_ ABSL_GUARDED_BY(mu_);
};

// Starts the fakes on 127.0.0.1:0; `*address` gets the bound address.
std::unique_ptr<grpc::Server> StartFakes(FakeJobService* jobs, FakeMetricsService* metrics,
                                         const std::string& host, std::string* address,
                                         const TransportOptions& transport = InsecureTransport()) {
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::StrCat(host, ":0"), MakeServerCredentials(transport), &port);
  builder.RegisterService(jobs);
  builder.RegisterService(metrics);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  *address = absl::StrCat(host, ":", port);
  return server;
}

class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override {
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
  void TearDown() override { server_->Shutdown(); }

  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = ::testing::TempDir();
    if (path.back() != '/') path += "/";
    path += name;
    std::ofstream(path) << text;
    return path;
  }

  FakeJobService jobs_;
  FakeMetricsService metrics_;
  std::unique_ptr<grpc::Server> server_;
  std::ostringstream out_;
  std::ostringstream err_;
  CommandContext ctx_;
  int ticks_ = 0;
};

TEST_F(CommandsTest, SubmitSendsTheParsedSpecAndPrintsTheId) {
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("good.yaml", kGoodSpec), false), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "demo-1\n");
  EXPECT_EQ(jobs_.submits(), 1);
  EXPECT_EQ(jobs_.last_spec().name(), "demo");
  EXPECT_EQ(jobs_.last_spec().report_every_steps(), 50);  // defaults applied locally
}

TEST_F(CommandsTest, SubmitOfABadSpecSendsNothingAndNamesFileLineColumn) {
  std::string bad = kGoodSpec;
  bad.replace(bad.find("data_parallel_size: 2"), 21, "data_parallel_size: 0");
  const std::string path = WriteFile("bad.yaml", bad);
  EXPECT_EQ(SubmitCommand(ctx_, path, false), kExitUsage);
  EXPECT_EQ(jobs_.submits(), 0);
  EXPECT_EQ(out_.str(), "");
  EXPECT_NE(err_.str().find("nothing was submitted"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find(path + ":10:"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("spec.mesh.data_parallel_size"), std::string::npos) << err_.str();

  err_.str("");
  EXPECT_EQ(SubmitCommand(ctx_, path + ".missing", false), kExitUsage);
  EXPECT_EQ(jobs_.submits(), 0);
}

TEST_F(CommandsTest, ServerRejectionIsPrintedWithItsCode) {
  std::string spec = kGoodSpec;
  spec.replace(spec.find("name: demo"), 10, "name: too-big");
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("big.yaml", spec), false), kExitError);
  EXPECT_EQ(err_.str(),
            "substraxctl: RESOURCE_EXHAUSTED: the mesh needs 64 devices; the cluster has 4\n");
}

TEST_F(CommandsTest, SubmitJsonPrintsTheJob) {
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("good.yaml", kGoodSpec), false), kExitOk);
  EXPECT_NE(out_.str().find("\"id\": \"demo-1\""), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("\"state\": \"JOB_STATE_PENDING\""), std::string::npos);
}

TEST_F(CommandsTest, GetShowsTheJobOrNotFound) {
  EXPECT_EQ(GetCommand(ctx_, "demo-1"), kExitOk);
  EXPECT_NE(out_.str().find("State:    RUNNING\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("Progress: step 40/100 (40.0%)\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("scheduled on 2 devices of 1 worker"), std::string::npos);
  out_.str("");
  EXPECT_EQ(GetCommand(ctx_, "nope"), kExitError);
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(), "substraxctl: NOT_FOUND: job nope not found\n");
}

TEST_F(CommandsTest, ListReadsEveryPageAndFiltersByState) {
  EXPECT_EQ(ListCommand(ctx_, "running,pending"), kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_EQ(out.rfind("ID       NAME   STATE     ATTEMPT   STEP     DEVICES   AGE\n", 0), 0u)
      << out;
  EXPECT_NE(out.find("demo-2   demo   PENDING   0         0/100"), std::string::npos) << out;
  EXPECT_NE(out.find("demo-1   demo   RUNNING   1         40/100"), std::string::npos) << out;
  ASSERT_EQ(jobs_.last_list().states_size(), 2);
  EXPECT_EQ(jobs_.last_list().states(0), v1::JOB_STATE_RUNNING);

  out_.str("");
  EXPECT_EQ(ListCommand(ctx_, "runing"), kExitUsage);
  EXPECT_NE(err_.str().find("--state: unknown state 'runing'"), std::string::npos);
}

TEST_F(CommandsTest, CancelPassesTheReason) {
  EXPECT_EQ(CancelCommand(ctx_, "demo-1", "wrong learning rate"), kExitOk);
  EXPECT_EQ(out_.str(), "demo-1 CANCELLED\n");
  EXPECT_EQ(jobs_.last_cancel().reason(), "wrong learning rate");
  EXPECT_EQ(CancelCommand(ctx_, "done-1", ""), kExitError);
  EXPECT_EQ(err_.str(), "substraxctl: FAILED_PRECONDITION: job done-1 already SUCCEEDED\n");
}

TEST_F(CommandsTest, DeleteSaysWhatWasDeletedOrWhyNot) {
  EXPECT_EQ(DeleteCommand(ctx_, "done-1"), kExitOk);
  EXPECT_EQ(out_.str(), "done-1 deleted\n");
  EXPECT_EQ(DeleteCommand(ctx_, "demo-1"), kExitError);
  EXPECT_NE(err_.str().find("FAILED_PRECONDITION: job demo-1 is RUNNING"), std::string::npos)
      << err_.str();
}

TEST_F(CommandsTest, LogsPrefixEachLineWithItsProcessAndHost) {
  LogsFlags flags;
  flags.process = 0;
  flags.tail = 3;
  flags.follow = true;
  EXPECT_EQ(LogsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "[p0 host-a] step 10/100 loss=0.5\n[p1 host-b] ready\n");
  EXPECT_THAT(err_.str(), HasSubstr("[... 10 earlier bytes dropped ...]"));
  EXPECT_TRUE(jobs_.last_logs_request.has_process_index());
  EXPECT_EQ(jobs_.last_logs_request.process_index(), 0);
  EXPECT_EQ(jobs_.last_logs_request.tail_lines(), 3);
  EXPECT_TRUE(jobs_.last_logs_request.follow());
}

TEST_F(CommandsTest, LogsOfEveryProcessAsJsonLines) {
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(LogsCommand(ctx_, "demo-1", LogsFlags()), kExitOk) << err_.str();
  EXPECT_FALSE(jobs_.last_logs_request.has_process_index());
  const std::string out = out_.str();
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_THAT(out, HasSubstr("\"text\":\"ready\""));
  EXPECT_THAT(out, HasSubstr("\"process_index\":1"));
}

TEST_F(CommandsTest, LogsRefuseBadFlagsAndReportErrors) {
  for (auto set : std::vector<std::function<void(LogsFlags&)>>{
           [](LogsFlags& f) { f.process = -2; }, [](LogsFlags& f) { f.attempt = -1; },
           [](LogsFlags& f) { f.tail = -5; }}) {
    LogsFlags flags;
    set(flags);
    EXPECT_EQ(LogsCommand(ctx_, "demo-1", flags), kExitUsage);
  }
  EXPECT_EQ(LogsCommand(ctx_, "nope-1", LogsFlags()), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("NOT_FOUND"));
}

TEST_F(CommandsTest, WatchPlainPrintsALinePerStepThenTheOutcome) {
  EXPECT_EQ(WatchCommand(ctx_, "demo-1"), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "job demo-1 PENDING: submitted\n"
            "job demo-1 RUNNING (attempt 1): scheduled on 2 devices of 1 worker\n"
            "step 0/100 (0.0%)  loss=1\n"
            "step 50/100 (50.0%)  loss=0.0196 trend=^_  eta 10s\n"
            "step 100/100 (100.0%)  loss=0.0099 trend=^-_  eta 0s\n"
            "demo-1 SUCCEEDED after 1m00s at step 100/100\n"
            "test_accuracy=0.8812\n");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, WatchOnATerminalRedrawsTheBarInPlace) {
  ctx_.terminal = true;
  ctx_.unicode = true;
  ctx_.columns = 100;
  EXPECT_EQ(WatchCommand(ctx_, "demo-1"), kExitOk);
  const std::string out = out_.str();
  EXPECT_NE(out.find("\r|"), std::string::npos) << out;
  // The loss trend: one glyph per step the stream showed (0, 50, 100); step 50 again, with
  // its loss refined to 0.6, replaces step 50's value.
  EXPECT_NE(out.find("| 50/100 50%  loss=0.0196 █▁  ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("| 50/100 50%  loss=0.6000 █▁  99 samples/s  ETA"), std::string::npos)
      << out;
  EXPECT_NE(out.find("| 100/100 100%  loss=0.0099 █▅▁"), std::string::npos) << out;
  EXPECT_NE(out.find("\x1b[K\ndemo-1 SUCCEEDED"), std::string::npos) << out;
  EXPECT_NE(out.find("█"), std::string::npos);
}

TEST_F(CommandsTest, WatchOfAFailedJobExitsOneWithTheError) {
  EXPECT_EQ(WatchCommand(ctx_, "fails-1"), kExitError);
  EXPECT_NE(out_.str().find("fails-1 FAILED after 1m00s at step 50/100\n"), std::string::npos)
      << out_.str();
  EXPECT_EQ(err_.str(),
            "substraxctl: job fails-1 FAILED: worker local-1 (host local-1) lease expired\n");
}

TEST_F(CommandsTest, WatchThatEndsEarlyOrFailsIsAnError) {
  EXPECT_EQ(WatchCommand(ctx_, "cut-1"), kExitError);
  EXPECT_NE(err_.str().find("ended the watch before job cut-1 ended (last state RUNNING)"),
            std::string::npos)
      << err_.str();
  err_.str("");
  EXPECT_EQ(WatchCommand(ctx_, "nope-1"), kExitError);
  EXPECT_EQ(err_.str(), "substraxctl: NOT_FOUND: job nope-1 not found\n");
}

TEST_F(CommandsTest, WatchJsonPrintsOneJobPerLine) {
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(WatchCommand(ctx_, "fails-1"), kExitError);
  const std::string out = out_.str();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 5) << out;
  EXPECT_EQ(out.rfind("{\"id\":\"fails-1\"", 0), 0u) << out;
}

TEST_F(CommandsTest, SubmitWatchContinuesIntoTheWatch) {
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("good.yaml", kGoodSpec), true), kExitOk);
  EXPECT_EQ(out_.str().rfind("demo-1\njob demo-1 PENDING", 0), 0u) << out_.str();
  EXPECT_NE(out_.str().find("test_accuracy=0.8812\n"), std::string::npos);
}

TEST_F(CommandsTest, MetricsSendsTheQueryAndTabulatesSeries) {
  MetricsFlags flags;
  flags.names = {"loss,accuracy", "step"};
  flags.steps = "100:";
  flags.reduce = "max";
  flags.group_by = "host";
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "STEP   loss/local-0   loss/local-1\n"
            "100    0.1000         0.1000\n"
            "150    0.1500         0.1500\n");
  const v1::QueryMetricsRequest q = metrics_.last();
  EXPECT_EQ(q.job_id(), "demo-1");
  EXPECT_EQ(std::vector<std::string>(q.names().begin(), q.names().end()),
            (std::vector<std::string>{"loss", "accuracy", "step"}));
  EXPECT_EQ(q.steps().first(), 100);
  EXPECT_EQ(q.steps().last(), 0);
  EXPECT_EQ(q.reduction(), v1::REDUCTION_MAX);
  EXPECT_EQ(q.group_by(), v1::GROUP_BY_HOST);
  EXPECT_EQ(q.attempt(), 0);
}

TEST_F(CommandsTest, MetricsTensorBoardWritesAnEventFileWithHostTags) {
  MetricsFlags flags;
  flags.group_by = "host";
  ctx_.working_directory = ::testing::TempDir();
  flags.tensorboard = "tb/run";  // relative to the working directory, created
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), ::testing::HasSubstr("wrote 2 series over 2 steps (attempt 0) to "));
  const std::string path = out_.str().substr(out_.str().find(" to ") + 4);
  std::ifstream in(path.substr(0, path.size() - 1), std::ios::binary);
  const std::string contents((std::istreambuf_iterator<char>(in)), {});
  absl::StatusOr<std::vector<std::string>> records = ParseTfRecords(contents);
  ASSERT_TRUE(records.ok()) << records.status() << " in " << path;
  ASSERT_EQ(records->size(), 3u);  // the version, steps 100 and 150
  tensorboard::Event event;
  ASSERT_TRUE(event.ParseFromString((*records)[1]));
  EXPECT_EQ(event.step(), 100);
  ASSERT_EQ(event.summary().value_size(), 2);
  EXPECT_EQ(event.summary().value(0).tag(), "loss/host_local-0");
  EXPECT_EQ(event.summary().value(1).tag(), "loss/host_local-1");
  EXPECT_EQ(event.summary().value(1).simple_value(), 0.1f);
}

TEST_F(CommandsTest, MetricsTensorBoardRefusesADirectoryItCannotCreate) {
  MetricsFlags flags;
  flags.tensorboard = WriteFile("not-a-dir", "x") + "/sub";
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitError);
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), ::testing::HasSubstr("substraxctl: --tensorboard: cannot create the "
                                               "directory " + flags.tensorboard));
}

TEST(TensorBoardTagTest, GroupsGetDeviceOrHostSuffixes) {
  v1::MetricSeries series;
  series.set_name("loss");
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_NONE), "loss");
  series.set_group("3");
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_DEVICE), "loss/device_3");
  series.set_reduction(v1::REDUCTION_NONE);  // one series per device whatever the grouping
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_HOST), "loss/device_3");
  series.set_reduction(v1::REDUCTION_MEAN);
  series.set_group("a");
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_HOST), "loss/host_a");
}

TEST_F(CommandsTest, MetricsPlotDrawsTheLossPerGroupAtTheAskedSize) {
  MetricsFlags flags;
  flags.group_by = "host";
  flags.attempt = 1;
  flags.steps = "100:";
  flags.plot = true;
  flags.width = 60;
  flags.height = 15;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  const std::string out = out_.str();
  const std::vector<std::string> lines = absl::StrSplit(absl::StripSuffix(out, "\n"), '\n');
  EXPECT_EQ(lines.size(), 15u) << out;
  for (const std::string& line : lines) EXPECT_LE(DisplayWidth(line), 60u) << line;
  EXPECT_EQ(lines.back(), "* loss/local-0   o loss/local-1") << out;
  EXPECT_THAT(out, HasSubstr("0.1500 |")) << out;
  EXPECT_THAT(out, HasSubstr("100")) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << "colour is off";
  // Without --name the chart is of the loss; the other flags pass through.
  const v1::QueryMetricsRequest q = metrics_.last();
  EXPECT_EQ(std::vector<std::string>(q.names().begin(), q.names().end()),
            std::vector<std::string>{"loss"});
  EXPECT_EQ(q.group_by(), v1::GROUP_BY_HOST);
  EXPECT_EQ(q.attempt(), 1);
  EXPECT_EQ(q.steps().first(), 100);

  // Sized to the terminal when no size is given, in colour when the context says so.
  out_.str("");
  ctx_.columns = 72;
  ctx_.rows = 30;
  ctx_.color = true;
  flags.width = flags.height = 0;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  const std::string sized = out_.str();
  EXPECT_EQ(std::count(sized.begin(), sized.end(), '\n'), 29) << sized;
  EXPECT_THAT(sized, HasSubstr(std::string(kYellow) + "oo")) << sized;
  std::vector<std::string> sized_lines = absl::StrSplit(sized, '\n');
  size_t widest = 0;
  for (const std::string& line : sized_lines) widest = std::max(widest, DisplayWidth(line));
  EXPECT_EQ(widest, 72u) << sized;  // the x-axis spans the terminal
  // Not a terminal and no $LINES: 20 lines.
  out_.str("");
  ctx_.rows = 0;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  const std::string unsized = out_.str();
  EXPECT_EQ(std::count(unsized.begin(), unsized.end(), '\n'), 20) << unsized;
}

TEST_F(CommandsTest, MetricsPlotFlagsThatCannotWorkAreUsageErrors) {
  MetricsFlags flags;
  flags.plot = true;
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--plot draws a chart for people and cannot be combined "
                                    "with -o json or -o yaml"));
  ctx_.format = OutputFormat::kYaml;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  ctx_.format = OutputFormat::kTable;
  err_.str("");
  flags.width = 10;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--width: 10 columns is too narrow for a chart; give at "
                                    "least 20"));
  flags.width = 0;
  flags.height = -3;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--height: -3 lines is too low"));
  flags.plot = false;
  flags.height = 20;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--width and --height size the chart of --plot; add --plot"));
  flags.height = 0;
  flags.plot = true;
  flags.tensorboard = "tb";
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--plot draws the series and --tensorboard writes them"));
  EXPECT_EQ(metrics_.queries(), 0);
}

TEST_F(CommandsTest, MalformedMetricsFlagsAreUsageErrorsWithoutAnRpc) {
  for (MetricsFlags flags : {MetricsFlags{{}, "", "200:100", ""}, MetricsFlags{{}, "", "x:", ""},
                             MetricsFlags{{}, "median", "", ""},
                             MetricsFlags{{}, "", "", "rack"},
                             MetricsFlags{{}, "", "", "", -1}}) {
    EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  }
  EXPECT_EQ(metrics_.queries(), 0);
  EXPECT_NE(err_.str().find("substraxctl: --steps: '200:100': the range is empty"),
            std::string::npos)
      << err_.str();
}

TEST_F(CommandsTest, WorkersAndMesh) {
  EXPECT_EQ(WorkersCommand(ctx_), kExitOk);
  EXPECT_EQ(out_.str(),
            "WORKER   HOST   STATE   DEVICES   LAST HEARTBEAT   JOBS\n"
            "w-0      w-0    ALIVE   1 cpu     0.0s ago         -\n");
  out_.str("");
  EXPECT_EQ(MeshCommand(ctx_, "demo-1"), kExitOk);
  EXPECT_EQ(out_.str().rfind("mesh (data=2): 2 devices on 2 hosts (local-0, local-1)\n", 0), 0u)
      << out_.str();
  out_.str("");
  ctx_.format = OutputFormat::kYaml;
  EXPECT_EQ(WorkersCommand(ctx_), kExitOk);
  EXPECT_EQ(out_.str().rfind("workers:\n  - worker_id: w-0\n", 0), 0u) << out_.str();
}

TEST_F(CommandsTest, PlanWithoutWorkersUsesTheCoordinatorsAliveWorkers) {
  // The fake has one worker, w-0, with one device.
  const std::string two = WriteFile("two.yaml", kGoodSpec);
  EXPECT_EQ(PlanCommand(ctx_, two, ""), kExitUsage);
  EXPECT_EQ(err_.str().rfind("substraxctl: spec.mesh: data-parallel mesh of 2 devices, but only 1 "
                             "are available",
                             0),
            0u)
      << err_.str();
  EXPECT_NE(err_.str().find("the alive workers at " + ctx_.coordinator), std::string::npos);

  err_.str("");
  std::string one = kGoodSpec;
  one.replace(one.find("data_parallel_size: 2"), 21, "data_parallel_size: 1");
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("one.yaml", one), ""), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("mesh (data=1): 1 device on 1 host (w-0)\n"), std::string::npos)
      << out_.str();
  EXPECT_EQ(jobs_.submits(), 0);
}

TEST_F(CommandsTest, UnreachableCoordinatorExitsThreeNamingTheAddress) {
  server_->Shutdown();
  const std::string address = ctx_.coordinator;
  EXPECT_EQ(ListCommand(ctx_, ""), kExitUnreachable);
  EXPECT_EQ(err_.str().rfind("substraxctl: UNAVAILABLE: ", 0), 0u) << err_.str();
  EXPECT_NE(err_.str().find("cannot reach the coordinator at " + address +
                            "; start a local cluster with `substraxctl local up`"),
            std::string::npos)
      << err_.str();
  err_.str("");
  EXPECT_EQ(WatchCommand(ctx_, "demo-1"), kExitUnreachable);
  EXPECT_NE(err_.str().find("cannot reach the coordinator"), std::string::npos);
}

TEST_F(CommandsTest, PlanOfAProgramJobIsItsMeshAndBatch) {
  const std::string path = WriteFile("program.yaml", R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: prog}
spec:
  program: {path: /opt/p/train, args: [--fast]}
  mesh: {data_parallel_size: 4}
  batch: {global_batch_size: 64}
)");
  ASSERT_EQ(PlanCommand(ctx_, path, "2x2"), kExitOk) << err_.str();
  EXPECT_EQ(err_.str(), "");
  EXPECT_THAT(out_.str(), HasSubstr("plan of job prog on 4 devices of --workers 2x2\n"
                                    "program: /opt/p/train --fast; 16 examples per device per "
                                    "step\n"));
  EXPECT_THAT(out_.str(), HasSubstr("mesh (data=4)"));
  EXPECT_THAT(out_.str(), HasSubstr("the program's own (not planned)"));
}

TEST_F(CommandsTest, PlanHybridExampleOnTwoWorkersOfTwo) {
  if (!std::ifstream(kFashionMnist).good()) {
    GTEST_SKIP() << kFashionMnist << " is not installed (Debian's dataset-fashion-mnist)";
  }
  ASSERT_EQ(PlanCommand(ctx_, kHybridExample, "2x2"), kExitOk) << err_.str();
  EXPECT_EQ(err_.str(), "");
  EXPECT_EQ(out_.str(),
            R"(plan of job fashion-mnist-mlp-hybrid on 4 devices of --workers 2x2
model: mlp 784 -> 512 -> 256 -> 10 (535818 parameters, 2.04 MiB), adam; 64 examples per device per step

mesh (data=2, model=2): 4 devices on 2 hosts (worker-0, worker-1)
          model=0            model=1
  data=0  d0 worker-0/cpu:0  d1 worker-0/cpu:1
  data=1  d2 worker-1/cpu:0  d3 worker-1/cpu:1

  PARAMETER        GLOBAL SHAPE   SPEC              SHARD SHAPE   SHARD BYTES   REPLICAS   GRADIENT REDUCED OVER
  dense_0/kernel   (784, 512)     (None, 'model')   (784, 256)    784 KiB       2          data
  dense_0/bias     (512,)         ('model',)        (256,)        1.00 KiB      2          data
  dense_1/kernel   (512, 256)     ('model', None)   (256, 256)    256 KiB       2          data
  dense_1/bias     (256,)         ()                (256,)        1.00 KiB      4          data, model
  dense_2/kernel   (256, 10)      ()                (256, 10)     10.0 KiB      4          data, model
  dense_2/bias     (10,)          ()                (10,)         40 B          4          data, model

  MEMORY PER DEVICE   BYTES      HOW
  parameters          1.03 MiB   this device's blocks, float32
  gradients           1.03 MiB   as parameters
  optimizer state     2.05 MiB   adam: 2 x parameters
  activations         261 KiB    2 x batch 64 x (256 + 256 + 10) x 4 B, forward and backward
  total               4.36 MiB

  AXIS    GROUP   ALL-REDUCE PER STEP          COUNT   BYTES PER DEVICE
  data    2       gradients (mean)             6       1.03 MiB
  model   2       gradients (mean)             3       11.0 KiB
  model   2       activations, forward (sum)   1       64.0 KiB
)");
}

TEST_F(CommandsTest, PlanHybridExampleAsJsonAndYaml) {
  if (!std::ifstream(kFashionMnist).good()) {
    GTEST_SKIP() << kFashionMnist << " is not installed (Debian's dataset-fashion-mnist)";
  }
  ctx_.format = OutputFormat::kJson;
  ASSERT_EQ(PlanCommand(ctx_, kHybridExample, "2x2"), kExitOk) << err_.str();
  const std::string json = out_.str();
  EXPECT_THAT(json, StartsWith("{\n  \"job\": \"fashion-mnist-mlp-hybrid\",\n  \"mesh\": {\n"));
  EXPECT_THAT(json, HasSubstr(R"j("name": "dense_0/kernel",
      "global_shape": [784, 512],
      "partition_spec": "(None, 'model')",
      "shard_shape": [784, 256],
      "shard_bytes": 802816,
      "replicas": 2,
      "gradient_axes": ["data"])j"));
  EXPECT_THAT(json, HasSubstr("\"model_param_bytes\": 2143272,"));
  EXPECT_THAT(json, HasSubstr("\"activations\": 267264,"));

  out_.str("");
  ctx_.format = OutputFormat::kYaml;
  ASSERT_EQ(PlanCommand(ctx_, kHybridExample, "2x2"), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), StartsWith("job: fashion-mnist-mlp-hybrid\nmesh:\n"));
  EXPECT_THAT(out_.str(), HasSubstr("    partition_spec: (None, 'model')\n"));
}

TEST_F(CommandsTest, PlanMeshesTheDevicesCannotHoldFailAsSubmitWouldWithExitTwo) {
  struct Case {
    std::string mesh;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"{data_parallel_size: 8}",
            "substraxctl: spec.mesh: data-parallel mesh of 8 devices, but only 4 are available"},
           {"{num_devices: 4}",
            "substraxctl: spec.mesh: model-parallel mesh of 4 devices must lie on one host"},
       }) {
    out_.str("");
    err_.str("");
    EXPECT_EQ(PlanCommand(ctx_, WriteFile("mesh.yaml", SyntheticJob(c.mesh)), "2x2"), kExitUsage)
        << c.mesh;
    EXPECT_THAT(err_.str(), StartsWith(c.message));
    EXPECT_THAT(err_.str(), HasSubstr("job demo cannot run on the 4 devices of --workers 2x2"));
    EXPECT_EQ(out_.str(), "");
  }
  // Cross-host placement when the spec asks for it.
  EXPECT_EQ(PlanCommand(ctx_,
                        WriteFile("cross.yaml", SyntheticJob("{num_devices: 4, "
                                                             "allow_cross_host_model_axis: true}")),
                        "2x2"),
            kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("mesh (model=4): 4 devices on 2 hosts (worker-0, worker-1)"));

  // A width the model axis does not divide: the spec itself is invalid, with its field path.
  err_.str("");
  const std::string path = WriteFile(
      "odd.yaml",
      SyntheticJob("{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}", "[63, 32]"));
  EXPECT_EQ(PlanCommand(ctx_, path, "2x2"), kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("substraxctl: invalid job spec:\n" + path + ":"));
  EXPECT_THAT(err_.str(),
              HasSubstr("spec.model.hidden_sizes[0]: 63 does not divide over the model axis"));
}

TEST_F(CommandsTest, PlanUnreadableDataNamesTheFileAndWhereToRun) {
  std::string spec = SyntheticJob("{data_parallel_size: 2}");
  spec.replace(spec.find("    format: synthetic"), std::string::npos, R"(    format: idx
    train: {images: /nonexistent/train-images.gz, labels: /nonexistent/train-labels.gz}
  optimizer: {type: sgd, learning_rate: 0.1}
  mesh: {data_parallel_size: 2}
  batch: {global_batch_size: 32}
  steps: 10
)");
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("idx.yaml", spec), "2x2"), kExitError) << err_.str();
  EXPECT_THAT(err_.str(), StartsWith("substraxctl: spec.data.train.images: cannot read "
                                     "/nonexistent/train-images.gz ("));
  EXPECT_THAT(err_.str(), HasSubstr("run this where the data is"));
}

TEST_F(CommandsTest, PlanBadWorkersFlagIsUsage) {
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("ok.yaml", SyntheticJob("{data_parallel_size: 2}")), "2"),
            kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("substraxctl: --workers: '2' is not WORKERSxDEVICES"));
}

TEST_F(CommandsTest, PlanWithoutWorkersAndAnUnreachableCoordinatorSuggestsTheFlag) {
  server_->Shutdown();
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("ok.yaml", SyntheticJob("{data_parallel_size: 2}")), ""),
            kExitUnreachable);
  EXPECT_THAT(err_.str(), HasSubstr("cannot reach the coordinator at " + ctx_.coordinator));
  EXPECT_THAT(err_.str(), HasSubstr("--workers 2x2"));
}

// `local up|status|down` with this binary standing in for the coordinator and the workers.
TEST(LocalClusterCommandsTest, UpStatusDownAndRestartAfterDeath) {
  std::string dir = ::testing::TempDir();
  if (dir.back() != '/') dir += "/";
  dir += "local";
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  setenv("FAKE_LOCAL_WORKERS", "2", 1);

  std::ostringstream out, err;
  CommandContext ctx;
  ctx.out = &out;
  ctx.err = &err;
  LocalFlags flags;
  flags.state_dir = dir;
  flags.coordinator_binary = std::string(self, static_cast<size_t>(n));
  flags.worker_binary = flags.coordinator_binary;
  flags.start_timeout = absl::Seconds(30);

  ASSERT_EQ(LocalUpCommand(ctx, flags), kExitOk) << err.str();
  std::ifstream address_file(AddressFilePath(dir));
  std::string address;
  std::getline(address_file, address);
  EXPECT_EQ(out.str(), absl::StrCat("export SUBSTRAX_COORDINATOR=", address,
                                    " SUBSTRAX_TLS_CA=", dir, "/tls/ca.crt SUBSTRAX_TLS_CERT=",
                                    dir, "/tls/admin.crt SUBSTRAX_TLS_KEY=", dir,
                                    "/tls/admin.key\n"));
  // The admin's key is the user's alone.
  struct stat key;
  ASSERT_EQ(stat((dir + "/tls/admin.key").c_str(), &key), 0);
  EXPECT_EQ(key.st_mode & 0777, 0600);
  EXPECT_NE(err.str().find("local cluster up: coordinator at " + address), std::string::npos);
  absl::StatusOr<std::vector<LocalProcess>> processes = ReadPidFile(dir);
  ASSERT_TRUE(processes.ok()) << processes.status();
  ASSERT_EQ(processes->size(), 3u);
  EXPECT_EQ((*processes)[0].name, "coordinator");
  EXPECT_EQ((*processes)[2].name, "local-1");

  // Already up: says so, changes nothing.
  out.str("");
  err.str("");
  EXPECT_EQ(LocalUpCommand(ctx, flags), kExitError);
  EXPECT_NE(err.str().find("already running in " + dir + " (coordinator at " + address +
                           "), 3 of 3 processes alive"),
            std::string::npos)
      << err.str();

  out.str("");
  EXPECT_EQ(LocalStatusCommand(ctx, flags), kExitOk) << err.str();
  EXPECT_NE(out.str().find("coordinator address: " + address), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("local-1       "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("alive"), std::string::npos);
  EXPECT_NE(out.str().find("WORKER    HOST      STATE"), std::string::npos) << out.str();

  // A dead cluster (killed behind our back) is cleaned up by the next `up`.
  for (const LocalProcess& p : *processes) kill(p.pid, SIGKILL);
  for (const LocalProcess& p : *processes) {
    for (int i = 0; i < 500 && IsAlive(p); ++i) usleep(10000);
  }
  out.str("");
  EXPECT_EQ(LocalStatusCommand(ctx, flags), kExitError);
  EXPECT_NE(out.str().find("dead"), std::string::npos) << out.str();
  err.str("");
  ASSERT_EQ(LocalUpCommand(ctx, flags), kExitOk) << err.str();
  EXPECT_NE(err.str().find("is gone; starting a new one"), std::string::npos) << err.str();

  processes = ReadPidFile(dir);
  ASSERT_TRUE(processes.ok());
  err.str("");
  EXPECT_EQ(LocalDownCommand(ctx, flags), kExitOk);
  EXPECT_NE(err.str().find("stopped coordinator (pid "), std::string::npos) << err.str();
  for (const LocalProcess& p : *processes) EXPECT_FALSE(IsAlive(p)) << p.name;
  EXPECT_EQ(ReadPidFile(dir).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::ifstream(AddressFilePath(dir)).good());
  err.str("");
  EXPECT_EQ(LocalDownCommand(ctx, flags), kExitOk);
  EXPECT_NE(err.str().find("nothing to stop"), std::string::npos);
}

TEST(LocalClusterCommandsTest, MissingBinaryNamesWhatToBuild) {
  std::ostringstream out, err;
  CommandContext ctx;
  ctx.out = &out;
  ctx.err = &err;
  LocalFlags flags;
  flags.state_dir = std::string(::testing::TempDir()) + "/nobin";
  flags.self_dir = "/nonexistent/bazel-bin/client";
  EXPECT_EQ(LocalUpCommand(ctx, flags), kExitError);
  EXPECT_NE(err.str().find("cannot find substrax-coordinator (looked at "
                           "/nonexistent/bazel-bin/client/substrax-coordinator, "
                           "/nonexistent/bazel-bin/coordinator/substrax-coordinator); build it "
                           "with `bazel build //coordinator:substrax-coordinator`"),
            std::string::npos)
      << err.str();
}

// Stand-in coordinator: serves the fakes on --listen's host, writes the bound address to
// --address-file, runs until a signal ends it.
int FakeCoordinatorMain(int argc, char** argv) {
  std::string address_file;
  // Serves mutual TLS with the credentials `local up` made, as the real coordinator would.
  TransportOptions transport;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--address-file" && i + 1 < argc) address_file = argv[i + 1];
    if (absl::StartsWith(arg, "--tls-ca=")) transport.ca_file = arg.substr(9);
    if (absl::StartsWith(arg, "--tls-cert=")) transport.cert_file = arg.substr(11);
    if (absl::StartsWith(arg, "--tls-key=")) transport.key_file = arg.substr(10);
  }
  FakeJobService jobs;
  FakeMetricsService metrics;
  std::string address;
  std::unique_ptr<grpc::Server> server =
      StartFakes(&jobs, &metrics, "127.0.0.1", &address, transport);
  {
    std::ofstream out(address_file + ".tmp");
    out << address << "\n";
  }
  std::rename((address_file + ".tmp").c_str(), address_file.c_str());
  server->Wait();
  return 0;
}

}  // namespace
}  // namespace substrax::ctl

int main(int argc, char** argv) {
  // This binary is also the local-cluster test's coordinator and workers.
  if (argc > 1 && std::string(argv[1]) == "--listen") {
    return substrax::ctl::FakeCoordinatorMain(argc, argv);
  }
  if (argc > 1 && std::string(argv[1]) == "daemon") {
    pause();  // until SIGTERM
    return 0;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
