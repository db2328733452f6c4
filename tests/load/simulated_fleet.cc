// The simulated worker daemons of load_harness.h: SimulatedFleet. Each worker registers, then
// heartbeats (on a HeartbeatStream, as agents do, or a Heartbeat call each) and holds its
// WatchAssignments stream, all on gRPC's callback API.
#include <algorithm>
#include <climits>
#include <memory>
#include <string>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "tests/load/load_harness.h"

namespace substrax::load {
namespace {

std::string RandomIncarnation() {
  absl::BitGen gen;
  return absl::StrCat("sim-", absl::Uniform<uint64_t>(gen));
}

}  // namespace

// One Heartbeat call on the fleet's completion queue (the tag its answer comes back with).
struct SimulatedFleet::HeartbeatCall {
  int worker = 0;
  absl::Time sent;
  grpc::ClientContext context;
  v1::HeartbeatResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::HeartbeatResponse>> reader;
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
    // Never idle: otherwise each channel arms and cancels its idle timer around every call,
    // and in a build of gRPC without NDEBUG (Debian's) each timer operation walks a debug hash
    // table of every timer in the process (10,000 channels' worth): the simulator's cost, not
    // the coordinator's, which a real agent (one channel) does not have.
    args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, INT_MAX);
    // As a real agent's channel (rpc/keepalive.h): no BDP pings.
    args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
    std::shared_ptr<grpc::ChannelCredentials> credentials =
        options_.channel_credentials.empty()
            ? grpc::InsecureChannelCredentials()
            : options_.channel_credentials[c % options_.channel_credentials.size()];
    stubs_.push_back(
        v1::CoordinatorService::NewStub(grpc::CreateCustomChannel(address, credentials, args)));
  }
  answers_ = std::thread([this] { HeartbeatAnswers(); });
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
  for (int k = 0; k < kPacingThreads; ++k) {
    heartbeats_.emplace_back([this, k] { HeartbeatLoop(k, kPacingThreads); });
  }
}

void SimulatedFleet::Stop() {
  if (stopping_.exchange(true)) return;
  for (std::thread& t : heartbeats_) t.join();
  {
    absl::MutexLock lock(&mu_);
    for (auto& [w, watch] : watches_) watch->Cancel();
    // Callbacks run on gRPC's threads and touch this object: wait until every one has run.
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return watches_.empty() && outstanding_heartbeats_ == 0;
    };
    mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(60));
  }
  // What is still outstanding (past the wait) drains through HeartbeatAnswers.
  heartbeat_queue_.Shutdown();
  answers_.join();
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

void SimulatedFleet::HeartbeatLoop(int first, int stride) {
  const int n = options_.workers;
  const absl::Duration interval = options_.heartbeat_interval;
  const absl::Time start = absl::Now();
  for (int64_t round = 0; !stopping_.load(); ++round) {
    for (int w = first; w < n && !stopping_.load(); w += stride) {
      // Worker w's slot in this round: the fleet's heartbeats spread over the interval.
      const absl::Time due = start + interval * round + interval * w / n;
      const absl::Duration wait = due - absl::Now();
      if (wait > absl::ZeroDuration()) absl::SleepFor(wait);  // pacing, not waiting for state
      SendHeartbeat(w);
    }
    // A stream that ended (the coordinator restarted, say) is reopened once per round.
    if (first != 0) continue;
    absl::MutexLock lock(&mu_);
    if (!options_.watch_assignments || stopping_.load()) continue;
    for (int w = 0; w < n; ++w) {
      if (!workers_[w].watching && workers_[w].registered) OpenWatch(w);
    }
  }
}

void SimulatedFleet::SendHeartbeat(int w) {
  auto call = std::make_unique<HeartbeatCall>();
  v1::HeartbeatRequest request;
  {
    absl::MutexLock lock(&mu_);
    SimWorker& worker = workers_[w];
    if (!worker.registered) return;
    if (worker.heartbeat_outstanding) {
      heartbeats_skipped_.fetch_add(1);
      return;
    }
    request.set_worker_id(worker.id);
    request.set_incarnation(worker.incarnation);
    for (const auto& [job, attempt, process] : worker.runners) {
      v1::RunnerRef* runner = request.add_runners();
      runner->set_job_id(job);
      runner->set_attempt(attempt);
      runner->set_process_index(process);
    }
    worker.heartbeat_outstanding = true;
    ++outstanding_heartbeats_;
  }
  call->worker = w;
  call->context.set_deadline(Deadline(options_.heartbeat_deadline));
  call->sent = absl::Now();
  call->reader = stub(w).AsyncHeartbeat(&call->context, request, &heartbeat_queue_);
  HeartbeatCall* tag = call.release();  // HeartbeatAnswers deletes it
  tag->reader->Finish(&tag->response, &tag->status, tag);
}

void SimulatedFleet::HeartbeatAnswers() {
  void* tag = nullptr;
  bool ok = false;
  while (heartbeat_queue_.Next(&tag, &ok)) {
    auto* call = static_cast<HeartbeatCall*>(tag);
    OnHeartbeatAnswer(call->worker, absl::Now() - call->sent, call->status, call->response);
    delete call;
  }
}

void SimulatedFleet::OnHeartbeatAnswer(int w, absl::Duration latency, const grpc::Status& status,
                                       const v1::HeartbeatResponse& response) {
  if (status.ok()) heartbeat_latency_.Add(latency);
  (status.ok() ? heartbeats_ok_ : heartbeats_failed_).fetch_add(1);
  absl::MutexLock lock(&mu_);
  if (status.error_code() == grpc::StatusCode::ABORTED ||
      status.error_code() == grpc::StatusCode::NOT_FOUND) {
    workers_[w].declared_dead = true;
  }
  if (!status.ok() && errors_.size() < 10) {
    errors_.push_back(absl::StrCat(workers_[w].id, ": code ", status.error_code(), ": ",
                                   status.error_message()));
  }
  for (const v1::StopAttempt& stop : response.stop()) {
    RemoveRunnerLocked(w, stop.job_id(), stop.attempt());
  }
  workers_[w].heartbeat_outstanding = false;
  --outstanding_heartbeats_;
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

}  // namespace substrax::load
