// What the tests of substraxctl's commands share (commands_*_test.cc, local_commands_test.cc):
// a fake JobService and MetricsService on 127.0.0.1:0, and a fixture whose CommandContext talks
// to them and captures stdout and stderr.
#ifndef SUBSTRAX_CLIENT_COMMANDS_TEST_UTIL_H_
#define SUBSTRAX_CLIENT_COMMANDS_TEST_UTIL_H_

#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/commands.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/transport.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"

namespace substrax::ctl {

// A valid job spec, as YAML: linear regression on synthetic data, 2 data-parallel devices
// (spec.mesh on line 10).
std::string GoodSpecYaml();

// A job `id` of the spec above in `state` at `step` of 100, with its transitions.
v1::Job MakeJob(const std::string& id, v1::JobState state, int64_t step);

// Answers as a coordinator would for jobs demo-1 (running), demo-2 (pending), done-1 (ended),
// nope-1 (unknown), fails-1 and cut-1 (watches that fail or end early), and keeps what it
// was asked.
class FakeJobService final : public v1::JobService::Service {
 public:
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse*) override;
  // Two responses: a notice and a line of process 0, then a line of process 1; what it was
  // asked is kept.
  grpc::Status ReadLogs(grpc::ServerContext*, const v1::ReadLogsRequest* request,
                        grpc::ServerWriter<v1::ReadLogsResponse>* writer) override;
  v1::ReadLogsRequest last_logs_request;

  grpc::Status WatchJob(grpc::ServerContext*, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::WatchJobResponse>* writer) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override;
  grpc::Status GetMesh(grpc::ServerContext*, const v1::GetMeshRequest*,
                       v1::GetMeshResponse* response) override;
  // Queues research (cohort lab, cpu 16, 2 high and 5 low pending) and vision (nothing yet),
  // classes high and low, from /etc/substrax/queues.yaml whose last reload was refused.
  grpc::Status ListQueues(grpc::ServerContext*, const v1::ListQueuesRequest*,
                          v1::ListQueuesResponse* response) override;

  int submits() {
    absl::MutexLock lock(&mu_);
    return submits_;
  }
  // The next `n` SubmitJob calls fail with `code` (as a coordinator that is restarting would).
  void FailNextSubmits(int n, grpc::StatusCode code = grpc::StatusCode::UNAVAILABLE) {
    absl::MutexLock lock(&mu_);
    fail_submits_ = n;
    fail_code_ = code;
  }
  // SubmitJobRequest.request_id of every SubmitJob so far.
  std::vector<std::string> request_ids() {
    absl::MutexLock lock(&mu_);
    return request_ids_;
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
  int fail_submits_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::StatusCode fail_code_ ABSL_GUARDED_BY(mu_) = grpc::StatusCode::UNAVAILABLE;
  std::vector<std::string> request_ids_ ABSL_GUARDED_BY(mu_);
  v1::JobSpec last_spec_ ABSL_GUARDED_BY(mu_);
  v1::ListJobsRequest last_list_ ABSL_GUARDED_BY(mu_);
  v1::CancelJobRequest last_cancel_ ABSL_GUARDED_BY(mu_);
};

// Answers every query with a loss series for hosts local-0 and local-1 at steps 100 and 150.
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
        // One of local-1's two devices has not reported step 150 yet.
        const bool partial = step == 150 && std::string(host) == "local-1";
        p->set_num_values(partial ? 1 : 2);
        p->set_expected_values(2);
        p->set_partial(partial);
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

// Starts the fakes on `host`:0; `*address` gets the bound address.
std::unique_ptr<grpc::Server> StartFakes(FakeJobService* jobs, FakeMetricsService* metrics,
                                         const std::string& host, std::string* address,
                                         const TransportOptions& transport = InsecureTransport());

// A CommandContext against the fakes, writing to `out_` and `err_`, in UTC, on a clock that
// advances 10 s at each reading.
class CommandsTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // Writes `text` to `name` under the test's temporary directory; its path.
  std::string WriteFile(const std::string& name, const std::string& text);

  FakeJobService jobs_;
  FakeMetricsService metrics_;
  std::unique_ptr<grpc::Server> server_;
  std::ostringstream out_;
  std::ostringstream err_;
  CommandContext ctx_;
  int ticks_ = 0;
};

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_COMMANDS_TEST_UTIL_H_
