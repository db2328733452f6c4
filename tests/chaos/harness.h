// What the chaos tests share: a cluster of real processes (a coordinator and worker daemons,
// optionally behind a TCP proxy that can reset every connection), a JobService client, and the
// /proc checks every fault test ends with.
#ifndef SUBSTRAX_TESTS_CHAOS_HARNESS_H_
#define SUBSTRAX_TESTS_CHAOS_HARNESS_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"
#include "rpc/transport.h"
#include "tests/credentials.h"
#include "tests/proc.h"
#include "tests/process.h"

namespace substrax::testing {

// A TCP proxy on 127.0.0.1 (port chosen at start) in front of `upstream` ("host:port"). Every
// accepted connection gets its own connection upstream and a thread that copies both ways.
// ResetAll() ends every open connection with a TCP reset (SO_LINGER 0), both sides.
class TcpProxy {
 public:
  explicit TcpProxy(std::string upstream);
  ~TcpProxy();
  std::string address() const;
  // Resets every open connection; returns how many were open.
  int ResetAll();

 private:
  void AcceptLoop();
  void Pump(int client, int server);

  std::string upstream_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::set<int> open_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

// Polls /proc in the background: every job process pid ever seen, by launch file, and the
// highest number of runners of one job alive at the same instant.
class RunnerWatch {
 public:
  explicit RunnerWatch(std::string dir);
  ~RunnerWatch();
  // Launch file -> the distinct pids that ran it.
  std::map<std::string, std::set<pid_t>> Seen();
  // The most runners of attempts of `job` alive at once beyond one per process, i.e. > 0 when
  // two runners of one job and process, or of two attempts, were ever alive together.
  int Overlaps();

 private:
  std::string dir_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::map<std::string, std::set<pid_t>> seen_ ABSL_GUARDED_BY(mu_);
  int overlaps_ ABSL_GUARDED_BY(mu_) = 0;
};

struct ChaosClusterOptions {
  int workers = 2;
  int cpu_devices_per_worker = 2;
  // Daemons (and so their runners) reach the coordinator through a TcpProxy.
  bool through_proxy = false;
  std::string heartbeat_interval = "500ms";
  std::string heartbeat_timeout = "3s";
  std::string collective_timeout = "20s";
  // The daemons' --stop-grace: SIGTERM, then SIGKILL this much later.
  std::string stop_grace = "2s";
  // Extra coordinator flags ("--restart-backoff", "1s").
  std::vector<std::string> coordinator_flags;
  // Extra environment of the coordinator ("NAME=value").
  std::vector<std::string> coordinator_env;
  // Extra flags of every worker daemon ("--data-root", "/dir"), and extra environment (which
  // their runners inherit).
  std::vector<std::string> worker_flags;
  std::vector<std::string> worker_env;
  // Mutual TLS instead of plaintext (tests of who may do what with real daemons): a TestPki in
  // dir()/tls, a worker certificate per daemon, the admin's for jobs(). Tokens come from an
  // --auth-config in coordinator_flags.
  bool tls = false;
  // A command the daemons are started under ({"prlimit", "--fsize=1024", "--"}): it must run
  // the rest of its arguments as the daemon, in the same process (exec).
  std::vector<std::string> worker_wrapper;
  // Per worker (by index from 0): a wrapper in place of worker_wrapper ({"faketime", "-f",
  // "+90s"}).
  std::map<int, std::vector<std::string>> worker_wrappers;
  // With tls: how long each worker's certificate is valid from now (by index; others: a day).
  std::map<int, absl::Duration> worker_cert_valid_for;
  absl::Duration default_worker_cert_valid_for = absl::Hours(24);
};

class ChaosCluster {
 public:
  ChaosCluster(const std::string& name, ChaosClusterOptions options);
  ~ChaosCluster();

  // Starts (or restarts, on the same port and state) the coordinator; `env` is its extra
  // environment (the first start uses the options' coordinator_env).
  void StartCoordinator(const std::vector<std::string>& env = {});
  void StartWorker(int w);
  // The address daemons use (the proxy's when through_proxy).
  std::string worker_address() const;
  TcpProxy* proxy() { return proxy_.get(); }
  Process& coordinator() { return *coordinator_; }
  Process& worker(int w) { return *workers_[w]; }
  const std::string& dir() const { return dir_; }

  // Waits until `n` workers are alive. False at the deadline.
  bool WaitForWorkers(int n, absl::Duration timeout);
  // Submits a YAML job spec over gRPC; the job id, or the status message prefixed by "error: ".
  std::string Submit(const std::string& yaml);
  std::optional<v1::Job> Get(const std::string& id);
  // Every device's own metric points (REDUCTION_NONE) of attempt `attempt` (0: the latest).
  std::optional<v1::QueryMetricsResponse> DeviceMetrics(const std::string& id, int attempt = 0);
  // The coordinator's address ("127.0.0.1:port"; the same across restarts).
  const std::string& address() const { return address_; }
  // Polls until the job is in a terminal state; the last view.
  std::optional<v1::Job> WaitForEnd(const std::string& id, absl::Duration timeout);
  std::unique_ptr<v1::JobService::Stub>& jobs() { return jobs_; }
  // With tls: the CA and the issuer of more certificates; null without.
  TestPki* pki() { return pki_.get(); }
  // How a client of this cluster connects: plaintext, or (tls) verifying the coordinator with
  // no identity of its own (add a certificate or a token_file).
  TransportOptions ClientTransport() const;

  // Every log, for failure messages.
  std::string Logs();
  // `substraxctl ARGS` against the coordinator, plaintext, or with tls as an admin (the
  // caller's data must include //client:substraxctl).
  CommandResult Ctl(std::vector<std::string> args);
  // Stops the daemons and the coordinator with SIGTERM, then checks through /proc that no
  // process of this cluster (daemon, runner, coordinator) is left. Empty: none is.
  std::string StopAndListLeftovers();

 private:
  void Connect();

  // The transport flags of a coordinator (tls: its certificate) or of worker `worker_id`.
  std::vector<std::string> TransportFlags(const std::string& worker_id,
                                         absl::Duration valid_for = absl::Hours(24));

  const ChaosClusterOptions options_;
  const std::string dir_;
  std::unique_ptr<TestPki> pki_;
  std::string address_;
  std::unique_ptr<TcpProxy> proxy_;
  std::unique_ptr<Process> coordinator_;
  int coordinator_runs_ = 0;
  std::vector<std::unique_ptr<Process>> workers_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

// What the coordinator acknowledged to a client about one job: a thread reads the job (GetJob)
// and every device's metric points (QueryMetrics) over its own channel every 20 ms, keeping the
// last answers that came back OK, until Stop(). Once answered, a record must survive anything,
// a coordinator SIGKILL included.
class AcknowledgedRecords {
 public:
  AcknowledgedRecords(const std::string& address, std::string job_id);
  ~AcknowledgedRecords();
  void Stop();
  std::optional<v1::Job> job();
  std::optional<v1::QueryMetricsResponse> metrics();

 private:
  const std::string job_id_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::MetricsService::Stub> metrics_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  absl::Mutex mu_;
  std::optional<v1::Job> job_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::QueryMetricsResponse> metrics_seen_ ABSL_GUARDED_BY(mu_);
};

// What of `acked` (an earlier answer) a later answer lost, one line each; empty when nothing:
// the job's transitions are a prefix of `now`'s, a terminal state stays; every metric point
// (series, step, value) is still there in `now_metrics` (of the same attempt).
std::string LostJobRecords(const v1::Job& acked, const v1::Job& now);
std::string LostMetricPoints(const v1::QueryMetricsResponse& acked,
                             const v1::QueryMetricsResponse& now);

// A synthetic classification job of `steps` steps on `devices` data-parallel devices.
std::string SyntheticJob(const std::string& name, int devices, int steps, int max_restarts = 0);

}  // namespace substrax::testing

#endif  // SUBSTRAX_TESTS_CHAOS_HARNESS_H_
