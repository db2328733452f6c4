#include "tests/load/load_harness.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "core/job_spec.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace substrax::load {
namespace {

using testing::ReadFile;

std::chrono::system_clock::time_point Deadline(absl::Duration timeout) {
  return absl::ToChronoTime(absl::Now() + timeout);
}

std::string RandomIncarnation() {
  absl::BitGen gen;
  return absl::StrCat("sim-", absl::Uniform<uint64_t>(gen));
}

}  // namespace

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

// --- SimulatedFleet ---

struct SimulatedFleet::HeartbeatCall {
  int worker = 0;
  absl::Time sent;
  grpc::ClientContext context;
  v1::HeartbeatRequest request;
  v1::HeartbeatResponse response;
};

// One worker's assignment stream. Deletes itself when the stream is done.
class SimulatedFleet::Watch : public grpc::ClientReadReactor<v1::WatchAssignmentsResponse> {
 public:
  Watch(SimulatedFleet* fleet, int w, const v1::WatchAssignmentsRequest& request)
      : fleet_(fleet), worker_(w), request_(request) {}

  void Begin() {
    fleet_->stub(worker_).async()->WatchAssignments(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is ending; OnDone follows
    fleet_->OnEvent(worker_, event_);
    StartRead(&event_);
  }
  void OnDone(const grpc::Status& status) override {
    fleet_->OnWatchDone(worker_, this, status);
    delete this;
  }

 private:
  SimulatedFleet* const fleet_;
  const int worker_;
  grpc::ClientContext context_;
  v1::WatchAssignmentsRequest request_;
  v1::WatchAssignmentsResponse event_;
};

SimulatedFleet::SimulatedFleet(const std::string& address, FleetOptions options)
    : options_(std::move(options)) {
  const int channels = std::max(1, std::min(options_.channels, options_.workers));
  for (int c = 0; c < channels; ++c) {
    // Distinct channel arguments keep gRPC from sharing one connection between the channels.
    grpc::ChannelArguments args;
    args.SetInt("substrax.load.channel", c);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        options_.channel_credentials.empty()
            ? grpc::InsecureChannelCredentials()
            : options_.channel_credentials[c % options_.channel_credentials.size()];
    stubs_.push_back(
        v1::CoordinatorService::NewStub(grpc::CreateCustomChannel(address, credentials, args)));
  }
  absl::MutexLock lock(&mu_);
  workers_.resize(options_.workers);
  for (int w = 0; w < options_.workers; ++w) {
    workers_[w].id = absl::StrCat(options_.id_prefix, "-", w);
    workers_[w].incarnation = RandomIncarnation();
    workers_[w].channel = w % channels;
  }
}

SimulatedFleet::~SimulatedFleet() { Stop(); }

v1::CoordinatorService::Stub& SimulatedFleet::stub(int w) const {
  return *stubs_[w % stubs_.size()];
}

absl::Status SimulatedFleet::Register() {
  struct Call {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    v1::RegisterWorkerResponse response;
  };
  // Shared with the callbacks, which may still be unlocking it when Register returns.
  struct Window {
    absl::Mutex mu;
    int in_flight ABSL_GUARDED_BY(mu) = 0;
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  auto window = std::make_shared<Window>();
  const int parallelism = std::max(1, options_.register_parallelism);
  for (int w = 0; w < options_.workers; ++w) {
    auto* call = new Call;
    v1::RegisterWorkerRequest& request = call->request;
    request.set_worker_id(worker_id(w));
    request.set_host(absl::StrCat(options_.id_prefix, "-host-", w));
    request.set_incarnation(incarnation(w));
    request.set_address(absl::StrCat("127.0.0.1:", 20000 + w));
    for (int d = 0; d < options_.devices_per_worker; ++d) {
      v1::Device* device = request.add_devices();
      device->set_local_index(d);
      device->set_kind(options_.device_kind);
      device->set_name(options_.device_kind == v1::DEVICE_KIND_CUDA ? "simulated gpu" : "cpu");
      device->set_memory_bytes(int64_t{1} << 30);
    }
    call->context.set_deadline(Deadline(absl::Seconds(30)));
    {
      absl::MutexLock lock(&window->mu);
      auto room = [&]() ABSL_SHARED_LOCKS_REQUIRED(window->mu) {
        return window->in_flight < parallelism;
      };
      window->mu.Await(absl::Condition(&room));
      ++window->in_flight;
    }
    const std::string id = worker_id(w);
    stub(w).async()->RegisterWorker(
        &call->context, &call->request, &call->response,
        [this, window, id, w, call](grpc::Status status) {
          delete call;
          if (!status.ok()) registrations_refused_.fetch_add(1);
          if (status.ok()) {
            absl::MutexLock lock(&mu_);
            workers_[w].registered = true;
          }
          absl::MutexLock lock(&window->mu);
          if (!status.ok() && window->first_error.ok()) {
            window->first_error = absl::UnavailableError(
                absl::StrCat("RegisterWorker ", id, ": ", status.error_message()));
          }
          --window->in_flight;
        });
  }
  absl::MutexLock lock(&window->mu);
  auto idle = [&]() ABSL_SHARED_LOCKS_REQUIRED(window->mu) { return window->in_flight == 0; };
  window->mu.Await(absl::Condition(&idle));
  return window->first_error;
}

void SimulatedFleet::Start() {
  if (options_.watch_assignments) {
    absl::MutexLock lock(&mu_);
    for (int w = 0; w < options_.workers; ++w) {
      if (workers_[w].registered) OpenWatch(w);
    }
  }
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });
}

void SimulatedFleet::Stop() {
  if (stopping_.exchange(true)) return;
  if (heartbeats_.joinable()) heartbeats_.join();
  absl::MutexLock lock(&mu_);
  for (auto& [w, watch] : watches_) watch->Cancel();
  // Callbacks run on gRPC's threads and touch this object: wait until every one has run.
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return watches_.empty() && outstanding_heartbeats_ == 0;
  };
  mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(60));
}

void SimulatedFleet::OpenWatch(int w) {
  SimWorker& worker = workers_[w];
  v1::WatchAssignmentsRequest request;
  request.set_worker_id(worker.id);
  request.set_incarnation(worker.incarnation);
  request.set_epoch(worker.epoch);
  request.set_cursor(worker.cursor);
  auto* watch = new Watch(this, w, request);
  watches_[w] = watch;
  worker.watching = true;
  watch->Begin();
}

void SimulatedFleet::HeartbeatLoop() {
  const int n = options_.workers;
  const absl::Duration interval = options_.heartbeat_interval;
  const absl::Time start = absl::Now();
  for (int64_t round = 0; !stopping_.load(); ++round) {
    for (int w = 0; w < n && !stopping_.load(); ++w) {
      // Worker w's slot in this round: the fleet's heartbeats spread over the interval.
      const absl::Time due = start + interval * round + interval * w / n;
      const absl::Duration wait = due - absl::Now();
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);  // pacing, not waiting for state
      SendHeartbeat(w);
    }
    // A stream that ended (the coordinator restarted, say) is reopened once per round.
    absl::MutexLock lock(&mu_);
    if (!options_.watch_assignments || stopping_.load()) continue;
    for (int w = 0; w < n; ++w) {
      if (!workers_[w].watching && workers_[w].registered) OpenWatch(w);
    }
  }
}

void SimulatedFleet::SendHeartbeat(int w) {
  auto* call = new HeartbeatCall;
  call->worker = w;
  {
    absl::MutexLock lock(&mu_);
    SimWorker& worker = workers_[w];
    if (!worker.registered) {
      delete call;
      return;
    }
    if (worker.heartbeat_outstanding) {
      heartbeats_skipped_.fetch_add(1);
      delete call;
      return;
    }
    worker.heartbeat_outstanding = true;
    ++outstanding_heartbeats_;
    call->request.set_worker_id(worker.id);
    call->request.set_incarnation(worker.incarnation);
    for (const auto& [job, attempt, process] : worker.runners) {
      v1::RunnerRef* runner = call->request.add_runners();
      runner->set_job_id(job);
      runner->set_attempt(attempt);
      runner->set_process_index(process);
    }
  }
  call->context.set_deadline(Deadline(options_.heartbeat_deadline));
  call->sent = absl::Now();
  stub(w).async()->Heartbeat(&call->context, &call->request, &call->response,
                             [this, call](grpc::Status status) { OnHeartbeatDone(call, status); });
}

void SimulatedFleet::OnHeartbeatDone(HeartbeatCall* call, const grpc::Status& status) {
  const absl::Duration latency = absl::Now() - call->sent;
  if (status.ok()) {
    heartbeat_latency_.Add(latency);
    heartbeats_ok_.fetch_add(1);
  } else {
    heartbeats_failed_.fetch_add(1);
  }
  absl::MutexLock lock(&mu_);
  if (status.error_code() == grpc::StatusCode::ABORTED ||
      status.error_code() == grpc::StatusCode::NOT_FOUND) {
    workers_[call->worker].declared_dead = true;
  }
  if (!status.ok() && errors_.size() < 10) {
    errors_.push_back(absl::StrCat(workers_[call->worker].id, ": code ", status.error_code(),
                                   ": ", status.error_message()));
  }
  for (const v1::StopAttempt& stop : call->response.stop()) {
    RemoveRunnerLocked(call->worker, stop.job_id(), stop.attempt());
  }
  workers_[call->worker].heartbeat_outstanding = false;
  --outstanding_heartbeats_;
  delete call;
}

void SimulatedFleet::OnEvent(int w, const v1::WatchAssignmentsResponse& event) {
  absl::MutexLock lock(&mu_);
  workers_[w].epoch = event.epoch();
  workers_[w].cursor = event.cursor();
  if (event.has_start()) {
    assignments_.push_back({w, workers_[w].id, event.start()});
  } else if (event.has_stop()) {
    RemoveRunnerLocked(w, event.stop().job_id(), event.stop().attempt());
  }
}

void SimulatedFleet::OnWatchDone(int w, Watch* watch, const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!stopping_.load()) streams_ended_.fetch_add(1);
  auto it = watches_.find(w);
  if (it != watches_.end() && it->second == watch) watches_.erase(it);
  workers_[w].watching = false;
  if (!stopping_.load() && errors_.size() < 10) {
    errors_.push_back(absl::StrCat(workers_[w].id, ": stream ended: code ", status.error_code(),
                                   ": ", status.error_message()));
  }
}

std::optional<WorkerAssignment> SimulatedFleet::NextAssignment(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto any = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !assignments_.empty(); };
  if (!mu_.AwaitWithTimeout(absl::Condition(&any), timeout)) return std::nullopt;
  WorkerAssignment next = std::move(assignments_.front());
  assignments_.pop_front();
  return next;
}

void SimulatedFleet::AddRunner(int w, const std::string& job_id, int attempt, int process) {
  absl::MutexLock lock(&mu_);
  workers_[w].runners.emplace_back(job_id, attempt, process);
}

void SimulatedFleet::RemoveRunner(int w, const std::string& job_id, int attempt, int process) {
  absl::MutexLock lock(&mu_);
  auto& runners = workers_[w].runners;
  runners.erase(std::remove(runners.begin(), runners.end(),
                            std::make_tuple(job_id, attempt, process)),
                runners.end());
}

void SimulatedFleet::RemoveRunnerLocked(int w, const std::string& job_id, int attempt) {
  auto& runners = workers_[w].runners;
  runners.erase(std::remove_if(runners.begin(), runners.end(),
                               [&](const auto& r) {
                                 return std::get<0>(r) == job_id && std::get<1>(r) == attempt;
                               }),
                runners.end());
}

grpc::Status SimulatedFleet::ReportStatus(const WorkerAssignment& a, v1::RunnerState state) {
  grpc::ClientContext context;
  context.set_deadline(Deadline(absl::Seconds(30)));
  v1::ReportAttemptStatusRequest request;
  request.set_job_id(a.assignment.job_id());
  request.set_attempt(a.assignment.attempt());
  request.set_worker_id(a.worker_id);
  request.set_process_index(a.assignment.process_index());
  request.set_state(state);
  if (state == v1::RUNNER_STATE_SUCCEEDED) (*request.mutable_final_metrics())["test_accuracy"] = 1;
  v1::ReportAttemptStatusResponse response;
  return stub(a.worker).ReportAttemptStatus(&context, request, &response);
}

int64_t SimulatedFleet::workers_declared_dead() const {
  absl::MutexLock lock(&mu_);
  return std::count_if(workers_.begin(), workers_.end(),
                       [](const SimWorker& w) { return w.declared_dead; });
}

std::vector<std::string> SimulatedFleet::heartbeat_errors() const {
  absl::MutexLock lock(&mu_);
  return errors_;
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
