#include "coordinator/server.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/server_internal.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "rpc/keepalive.h"
#include "rpc/proto_time.h"

namespace substrax {

using server_internal::ServerState;

namespace {

// How often the preemption totals are summed over every job kept (a copy of each: not at every
// tick).
constexpr absl::Duration kPreemptionTotalsInterval = absl::Seconds(15);

// The gauges of one family whose label sets come and go (the queues of a reloaded
// configuration): Set each one an update has, then Sweep removes those it did not set.
class LabeledGauges {
 public:
  LabeledGauges() = default;
  explicit LabeledGauges(prometheus::Family<prometheus::Gauge>* family) : family_(family) {}
  void Set(const prometheus::Labels& labels, double value) {
    prometheus::Gauge& gauge = family_->Add(labels);
    gauge.Set(value);
    set_.insert(&gauge);
  }
  void Sweep() {
    for (prometheus::Gauge* gauge : shown_) {
      if (set_.count(gauge) == 0) family_->Remove(gauge);
    }
    shown_ = std::move(set_);
    set_.clear();
  }

 private:
  prometheus::Family<prometheus::Gauge>* family_ = nullptr;
  std::set<prometheus::Gauge*> shown_;
  std::set<prometheus::Gauge*> set_;
};

}  // namespace

struct CoordinatorServer::Impl {
  Impl(const CoordinatorServerOptions& o, Cluster* c, Rendezvous* r, Authenticator* a)
      : state(o, c, r, a),
        coordinator_service(server_internal::MakeCoordinatorService(&state)),
        job_service(server_internal::MakeJobService(&state)),
        metrics_service(server_internal::MakeMetricsService(&state)) {}

  // Serves /metrics on options.metrics_listen. Errors: UNAVAILABLE naming the address.
  absl::Status ServeMetrics(int* port);
  void RegisterQueueGauges();
  // One gRPC server on `address` with `services` and its own resource budget.
  absl::StatusOr<std::unique_ptr<grpc::Server>> Build(
      const std::string& address, const std::vector<grpc::Service*>& services, int max_threads,
      size_t max_memory, int* port);

  // Gauges from a snapshot of the cluster; labels are bounded (states only).
  void UpdateGauges() {
    if (registry == nullptr) return;
    std::map<std::string, double> workers = {{"alive", 0}, {"dead", 0}};
    double devices = 0, busy = 0;
    const absl::Time now = absl::Now();
    for (const v1::Worker& w : state.cluster->ListWorkers()) {
      const bool alive = w.state() == v1::WORKER_STATE_ALIVE;
      workers[alive ? "alive" : "dead"] += 1;
      if (!alive) continue;
      devices += w.devices_size();
      if (!w.job_ids().empty()) busy += w.devices_size();
      // What `substraxctl doctor` judges, for alerts: per alive worker (docs/diagnosis.md).
      if (w.has_clock()) {
        clock_gauges.Set({{"worker", w.worker_id()}},
                         absl::ToDoubleSeconds(FromProtoDuration(w.clock().offset())));
      }
      if (w.has_certificate_not_after()) {
        certificate_gauges.Set(
            {{"worker", w.worker_id()}},
            absl::ToDoubleSeconds(FromProtoTime(w.certificate_not_after()) - now));
      }
    }
    clock_gauges.Sweep();
    certificate_gauges.Sweep();
    for (const auto& [state, n] : workers) worker_gauges->Add({{"state", state}}).Set(n);
    devices_gauge->Set(devices);
    busy_gauge->Set(busy);
    std::map<std::string, double> jobs;
    for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
      std::string name = v1::JobState_Name(static_cast<v1::JobState>(s)).substr(10);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      jobs[name] = 0;
    }
    for (const auto& [job_state, n] : state.cluster->JobCounts()) {
      std::string name = v1::JobState_Name(job_state).substr(10);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      jobs[name] += n;
    }
    for (const auto& [name, n] : jobs) job_gauges->Add({{"state", name}}).Set(n);
    UpdateQueueGauges();
  }

  // Per queue and backend: quota (where the configuration sets one), used and borrowed devices
  // (every pool, 0 included); per queue and priority class: pending jobs. Queues and classes
  // gone from the configuration lose their series.
  void UpdateQueueGauges() {
    const v1::ListQueuesResponse queues = state.ListQueues();
    for (const v1::QueueState& q : queues.queues()) {
      std::map<std::string, std::pair<int64_t, int64_t>> use = {{"cpu", {0, 0}}, {"cuda", {0, 0}}};
      for (const v1::QueueDevices& d : q.devices()) {
        const prometheus::Labels labels = {{"queue", q.name()}, {"backend", d.backend()}};
        if (d.has_quota()) quota_gauges.Set(labels, d.quota());
        use[d.backend()] = {d.used(), d.borrowed()};
      }
      for (const auto& [backend, n] : use) {
        used_gauges.Set({{"queue", q.name()}, {"backend", backend}}, n.first);
        borrowed_gauges.Set({{"queue", q.name()}, {"backend", backend}}, n.second);
      }
      std::map<std::string, int64_t> pending(q.pending().begin(), q.pending().end());
      for (const v1::PriorityClass& c : queues.priority_classes()) pending.emplace(c.name(), 0);
      for (const auto& [priority_class, n] : pending) {
        pending_gauges.Set({{"queue", q.name()}, {"priority_class", priority_class}}, n);
      }
    }
    for (LabeledGauges* g : {&quota_gauges, &used_gauges, &borrowed_gauges, &pending_gauges}) {
      g->Sweep();
    }
    for (const auto& [job, s] : state.cluster->Stragglers()) {
      straggler_gauges.Set({{"job", job},
                            {"device", absl::StrCat(s.device_id())},
                            {"host", s.host()},
                            {"phase", s.phase()}},
                           s.ratio());
    }
    straggler_gauges.Sweep();
    const absl::Time now = absl::Now();
    if (now - totals_at < kPreemptionTotalsInterval) return;
    totals_at = now;
    double preemptions = 0, lost = 0;
    for (const v1::Job& job : state.cluster->ListJobs({})) {
      preemptions += job.preemptions();
      lost += job.work_lost_device_seconds();
    }
    preemptions_gauge->Set(preemptions);
    work_lost_gauge->Set(lost);
  }

  // Feeds the attempts the scheduler started since the last tick to the histogram (drained
  // without metrics too, so that they do not pile up in the cluster).
  void ObservePlacements() {
    for (const Placement& p : state.cluster->TakePlacements()) {
      if (registry == nullptr) continue;
      (p.restart ? restart_latency : first_latency)->Observe(absl::ToDoubleSeconds(p.waited));
    }
  }

  ServerState state;
  std::unique_ptr<server_internal::CoordinatorServiceBase> coordinator_service;
  // Heartbeat calls of the server that hosts coordinator_service (built with it).
  std::unique_ptr<server_internal::HeartbeatServer> heartbeats;
  std::unique_ptr<v1::JobService::CallbackService> job_service;
  std::unique_ptr<v1::MetricsService::CallbackService> metrics_service;
  std::atomic<bool> ticker_stopping{false};

  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Family<prometheus::Gauge>* worker_gauges = nullptr;
  prometheus::Family<prometheus::Gauge>* job_gauges = nullptr;
  prometheus::Gauge* devices_gauge = nullptr;
  prometheus::Gauge* busy_gauge = nullptr;
  prometheus::Histogram* first_latency = nullptr;
  prometheus::Histogram* restart_latency = nullptr;
  LabeledGauges quota_gauges, used_gauges, borrowed_gauges, pending_gauges, straggler_gauges;
  LabeledGauges clock_gauges, certificate_gauges;
  prometheus::Gauge* preemptions_gauge = nullptr;
  prometheus::Gauge* work_lost_gauge = nullptr;
  absl::Time totals_at = absl::InfinitePast();
};

absl::Status CoordinatorServer::Impl::ServeMetrics(int* port) {
  const CoordinatorServerOptions& options = state.options;
  try {
    exposer = std::make_unique<prometheus::Exposer>(options.metrics_listen);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve Prometheus metrics on ",
                                               options.metrics_listen, ": ", e.what()));
  }
  registry = std::make_shared<prometheus::Registry>();
  worker_gauges = &prometheus::BuildGauge()
                       .Name("substrax_workers")
                       .Help("Worker daemons known to the coordinator, by lease state.")
                       .Register(*registry);
  job_gauges =
      &prometheus::BuildGauge().Name("substrax_jobs").Help("Jobs by state.").Register(*registry);
  auto& devices = prometheus::BuildGauge()
                      .Name("substrax_devices")
                      .Help("Devices of alive workers: all, and those running a job.")
                      .Register(*registry);
  devices_gauge = &devices.Add({{"use", "all"}});
  busy_gauge = &devices.Add({{"use", "busy"}});
  state.jobs_submitted = &prometheus::BuildCounter()
                              .Name("substrax_jobs_submitted_total")
                              .Help("Jobs accepted by SubmitJob.")
                              .Register(*registry)
                              .Add({});
  state.step_reports = &prometheus::BuildCounter()
                            .Name("substrax_step_reports_total")
                            .Help("Per-device step reports stored.")
                            .Register(*registry)
                            .Add({});
  // 10 ms to 10 min: a job placed at once takes a tick at most; one behind others waits for
  // their devices (minutes).
  const prometheus::Histogram::BucketBoundaries latency_buckets = {
      0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
  auto& latency = prometheus::BuildHistogram()
                      .Name("substrax_scheduling_latency_seconds")
                      .Help("Time a schedulable job waited for its devices, per attempt started: "
                            "from submission (attempt=first), or from the end of the restart "
                            "backoff (attempt=restart).")
                      .Register(*registry);
  first_latency = &latency.Add({{"attempt", "first"}}, latency_buckets);
  restart_latency = &latency.Add({{"attempt", "restart"}}, latency_buckets);
  RegisterQueueGauges();
  exposer->RegisterCollectable(registry);
  const std::vector<int> ports = exposer->GetListeningPorts();
  *port = ports.empty() ? 0 : ports.front();
  return absl::OkStatus();
}

void CoordinatorServer::Impl::RegisterQueueGauges() {
  auto family = [&](const char* name, const char* help) {
    return LabeledGauges(&prometheus::BuildGauge().Name(name).Help(help).Register(*registry));
  };
  quota_gauges = family("substrax_queue_quota_devices",
                        "A queue's nominal device quota per backend (where its configuration "
                        "sets one).");
  used_gauges = family("substrax_queue_used_devices",
                       "Devices held by a queue's running jobs, per backend (borrowed included).");
  borrowed_gauges = family("substrax_queue_borrowed_devices",
                           "Of a queue's used devices, those borrowed from its cohort.");
  straggler_gauges = family("substrax_job_straggler_ratio",
                            "A running job's device flagged as a straggler: its compute or data "
                            "time over the other devices' median (docs/diagnosis.md).");
  clock_gauges = family("substrax_worker_clock_offset_seconds",
                        "An alive worker's wall clock minus the coordinator's, as its agent "
                        "measured it at its last heartbeat (substraxctl doctor).");
  certificate_gauges = family("substrax_worker_certificate_expiry_seconds",
                              "Seconds until an alive worker's TLS certificate expires "
                              "(negative: expired; substraxctl doctor).");
  pending_gauges = family("substrax_queue_pending_jobs",
                          "A queue's pending jobs by priority class, as of the last scheduling "
                          "pass.");
  preemptions_gauge = &prometheus::BuildGauge()
                           .Name("substrax_jobs_preemptions")
                           .Help("Preemptions of the jobs the coordinator keeps (summed over "
                                 "them every 15 s).")
                           .Register(*registry)
                           .Add({});
  work_lost_gauge = &prometheus::BuildGauge()
                         .Name("substrax_jobs_work_lost_device_seconds")
                         .Help("Device-seconds of work lost to preemptions, summed over the jobs "
                               "the coordinator keeps every 15 s.")
                         .Register(*registry)
                         .Add({});
}

absl::StatusOr<std::unique_ptr<grpc::Server>> CoordinatorServer::Impl::Build(
    const std::string& address, const std::vector<grpc::Service*>& services, int max_threads,
    size_t max_memory, int* port) {
  grpc::ServerBuilder builder;
  // A second server on a taken port must fail, not share it (gRPC sets SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  EnableKeepalive(builder);
  // No BDP pings: gRPC's bandwidth-delay probe pings a connection after data arrives, to grow
  // its receive window, which the small messages the coordinator receives never need; with
  // 10,000 agents each heartbeating once a second those pings and their acks cost both sides
  // about a fifth of their CPU (bench/worker_fleet). The window stays at gRPC's 64 KiB.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  grpc::ResourceQuota quota(absl::StrCat("substrax-coordinator ", address));
  quota.SetMaxThreads(max_threads);
  quota.Resize(max_memory);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(state.options.max_receive_message_bytes);
  builder.AddListeningPort(address, MakeServerCredentials(state.options.transport), port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  // The authorization step: every call's decision is recorded before its reactor starts.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(state.authorizer.MakeInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(creators));
  std::unique_ptr<grpc::ServerCompletionQueue> heartbeat_queue;
  if (std::find(services.begin(), services.end(), coordinator_service.get()) != services.end()) {
    heartbeat_queue = builder.AddCompletionQueue();
  }
  std::unique_ptr<grpc::Server> built = builder.BuildAndStart();
  if (built == nullptr || *port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address,
                                               ": the address is in use or not local"));
  }
  if (heartbeat_queue != nullptr) {
    heartbeats = std::make_unique<server_internal::HeartbeatServer>(
        &state, coordinator_service.get(), std::move(heartbeat_queue));
    heartbeats->Start();
  }
  return built;
}

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options, Cluster* cluster, Rendezvous* rendezvous,
    Authenticator* auth) {
  if (options.rendezvous_key.size() < 16) {
    return absl::InvalidArgumentError("the rendezvous key must be at least 16 bytes");
  }
  SUBSTRAX_RETURN_IF_ERROR(ValidateTransport(options.transport, /*server=*/true));
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  // Attempt tokens are verified with the key the assignments' tokens are made with.
  auth->SetAttemptKey(options.rendezvous_key);
  server->impl_ = std::make_unique<Impl>(options, cluster, rendezvous, auth);
  Impl& impl = *server->impl_;
  cluster->SetAttemptEndedCallback(
      [rendezvous](const std::string& job, int attempt) { rendezvous->CloseScope({job, attempt}); });
  if (!options.metrics_listen.empty()) {
    SUBSTRAX_RETURN_IF_ERROR(impl.ServeMetrics(&server->metrics_port_));
  }
  if (!options.health_listen.empty()) {
    // Built before gRPC's default health service is switched on (it would be added to this
    // server too, twice); it reports NOT_SERVING until the services below serve.
    SUBSTRAX_ASSIGN_OR_RETURN(server->health_server_, HealthServer::Start(options.health_listen));
    server->health_server_->SetServing("", false);
  }
  grpc::EnableDefaultHealthCheckService(true);
  // One server per listener, so that each serves only its own services, each with its own
  // budget: client streams can never take what heartbeats need.
  std::vector<grpc::Service*> client_services = {impl.job_service.get(),
                                                 impl.metrics_service.get()};
  if (options.worker_listen.empty()) {
    client_services.push_back(impl.coordinator_service.get());
  } else {
    SUBSTRAX_ASSIGN_OR_RETURN(
        server->worker_server_,
        impl.Build(options.worker_listen, {impl.coordinator_service.get()},
                   options.max_worker_rpc_threads, options.max_worker_rpc_memory_bytes,
                   &server->worker_port_));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(server->server_,
                            impl.Build(options.listen, client_services, options.max_rpc_threads,
                                       options.max_rpc_memory_bytes, &server->port_));
  if (options.worker_listen.empty()) server->worker_port_ = server->port_;
  if (server->health_server_ != nullptr) server->health_server_->SetServing("", true);
  server->ticker_ = std::thread([&impl] {
    while (!impl.ticker_stopping.load()) {
      impl.state.cluster->Tick();
      impl.UpdateGauges();
      impl.ObservePlacements();
      absl::SleepFor(impl.state.options.tick_interval);  // a periodic ticker, not a wait
    }
  });
  return server;
}

void CoordinatorServer::Shutdown() {
  if (impl_ == nullptr || impl_->ticker_stopping.exchange(true)) return;
  // Streams end at once (UNAVAILABLE); unary calls get kShutdownGraceSeconds to finish.
  impl_->state.StopStreams();
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::seconds(limits::kShutdownGraceSeconds);
  if (worker_server_ != nullptr) worker_server_->Shutdown(deadline);
  if (server_ != nullptr) server_->Shutdown(deadline);
  // The servers are down: no heartbeat arrives any more.
  if (impl_->heartbeats != nullptr) impl_->heartbeats->Shutdown();
  if (health_server_ != nullptr) health_server_->Shutdown();
  if (ticker_.joinable()) ticker_.join();
  // Calls still queued for the pools are answered (the servers wait for them) before this.
  impl_->state.pool.Stop();
  impl_->state.rendezvous_pool.Stop();
}

void CoordinatorServer::SetQueuesSource(const std::string& source, absl::Time loaded,
                                        const std::string& error) {
  impl_->state.SetQueuesSource({source, loaded, error});
}

void CoordinatorServer::Wait() { server_->Wait(); }

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace substrax
