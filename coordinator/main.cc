// substrax-coordinator: the cluster's only stateful service.
//
//   substrax-coordinator --listen 0.0.0.0:7070 --worker-listen 0.0.0.0:7072
//       --tls-ca ca.crt --tls-cert coordinator.crt --tls-key coordinator.key --state-dir DIR
//
// Serves JobService and MetricsService (clients) and grpc.health.v1 on --listen, and
// CoordinatorService (workers, runners) on --worker-listen (or also on --listen without it),
// all with mutual TLS (docs/security.md); Prometheus /metrics on --metrics-listen. State (workers, jobs,
// transitions, metric points) lives in SQLite under --state-dir, so a restart loses nothing
// that was acknowledged. SIGTERM or SIGINT shut it down cleanly.
//
// Exit status: 0 after a clean shutdown; 1 cannot start (address in use, state unreadable,
// --state-dir locked by another coordinator); 2 bad command line.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "CLI/CLI.hpp"
#include "base/files.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex_mode.h"
#include "coordinator/auth.h"
#include "coordinator/cluster.h"
#include "coordinator/limits.h"
#include "coordinator/queues_file.h"
#include "coordinator/rendezvous.h"
#include "coordinator/server.h"
#include "coordinator/state_dir.h"
#include "coordinator/state_store.h"
#include "core/job_env.h"
#include "rpc/transport_flags.h"

namespace substrax {
namespace {

// Every command-line flag, as given.
struct Flags {
  CoordinatorServerOptions server;
  TransportFlags transport;
  std::string auth_config;
  std::string state_dir = "./substrax-state";
  std::string address_file;
  std::string queues;
  std::string heartbeat_interval = "1s";
  std::string heartbeat_timeout = "10s";
  std::string progress_timeout = "5m";
  std::string restart_backoff = "1s";
  std::string max_restart_backoff = "2m";
  std::string finished_job_ttl = absl::StrCat(limits::kDefaultFinishedJobTtlHours, "h");
  std::string dead_worker_retention =
      absl::StrCat(limits::kDefaultDeadWorkerRetentionHours, "h");
  ClusterOptions cluster;
};

bool ParsePositive(const std::string& name, const std::string& flag, absl::Duration* out) {
  if (absl::ParseDuration(flag, out) && *out > absl::ZeroDuration()) return true;
  std::cerr << "substrax-coordinator: " << name << ": '" << flag
            << "' is not a positive duration such as 10s\n";
  return false;
}

// The address clients should dial: the bound port on the listen host, or on 127.0.0.1 when
// listening on every interface.
std::string DialAddress(const std::string& listen, int port) {
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host.empty() || host == "0.0.0.0" || host == "[::]" || host == "::") host = "127.0.0.1";
  return absl::StrCat(host, ":", port);
}

void AddServingFlags(CLI::App& app, Flags& f) {
  app.add_option("--listen", f.server.listen, "gRPC address host:port (port 0: any free)")
      ->capture_default_str();
  app.add_option("--worker-listen", f.server.worker_listen,
                 "gRPC address host:port of the worker-facing CoordinatorService (daemons and "
                 "runners); empty: served on --listen too");
  AddTransportFlags(&app, &f.transport, TransportRole::kServer);
  app.add_option("--auth-config", f.auth_config,
                 "YAML file of bearer tokens (name, role, sha256 of the token); re-read when "
                 "it changes; see docs/security.md");
  app.add_option("--health-listen", f.server.health_listen,
                 "Plaintext gRPC address serving only grpc.health.v1 (Kubernetes probes); "
                 "empty: health on --listen only");
  app.add_option("--metrics-listen", f.server.metrics_listen,
                 "Prometheus /metrics address host:port; empty to disable")
      ->capture_default_str();
  app.add_option("--state-dir", f.state_dir,
                 "Directory of the SQLite state (0700, its files 0600); one coordinator at a "
                 "time: it holds an exclusive lock on DIR/coordinator.lock")
      ->capture_default_str();
  app.add_option("--address-file", f.address_file,
                 "Write the address clients should dial here once serving");
  app.add_option("--max-rpc-threads", f.server.max_rpc_threads,
                 "Threads the client-facing server runs calls on at once (waiting streams hold "
                 "none); calls beyond get RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-worker-rpc-threads", f.server.max_worker_rpc_threads,
                 "The same for the worker-facing server (--worker-listen), a budget of its own "
                 "so that clients never starve heartbeats")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-streams-per-caller", f.server.max_streams_per_caller,
                 "Open streams (watch, logs -f) one identity may hold at once; beyond, "
                 "RESOURCE_EXHAUSTED (workers are not counted; 0: no cap)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-calls-per-caller", f.server.max_calls_per_caller,
                 "Unary calls one identity may have in flight at once; beyond, "
                 "RESOURCE_EXHAUSTED (workers are not counted; 0: no cap)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--blocking-call-threads", f.server.blocking_call_threads,
                 "Threads that run the calls which wait for a commit of the state (register, "
                 "report, submit, ...); more such calls queue")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
}

void AddClusterFlags(CLI::App& app, Flags& f) {
  app.add_option("--heartbeat-interval", f.heartbeat_interval, "How often workers must heartbeat")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", f.heartbeat_timeout,
                 "A worker missing heartbeats this long is declared dead")
      ->capture_default_str();
  app.add_option("--progress-timeout", f.progress_timeout,
                 "An attempt one of whose processes reports no new step this long fails as "
                 "stalled (a job's spec.progress_timeout_seconds overrides it)")
      ->capture_default_str();
  app.add_option("--restart-backoff", f.restart_backoff,
                 "Wait before a failed job's first restart; it doubles with each restart")
      ->capture_default_str();
  app.add_option("--max-restart-backoff", f.max_restart_backoff,
                 "The longest wait between two attempts of a job")
      ->capture_default_str();
  // Retention and limits (docs/operations.md).
  app.add_option("--max-active-jobs", f.cluster.max_active_jobs,
                 "Pending and running jobs at most; a submit beyond gets RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-finished-jobs", f.cluster.max_finished_jobs,
                 "Ended jobs kept (with their metrics); beyond, the oldest are deleted")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--finished-job-ttl", f.finished_job_ttl,
                 "Ended jobs are deleted this long after they ended; 0: never by age")
      ->capture_default_str();
  app.add_option("--dead-worker-retention", f.dead_worker_retention,
                 "A dead worker is forgotten this long after it died (the longest dead also "
                 "when a new worker would pass the worker limit); 0: only then")
      ->capture_default_str();
  app.add_option("--metrics-raw-steps", f.cluster.metrics_raw_steps,
                 "Every metric point of an attempt's last N steps is kept; 0: keep all")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics-history-every", f.cluster.metrics_history_every,
                 "Before those, only steps that are multiples of N are kept")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--job-env-allow", f.cluster.job_env_allow,
                 "Environment variables a job's spec.program.env may set beyond the default "
                 "allowlist (docs/job-spec.md): names or prefixes ending in '*', such as "
                 "WANDB_*,HF_HOME. The loader's, shells' and interpreters' start-up variables "
                 "stay refused")
      ->delimiter(',')
      ->type_name("PATTERN,...");
  app.add_option("--log-max-bytes-per-process", f.cluster.log_max_bytes_per_process,
                 "Bytes of each job process's log kept (its newest; substraxctl logs); at least "
                 "65536, 0: unbounded")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--queues", f.queues,
                 "The queues, quotas, priority classes and scheduling policy (YAML; "
                 "docs/scheduling.md). Reread when it changes: a bad file keeps the configuration "
                 "in force and says why (log, substraxctl queues). Unset: one queue without a "
                 "quota, one priority class")
      ->type_name("FILE");
}

// The cluster's durations from their flags, and the checks across flags; false (the reason
// printed) when one is wrong.
bool FinishClusterFlags(Flags& f) {
  ClusterOptions& c = f.cluster;
  if (!ParsePositive("--heartbeat-interval", f.heartbeat_interval, &c.heartbeat_interval) ||
      !ParsePositive("--heartbeat-timeout", f.heartbeat_timeout, &c.heartbeat_timeout) ||
      !ParsePositive("--progress-timeout", f.progress_timeout, &c.default_progress_timeout) ||
      !ParsePositive("--restart-backoff", f.restart_backoff, &c.restart_backoff) ||
      !ParsePositive("--max-restart-backoff", f.max_restart_backoff, &c.max_restart_backoff)) {
    return false;
  }
  if (c.log_max_bytes_per_process != 0 &&
      c.log_max_bytes_per_process < static_cast<int64_t>(limits::kMaxLogChunkBytes)) {
    std::cerr << "substrax-coordinator: --log-max-bytes-per-process: "
              << c.log_max_bytes_per_process << " is below a shipped piece of a log ("
              << limits::kMaxLogChunkBytes << " bytes); give at least that, or 0 for no bound\n";
    return false;
  }
  if (!absl::ParseDuration(f.finished_job_ttl, &c.finished_job_ttl) ||
      c.finished_job_ttl < absl::ZeroDuration()) {
    std::cerr << "substrax-coordinator: --finished-job-ttl: '" << f.finished_job_ttl
              << "' is not a duration such as 168h (0: never by age)\n";
    return false;
  }
  if (!absl::ParseDuration(f.dead_worker_retention, &c.dead_worker_retention) ||
      c.dead_worker_retention < absl::ZeroDuration()) {
    std::cerr << "substrax-coordinator: --dead-worker-retention: '" << f.dead_worker_retention
              << "' is not a duration such as 24h (0: only to make room)\n";
    return false;
  }
  if (absl::Status s = ValidateJobEnvAllow(c.job_env_allow); !s.ok()) {
    std::cerr << "substrax-coordinator: " << s.message() << "\n";
    return false;
  }
  if (c.heartbeat_timeout <= c.heartbeat_interval) {
    std::cerr << "substrax-coordinator: --heartbeat-timeout must be longer than "
                 "--heartbeat-interval\n";
    return false;
  }
  return true;
}

// Rereads the --queues file every kQueuesPollInterval while the coordinator serves: a changed
// file is applied, a bad one logged (once) and shown by `substraxctl queues`.
class QueuesReloader {
 public:
  static constexpr absl::Duration kQueuesPollInterval = absl::Seconds(2);

  QueuesReloader(QueuesFile* file, Cluster* cluster, CoordinatorServer* server)
      : file_(file), cluster_(cluster), server_(server) {
    if (file_ == nullptr) return;
    Publish();
    thread_ = std::thread([this] {
      absl::MutexLock lock(&mu_);
      while (!stopping_) {
        // Woken early only by Stop.
        mu_.AwaitWithTimeout(absl::Condition(&stopping_), kQueuesPollInterval);
        if (stopping_) break;
        Reload();
      }
    });
  }
  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  ~QueuesReloader() { Stop(); }

 private:
  void Reload() {
    QueuesFile::Change change = file_->Poll(absl::Now());
    if (!change.refused.empty()) {
      std::cerr << "substrax-coordinator: --queues " << file_->path()
                << " was not loaded: " << change.refused
                << "; the configuration in force stays\n";
    }
    if (change.config.has_value()) {
      cluster_->SetSchedulingConfig(*change.config);
      std::cerr << "substrax-coordinator: --queues " << file_->path() << " reloaded: "
                << change.config->queues_size() << " queues, "
                << change.config->priority_classes_size() << " priority classes\n";
    }
    Publish();
  }
  // What `substraxctl queues` says of the file.
  void Publish() {
    server_->SetQueuesSource(file_->path(), file_->loaded_at(), file_->error());
  }

  QueuesFile* const file_;
  Cluster* const cluster_;
  CoordinatorServer* const server_;
  absl::Mutex mu_;
  bool stopping_ = false;
  std::thread thread_;
};

// Loads the state, serves until SIGTERM or SIGINT (blocked in `signals`), shuts down. The exit
// status.
int Serve(Flags& f, Authenticator* auth, const sigset_t& signals) {
  // Held until the process exits: a second coordinator on this directory fails here.
  auto lock = StateDirLock::Acquire(f.state_dir);
  if (!lock.ok()) {
    std::cerr << "substrax-coordinator: " << lock.status().message() << "\n";
    return 1;
  }
  std::optional<QueuesFile> queues;
  if (!f.queues.empty()) {
    absl::StatusOr<QueuesFile> loaded = QueuesFile::Load(f.queues, absl::Now());
    if (!loaded.ok()) {
      std::cerr << "substrax-coordinator: " << loaded.status().message() << "\n";
      return 1;
    }
    f.cluster.scheduling = loaded->config();
    queues.emplace(*std::move(loaded));
  }
  auto state = SqliteStateStore::Open(f.state_dir);
  if (!state.ok()) {
    std::cerr << "substrax-coordinator: " << state.status().message() << "\n";
    return 1;
  }
  // Leases and progress timeouts on the monotonic clock: a wall-clock step (NTP) must neither
  // expire a lease nor keep a dead worker's alive.
  auto cluster = Cluster::Create(
      f.cluster, [] { return absl::Now(); }, state->get(), [] {
        return absl::UnixEpoch() +
               absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
      });
  if (!cluster.ok()) {
    std::cerr << "substrax-coordinator: cannot load state from " << f.state_dir << ": "
              << cluster.status().message() << "\n";
    return 1;
  }
  auto key = LoadOrCreateKey(f.state_dir + "/rendezvous.key");
  if (!key.ok()) {
    std::cerr << "substrax-coordinator: " << key.status().message() << "\n";
    return 1;
  }
  f.server.rendezvous_key = *std::move(key);
  Rendezvous rendezvous;
  auto server = CoordinatorServer::Start(f.server, cluster->get(), &rendezvous, auth);
  if (!server.ok()) {
    std::cerr << "substrax-coordinator: " << server.status().message() << "\n";
    return 1;
  }
  const std::string address = DialAddress(f.server.listen, (*server)->port());
  if (!f.address_file.empty()) {
    // Tests and `local up` wait for this file: a write that fails must say so, not leave them
    // waiting.
    if (absl::Status s = WriteFileAtomically(f.address_file, address + "\n"); !s.ok()) {
      std::cerr << "substrax-coordinator: --address-file: " << s.message() << "\n";
      return 1;
    }
  }
  std::cerr << "substrax-coordinator: serving "
            << (f.server.transport.insecure ? "plaintext (--insecure)" : "mutual TLS") << " on "
            << address
            << (f.server.worker_listen.empty()
                    ? std::string()
                    : absl::StrCat(", workers on port ", (*server)->worker_port()))
            << (f.server.metrics_listen.empty()
                    ? std::string()
                    : ", metrics on " +
                          DialAddress(f.server.metrics_listen, (*server)->metrics_port()))
            << ", state in " << f.state_dir << "\n";
  QueuesReloader reloader(queues.has_value() ? &*queues : nullptr, cluster->get(), server->get());
  int signal = 0;
  sigwait(&signals, &signal);
  std::cerr << "substrax-coordinator: " << strsignal(signal) << ": shutting down\n";
  reloader.Stop();
  (*server)->Shutdown();
  return 0;
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  substrax::base::DisableMutexDeadlockDetectionInOptimizedBuilds();
  CLI::App app{"substrax coordinator: workers, jobs, meshes, rendezvous and metrics"};
  substrax::Flags flags;
  substrax::AddServingFlags(app, flags);
  substrax::AddClusterFlags(app, flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (absl::Status s = substrax::FinishTransportFlags(&flags.transport); !s.ok()) {
    std::cerr << "substrax-coordinator: " << s.message() << "\n";
    return 2;
  }
  flags.server.transport = flags.transport.options;
  if (absl::Status s = substrax::ValidateTransport(flags.transport.options, /*server=*/true);
      !s.ok()) {
    std::cerr << "substrax-coordinator: " << s.message() << "\n";
    return 2;
  }
  if (flags.transport.options.insecure) {
    std::cerr << substrax::InsecureWarning("substrax-coordinator") << "\n";
  }
  auto auth = substrax::Authenticator::Create(flags.transport.options.insecure, flags.auth_config);
  if (!auth.ok()) {
    std::cerr << "substrax-coordinator: " << auth.status().message() << "\n";
    return 2;
  }
  if (!substrax::FinishClusterFlags(flags)) return 2;
  // Signals go to one waiting thread; block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return substrax::Serve(flags, auth->get(), signals);
}
