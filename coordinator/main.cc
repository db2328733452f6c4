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
// Exit status: 0 after a clean shutdown; 1 cannot start (address in use, state unreadable);
// 2 bad command line.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "coordinator/auth.h"
#include "coordinator/cluster.h"
#include "coordinator/limits.h"
#include "coordinator/rendezvous.h"
#include "coordinator/server.h"
#include "coordinator/state_store.h"
#include "rpc/transport_flags.h"

namespace substrax {
namespace {

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

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  CLI::App app{"substrax coordinator: workers, jobs, meshes, rendezvous and metrics"};
  substrax::CoordinatorServerOptions server_options;
  std::string state_dir = "./substrax-state";
  std::string address_file;
  std::string heartbeat_interval = "1s";
  std::string heartbeat_timeout = "10s";
  std::string progress_timeout = "5m";
  std::string restart_backoff = "1s";
  std::string max_restart_backoff = "2m";
  app.add_option("--listen", server_options.listen, "gRPC address host:port (port 0: any free)")
      ->capture_default_str();
  app.add_option("--worker-listen", server_options.worker_listen,
                 "gRPC address host:port of the worker-facing CoordinatorService (daemons and "
                 "runners); empty: served on --listen too");
  substrax::TransportFlags transport;
  substrax::AddTransportFlags(&app, &transport, substrax::TransportRole::kServer);
  std::string auth_config;
  app.add_option("--auth-config", auth_config,
                 "YAML file of bearer tokens (name, role, sha256 of the token); re-read when "
                 "it changes; see docs/security.md");
  app.add_option("--health-listen", server_options.health_listen,
                 "Plaintext gRPC address serving only grpc.health.v1 (Kubernetes probes); "
                 "empty: health on --listen only");
  app.add_option("--metrics-listen", server_options.metrics_listen,
                 "Prometheus /metrics address host:port; empty to disable")
      ->capture_default_str();
  app.add_option("--state-dir", state_dir, "Directory of the SQLite state")->capture_default_str();
  app.add_option("--address-file", address_file,
                 "Write the address clients should dial here once serving");
  app.add_option("--heartbeat-interval", heartbeat_interval,
                 "How often workers must heartbeat")
      ->capture_default_str();
  app.add_option("--heartbeat-timeout", heartbeat_timeout,
                 "A worker missing heartbeats this long is declared dead")
      ->capture_default_str();
  app.add_option("--progress-timeout", progress_timeout,
                 "An attempt one of whose processes reports no new step this long fails as "
                 "stalled (a job's spec.progress_timeout_seconds overrides it)")
      ->capture_default_str();
  app.add_option("--restart-backoff", restart_backoff,
                 "Wait before a failed job's first restart; it doubles with each restart")
      ->capture_default_str();
  app.add_option("--max-restart-backoff", max_restart_backoff,
                 "The longest wait between two attempts of a job")
      ->capture_default_str();
  // Retention and limits (docs/operations.md).
  substrax::ClusterOptions defaults;
  int max_active_jobs = defaults.max_active_jobs;
  int max_finished_jobs = defaults.max_finished_jobs;
  std::string finished_job_ttl = "168h";
  int64_t metrics_raw_steps = defaults.metrics_raw_steps;
  int64_t metrics_history_every = defaults.metrics_history_every;
  int64_t log_max_bytes = defaults.log_max_bytes_per_process;
  app.add_option("--max-active-jobs", max_active_jobs,
                 "Pending and running jobs at most; a submit beyond gets RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--max-finished-jobs", max_finished_jobs,
                 "Ended jobs kept (with their metrics); beyond, the oldest are deleted")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--finished-job-ttl", finished_job_ttl,
                 "Ended jobs are deleted this long after they ended; 0: never by age")
      ->capture_default_str();
  app.add_option("--metrics-raw-steps", metrics_raw_steps,
                 "Every metric point of an attempt's last N steps is kept; 0: keep all")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--metrics-history-every", metrics_history_every,
                 "Before those, only steps that are multiples of N are kept")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--log-max-bytes-per-process", log_max_bytes,
                 "Bytes of each job process's log kept (its newest; substraxctl logs); at least "
                 "65536, 0: unbounded")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--max-rpc-threads", server_options.max_rpc_threads,
                 "Threads serving rpcs (each open stream holds one); calls beyond get "
                 "RESOURCE_EXHAUSTED")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (absl::Status s = substrax::FinishTransportFlags(&transport); !s.ok()) {
    std::cerr << "substrax-coordinator: " << s.message() << "\n";
    return 2;
  }
  server_options.transport = transport.options;
  if (absl::Status s = substrax::ValidateTransport(transport.options, /*server=*/true); !s.ok()) {
    std::cerr << "substrax-coordinator: " << s.message() << "\n";
    return 2;
  }
  if (transport.options.insecure) {
    std::cerr << substrax::InsecureWarning("substrax-coordinator") << "\n";
  }
  auto auth = substrax::Authenticator::Create(transport.options.insecure, auth_config);
  if (!auth.ok()) {
    std::cerr << "substrax-coordinator: " << auth.status().message() << "\n";
    return 2;
  }
  substrax::ClusterOptions cluster_options;
  if (!substrax::ParsePositive("--heartbeat-interval", heartbeat_interval,
                               &cluster_options.heartbeat_interval) ||
      !substrax::ParsePositive("--heartbeat-timeout", heartbeat_timeout,
                               &cluster_options.heartbeat_timeout) ||
      !substrax::ParsePositive("--progress-timeout", progress_timeout,
                               &cluster_options.default_progress_timeout) ||
      !substrax::ParsePositive("--restart-backoff", restart_backoff,
                               &cluster_options.restart_backoff) ||
      !substrax::ParsePositive("--max-restart-backoff", max_restart_backoff,
                               &cluster_options.max_restart_backoff)) {
    return 2;
  }
  cluster_options.max_active_jobs = max_active_jobs;
  cluster_options.max_finished_jobs = max_finished_jobs;
  cluster_options.metrics_raw_steps = metrics_raw_steps;
  cluster_options.metrics_history_every = metrics_history_every;
  if (log_max_bytes != 0 &&
      log_max_bytes < static_cast<int64_t>(substrax::limits::kMaxLogChunkBytes)) {
    std::cerr << "substrax-coordinator: --log-max-bytes-per-process: " << log_max_bytes
              << " is below a shipped piece of a log (" << substrax::limits::kMaxLogChunkBytes
              << " bytes); give at least that, or 0 for no bound\n";
    return 2;
  }
  cluster_options.log_max_bytes_per_process = log_max_bytes;
  if (!absl::ParseDuration(finished_job_ttl, &cluster_options.finished_job_ttl) ||
      cluster_options.finished_job_ttl < absl::ZeroDuration()) {
    std::cerr << "substrax-coordinator: --finished-job-ttl: '" << finished_job_ttl
              << "' is not a duration such as 168h (0: never by age)\n";
    return 2;
  }
  if (cluster_options.heartbeat_timeout <= cluster_options.heartbeat_interval) {
    std::cerr << "substrax-coordinator: --heartbeat-timeout must be longer than "
                 "--heartbeat-interval\n";
    return 2;
  }

  // Signals go to one waiting thread; block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto state = substrax::SqliteStateStore::Open(state_dir);
  if (!state.ok()) {
    std::cerr << "substrax-coordinator: " << state.status().message() << "\n";
    return 1;
  }
  // Leases and progress timeouts on the monotonic clock: a wall-clock step (NTP) must neither
  // expire a lease nor keep a dead worker's alive.
  auto cluster = substrax::Cluster::Create(
      cluster_options, [] { return absl::Now(); }, state->get(), [] {
        return absl::UnixEpoch() +
               absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
      });
  if (!cluster.ok()) {
    std::cerr << "substrax-coordinator: cannot load state from " << state_dir << ": "
              << cluster.status().message() << "\n";
    return 1;
  }
  auto key = substrax::LoadOrCreateKey(state_dir + "/rendezvous.key");
  if (!key.ok()) {
    std::cerr << "substrax-coordinator: " << key.status().message() << "\n";
    return 1;
  }
  server_options.rendezvous_key = *std::move(key);
  substrax::Rendezvous rendezvous;
  auto server = substrax::CoordinatorServer::Start(server_options, cluster->get(), &rendezvous,
                                                   auth->get());
  if (!server.ok()) {
    std::cerr << "substrax-coordinator: " << server.status().message() << "\n";
    return 1;
  }
  const std::string address = substrax::DialAddress(server_options.listen, (*server)->port());
  if (!address_file.empty()) {
    const std::string temp = address_file + ".tmp";
    std::ofstream(temp) << address << "\n";
    std::rename(temp.c_str(), address_file.c_str());
  }
  std::cerr << "substrax-coordinator: serving "
            << (transport.options.insecure ? "plaintext (--insecure)" : "mutual TLS") << " on "
            << address
            << (server_options.worker_listen.empty()
                    ? std::string()
                    : absl::StrCat(", workers on port ", (*server)->worker_port()))
            << (server_options.metrics_listen.empty()
                    ? std::string()
                    : ", metrics on " + substrax::DialAddress(server_options.metrics_listen,
                                                              (*server)->metrics_port()))
            << ", state in " << state_dir << "\n";
  int signal = 0;
  sigwait(&signals, &signal);
  std::cerr << "substrax-coordinator: " << strsignal(signal) << ": shutting down\n";
  (*server)->Shutdown();
  return 0;
}
