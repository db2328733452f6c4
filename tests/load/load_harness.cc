#include "tests/load/load_harness.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/job_spec.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace substrax::load {
namespace {

using testing::ReadFile;

}  // namespace

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

// --- LatencyRecorder ---

void LatencyRecorder::Add(absl::Duration latency) {
  absl::MutexLock lock(&mu_);
  samples_.push_back(latency);
}

void LatencyRecorder::AddAll(const LatencyRecorder& other) {
  std::vector<absl::Duration> samples;
  {
    absl::MutexLock lock(&other.mu_);
    samples = other.samples_;
  }
  absl::MutexLock lock(&mu_);
  samples_.insert(samples_.end(), samples.begin(), samples.end());
}

int64_t LatencyRecorder::count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(samples_.size());
}

absl::Duration LatencyRecorder::Percentile(double q) const {
  absl::MutexLock lock(&mu_);
  if (samples_.empty()) return absl::ZeroDuration();
  // Nearest rank: the smallest sample with at least q of all at or below it.
  size_t rank = static_cast<size_t>(std::ceil(q * samples_.size()));
  rank = std::clamp<size_t>(rank, 1, samples_.size());
  std::nth_element(samples_.begin(), samples_.begin() + (rank - 1), samples_.end());
  return samples_[rank - 1];
}

std::string LatencyRecorder::Summary() const {
  return absl::StrCat("n=", count(), " p50=", absl::FormatDuration(Percentile(0.5)),
                      " p99=", absl::FormatDuration(Percentile(0.99)),
                      " max=", absl::FormatDuration(Percentile(1.0)));
}

void LatencyRecorder::Clear() {
  absl::MutexLock lock(&mu_);
  samples_.clear();
}

// --- CoordinatorProcess ---

std::string ScratchDir(const std::string& name, int64_t room) {
  struct statvfs shm;
  if (statvfs("/dev/shm", &shm) == 0 &&
      static_cast<int64_t>(shm.f_bavail) * static_cast<int64_t>(shm.f_frsize) >= room) {
    std::string path = absl::StrCat("/dev/shm/substrax-", name, "-XXXXXX");
    if (mkdtemp(path.data()) != nullptr) return path;
  }
  return testing::TempDir(name);
}

std::string CoordinatorRunfile() { return testing::Runfile("coordinator/substrax-coordinator"); }

CoordinatorProcess::CoordinatorProcess(std::string binary, std::string dir,
                                       std::vector<std::string> flags, bool insecure)
    : binary_(std::move(binary)),
      dir_(std::move(dir)),
      flags_(std::move(flags)),
      insecure_(insecure) {}

CoordinatorProcess::~CoordinatorProcess() {
  if (process_ != nullptr && process_->Running()) {
    process_->Signal(SIGTERM);
    process_->Wait(absl::Seconds(30));
  }
}

absl::Status CoordinatorProcess::Start(absl::Duration timeout) {
  if (!std::filesystem::exists(binary_)) {
    return absl::FailedPreconditionError(
        absl::StrCat("no coordinator binary at ", binary_, " (build it, or name one)"));
  }
  const std::string address_file = dir_ + "/address";
  std::remove(address_file.c_str());
  std::vector<std::string> argv = {binary_,
                                   "--listen",
                                   address_.empty() ? "127.0.0.1:0" : address_,
                                   "--metrics-listen",
                                   "",
                                   "--state-dir",
                                   dir_ + "/state",
                                   "--address-file",
                                   address_file};
  // Load, not credentials, is under test (tests/security has those), unless asked.
  if (insecure_) {
    for (std::string& flag : testing::InsecureFlags()) argv.push_back(std::move(flag));
  }
  argv.insert(argv.end(), flags_.begin(), flags_.end());
  ++runs_;
  started_ = absl::Now();
  // Each run has its own log, so that a restart keeps the earlier runs'.
  process_ = std::make_unique<testing::Process>(
      argv, absl::StrCat(dir_, "/coordinator-", runs_, ".log"));
  std::string address;
  const bool up = testing::PollUntil(
      [&] {
        std::ifstream in(address_file);
        return (std::getline(in, address) && !address.empty()) || !process_->Running();
      },
      timeout);
  if (!up || address.empty()) {
    return absl::DeadlineExceededError(
        absl::StrCat("the coordinator wrote no address within ", absl::FormatDuration(timeout),
                     ":\n", Logs()));
  }
  // A restart reuses the first run's port (it was given as --listen).
  if (address_.empty()) address_ = address;
  return absl::OkStatus();
}

absl::Status CoordinatorProcess::Stop(absl::Duration timeout) {
  if (process_ == nullptr) return absl::OkStatus();
  process_->Signal(SIGTERM);
  const std::optional<int> status = process_->Wait(timeout);
  if (!status.has_value()) {
    return absl::DeadlineExceededError(
        absl::StrCat("the coordinator did not exit within ", absl::FormatDuration(timeout)));
  }
  if (*status != 0) {
    return absl::InternalError(absl::StrCat("the coordinator exited with ", *status));
  }
  return absl::OkStatus();
}

bool CoordinatorProcess::WaitServing(absl::Duration timeout) {
  auto health = grpc::health::v1::Health::NewStub(Connect(address_));
  return testing::PollUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(Deadline(absl::Seconds(2)));
        grpc::health::v1::HealthCheckRequest request;
        grpc::health::v1::HealthCheckResponse response;
        return health->Check(&context, request, &response).ok() &&
               response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
      },
      timeout);
}

int64_t CoordinatorProcess::RssBytes() const {
  std::istringstream status(ReadFile(absl::StrCat("/proc/", pid(), "/status")));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    int64_t kib = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kib)) return kib * 1024;
  }
  return -1;
}

absl::Duration CoordinatorProcess::CpuTime() const {
  // /proc/PID/stat: the command (field 2) is in parentheses and may hold spaces; utime and stime
  // are fields 14 and 15, in clock ticks.
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid(), "/stat"));
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return absl::ZeroDuration();
  std::vector<absl::string_view> fields =
      absl::StrSplit(absl::string_view(stat).substr(close + 2), ' ', absl::SkipEmpty());
  int64_t utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return absl::ZeroDuration();
  }
  return absl::Seconds(static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK));
}

std::string CoordinatorProcess::Logs() const {
  std::string all;
  for (int run = 1; run <= runs_; ++run) {
    absl::StrAppend(&all, "--- coordinator run ", run, " ---\n",
                    ReadFile(absl::StrCat(dir_, "/coordinator-", run, ".log")));
  }
  return all;
}

// --- jobs ---

v1::JobSpec LoadJobSpec(const std::string& name, int devices, int64_t steps,
                        v1::Backend backend) {
  // 8 examples per device and at least 4 batches of data, so any mesh size validates.
  const int64_t batch = int64_t{8} * devices;
  const std::string yaml = absl::StrReplaceAll(
      R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: NAME}
spec:
  model: {type: mlp, hidden_sizes: [32, 32], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: EXAMPLES, num_test_examples: 512,
                num_features: 16, noise: 0.3}
  optimizer: {type: adam, learning_rate: 0.01}
  mesh: {data_parallel_size: DEVICES}
  batch: {global_batch_size: BATCH}
  backend: BACKEND
  steps: STEPS
  report_every_steps: 10
)",
      {{"NAME", name},
       {"EXAMPLES", absl::StrCat(std::max<int64_t>(4096, 4 * batch))},
       {"DEVICES", absl::StrCat(devices)},
       {"BATCH", absl::StrCat(batch)},
       {"BACKEND", backend == v1::BACKEND_CUDA ? "cuda" : backend == v1::BACKEND_CPU ? "cpu"
                                                                                    : "auto"},
       {"STEPS", absl::StrCat(steps)}});
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml, "load.yaml");
  // The YAML above is fixed: a parse error is a bug here, not a condition to handle.
  if (!spec.ok()) {
    std::cerr << "LoadJobSpec: " << spec.status() << "\n";
    std::abort();
  }
  return *std::move(spec);
}

std::shared_ptr<grpc::Channel> Connect(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

grpc::Status SubmitJob(v1::JobService::Stub& jobs, const v1::JobSpec& spec, std::string* id,
                       absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(timeout));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  grpc::Status status = jobs.SubmitJob(&context, request, &response);
  if (status.ok()) *id = response.job().id();
  return status;
}

absl::StatusOr<std::vector<v1::Job>> ListAllJobs(v1::JobService::Stub& jobs, int page_size) {
  std::vector<v1::Job> all;
  std::string token;
  do {
    grpc::ClientContext context;
    context.set_deadline(Deadline(absl::Seconds(30)));
    v1::ListJobsRequest request;
    request.set_page_size(page_size);
    request.set_page_token(token);
    v1::ListJobsResponse response;
    const grpc::Status status = jobs.ListJobs(&context, request, &response);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("ListJobs after ", all.size(), " jobs: ",
                                                 status.error_message()));
    }
    for (v1::Job& job : *response.mutable_jobs()) all.push_back(std::move(job));
    token = response.next_page_token();
  } while (!token.empty());
  return all;
}

absl::StatusOr<std::vector<v1::Worker>> ListWorkers(v1::JobService::Stub& jobs) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(30)));
  v1::ListWorkersRequest request;
  v1::ListWorkersResponse response;
  const grpc::Status status = jobs.ListWorkers(&context, request, &response);
  if (!status.ok()) return absl::UnavailableError(status.error_message());
  return std::vector<v1::Worker>(response.workers().begin(), response.workers().end());
}

// --- ReportLoop ---

struct ReportLoop::Call {
  absl::Time sent;
  int64_t last_step = 0;
  int64_t points = 0;
  grpc::ClientContext context;
  v1::ReportStepsRequest request;
  v1::ReportStepsResponse response;
};

ReportLoop::ReportLoop(v1::CoordinatorService::Stub* stub, v1::Assignment assignment,
                       ReportLoopOptions options)
    : stub_(stub), assignment_(std::move(assignment)), options_(options) {}

ReportLoop::~ReportLoop() { Stop(); }

void ReportLoop::Start() {
  absl::MutexLock lock(&mu_);
  SendNext(1);
}

void ReportLoop::SendNext(int64_t first_step) {
  auto* call = new Call;
  call->request.set_job_id(assignment_.job_id());
  call->request.set_attempt(assignment_.attempt());
  int64_t step = first_step;
  for (int s = 0; s < options_.steps_per_request; ++s, ++step) {
    if (options_.last_step > 0 && step > options_.last_step) break;
    for (int device : assignment_.local_device_ids()) {
      v1::StepReport* report = call->request.add_reports();
      report->set_step(step);
      report->set_device_id(device);
      // A loss that falls with the step, finite (a non-finite loss fails the attempt).
      (*report->mutable_values())["loss"] = 1.0 / (1.0 + 0.001 * step);
      for (int v = 1; v < options_.values_per_report; ++v) {
        (*report->mutable_values())[absl::StrCat("metric_", v)] = 0.5;
      }
      report->set_samples_per_second(1000);
      report->set_data_wait_seconds(0.001);
      report->set_compute_seconds(0.01);
      report->set_collective_seconds(0.002);
      call->points += options_.values_per_report + 4;
    }
  }
  call->last_step = step - 1;
  outstanding_ = true;
  call->context.set_deadline(Deadline(absl::Seconds(60)));
  call->sent = absl::Now();
  stub_->async()->ReportSteps(&call->context, &call->request, &call->response,
                              [this, call](grpc::Status status) { OnDone(call, status); });
}

void ReportLoop::OnDone(Call* call, const grpc::Status& status) {
  latency_.Add(absl::Now() - call->sent);
  absl::MutexLock lock(&mu_);
  outstanding_ = false;
  if (status.ok()) {
    points_.fetch_add(call->points);
    requests_.fetch_add(1);
  } else if (error_.ok()) {
    error_ = status;
  }
  const bool finished = !status.ok() ||
                        (options_.last_step > 0 && call->last_step >= options_.last_step);
  if (finished) done_ = true;
  // Issuing the next call from the callback is non-blocking: the loop needs no thread.
  if (!finished && !stopping_) SendNext(call->last_step + 1);
  delete call;
}

void ReportLoop::Stop() {
  absl::MutexLock lock(&mu_);
  stopping_ = true;
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !outstanding_; };
  mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(90));
}

bool ReportLoop::WaitDone(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return done_; };
  return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
}

grpc::Status ReportLoop::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

}  // namespace substrax::load
