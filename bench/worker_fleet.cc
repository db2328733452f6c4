// Heartbeats of a large fleet against one substrax-coordinator process: 10,000 simulated worker
// daemons (//tests/load:load_harness), each on its own connection, registered, heartbeating once
// a second and holding its WatchAssignments stream as a real daemon does, while 200 clients
// hold a WatchJob and a `logs -f` (ReadLogs follow) stream each on a running job. Once with
// mutual TLS (a worker certificate per worker, CN = worker id) and once with --insecure.
//
//   bazel run -c opt //bench:worker_fleet
//   bazel run -c opt //bench:worker_fleet -- --workers 3000 --seconds 20 --transport insecure
//   bazel run -c opt //bench:worker_fleet -- --baseline_binary /tmp/old-coordinator
//
// Prints per run: registrations refused and how long registering took (reg_s); then, over the
// window of --seconds that starts once every stream is open, heartbeats answered (hb_ok) and
// not (hb_fail) and their latency p50/p99/max; false expiries (expired: workers the coordinator
// shows not ALIVE at the end although each heartbeated every second from its registration on),
// assignment streams (streams) and client streams (clients) that ended early, and the
// coordinator's RSS.
// With --baseline_binary (a coordinator of an earlier commit) each transport runs against both
// and the ratios new/old of the heartbeat latencies are printed. Asserts no timing.
//
// Exit status: 0 when the runs completed (whatever they measured); 1 when a run could not be
// set up (the coordinator did not start, no job could be submitted); non-zero from CLI11 for a
// bad command line.
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex_mode.h"
#include "bench/host.h"
#include "tests/credentials.h"
#include "tests/load/load_harness.h"
#include "tests/process.h"

namespace substrax::load {
namespace {

struct Options {
  std::string coordinator_binary;  // empty: the one in the runfiles
  std::string baseline_binary;     // empty: no baseline run
  std::string transport = "both";  // tls, insecure or both
  int workers = 10000;
  double seconds = 60;
  int clients = 200;
  int register_parallelism = 64;
  int channels = 0;  // 0: one connection per worker
};

struct Result {
  std::string transport;
  std::string coordinator;
  bool ran = false;
  int64_t refused = 0;
  std::string first_refusal;
  int64_t heartbeats_ok = 0;
  int64_t heartbeats_failed = 0;
  absl::Duration p50, p99, max;
  int64_t false_expiries = -1;  // -1: ListWorkers failed
  int64_t declared_dead = 0;
  int64_t streams_ended = 0;
  int64_t client_streams_ended = 0;
  std::string first_client_error;
  int64_t rss_mib = -1;
  absl::Duration registration;
  // CPU time over the window: the coordinator's, and this process's (the fleet and clients).
  absl::Duration coordinator_cpu, fleet_cpu;
  absl::Duration window;
};

// This process's CPU time (user + system) so far.
absl::Duration OwnCpuTime() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return absl::DurationFromTimeval(usage.ru_utime) + absl::DurationFromTimeval(usage.ru_stime);
}

// Raises the open-file limit to its hard limit (each worker and client is a connection here,
// and one more in the coordinator, which inherits the limit).
void RaiseFdLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  limit.rlim_cur = limit.rlim_max;
  setrlimit(RLIMIT_NOFILE, &limit);
}

// A free TCP port on 127.0.0.1 (for --worker-listen, whose port the address file omits).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &size) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::shared_ptr<grpc::ChannelCredentials> TlsCredentials(const TransportOptions& options) {
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = testing::ReadFile(options.ca_file);
  ssl.pem_cert_chain = testing::ReadFile(options.cert_file);
  ssl.pem_private_key = testing::ReadFile(options.key_file);
  return grpc::SslCredentials(ssl);
}

// A client's server stream (WatchJob, ReadLogs follow) held open until Cancel(): reads every
// message and keeps how it ended.
template <typename Request, typename Response>
class HeldStream : public grpc::ClientReadReactor<Response> {
 public:
  using Call = std::function<void(grpc::ClientContext*, const Request*,
                                  grpc::ClientReadReactor<Response>*)>;
  HeldStream(Request request, const Call& call) : request_(std::move(request)) {
    call(&context_, &request_, this);
    this->StartRead(&response_);
    this->StartCall();
  }
  void Cancel() { context_.TryCancel(); }
  void OnReadDone(bool ok) override {
    if (ok) this->StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }
  // Whether it ended (and how) before `deadline`.
  std::optional<grpc::Status> WaitDone(absl::Time deadline) {
    absl::MutexLock lock(&mu_);
    if (!mu_.AwaitWithDeadline(absl::Condition(&done_), deadline)) return std::nullopt;
    return status_;
  }

 private:
  grpc::ClientContext context_;
  Request request_;
  Response response_;
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

using WatchStream = HeldStream<v1::WatchJobRequest, v1::WatchJobResponse>;
using LogsStream = HeldStream<v1::ReadLogsRequest, v1::ReadLogsResponse>;

// The clients: each its own connection (and, with TLS, its own identity: the coordinator caps
// streams per caller), holding a WatchJob and a ReadLogs follow of `job_id`.
class Clients {
 public:
  Clients(const std::string& address,
          const std::function<std::shared_ptr<grpc::ChannelCredentials>(int)>& credentials,
          int clients, const std::string& job_id) {
    for (int c = 0; c < clients; ++c) {
      grpc::ChannelArguments args;
      args.SetInt("substrax.bench.client", c);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      stubs_.push_back(
          v1::JobService::NewStub(grpc::CreateCustomChannel(address, credentials(c), args)));
      v1::WatchJobRequest watch;
      watch.set_job_id(job_id);
      v1::JobService::Stub* stub = stubs_.back().get();
      watches_.push_back(std::make_unique<WatchStream>(
          watch, [stub](grpc::ClientContext* context, const v1::WatchJobRequest* request,
                        grpc::ClientReadReactor<v1::WatchJobResponse>* reactor) {
            stub->async()->WatchJob(context, request, reactor);
          }));
      v1::ReadLogsRequest logs;
      logs.set_job_id(job_id);
      logs.set_follow(true);
      logs_.push_back(std::make_unique<LogsStream>(
          logs, [stub](grpc::ClientContext* context, const v1::ReadLogsRequest* request,
                       grpc::ClientReadReactor<v1::ReadLogsResponse>* reactor) {
            stub->async()->ReadLogs(context, request, reactor);
          }));
    }
  }

  // Streams that ended on their own so far (they should not: the job keeps running), and the
  // first such ending's status in *first.
  int64_t Ended(std::string* first) {
    int64_t ended = 0;
    auto look = [&](std::optional<grpc::Status> status) {
      if (!status.has_value()) return;
      if (first->empty()) *first = absl::StrCat(status->error_code(), ": ", status->error_message());
      ++ended;
    };
    for (auto& w : watches_) look(w->WaitDone(absl::Now()));
    for (auto& l : logs_) look(l->WaitDone(absl::Now()));
    return ended;
  }

  ~Clients() {
    for (auto& w : watches_) w->Cancel();
    for (auto& l : logs_) l->Cancel();
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    for (auto& w : watches_) w->WaitDone(deadline);
    for (auto& l : logs_) l->WaitDone(deadline);
  }

 private:
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs_;
  std::vector<std::unique_ptr<WatchStream>> watches_;
  std::vector<std::unique_ptr<LogsStream>> logs_;
};

// One run: a coordinator (`binary`), the fleet, the clients, `seconds` of heartbeats.
Result Run(const Options& o, const std::string& binary, const std::string& label, bool tls) {
  Result r;
  r.transport = tls ? "tls" : "insecure";
  r.coordinator = label;
  const std::string dir = ScratchDir(absl::StrCat("bench-worker-fleet-", getpid()), 1 << 30);
  const int worker_port = FreePort();
  const std::string worker_address = absl::StrCat("127.0.0.1:", worker_port);
  std::vector<std::string> flags = {"--worker-listen", worker_address};
  std::optional<testing::TestPki> pki;
  FleetOptions fleet_options;
  fleet_options.id_prefix = "fleet";
  fleet_options.workers = o.workers;
  fleet_options.channels = o.channels > 0 ? o.channels : o.workers;
  fleet_options.register_parallelism = o.register_parallelism;
  std::shared_ptr<grpc::ChannelCredentials> client_credentials = grpc::InsecureChannelCredentials();
  if (tls) {
    pki.emplace(dir + "/pki");
    for (std::string& flag : pki->CoordinatorFlags()) flags.push_back(std::move(flag));
    // A worker acts only as itself: one certificate per worker, so one connection each.
    fleet_options.channels = o.workers;
    for (int w = 0; w < o.workers; ++w) {
      fleet_options.channel_credentials.push_back(
          TlsCredentials(pki->Issue(absl::StrCat("fleet-", w), "worker")));
    }
    client_credentials = TlsCredentials(pki->Issue("bench-admin", "admin"));
  }
  CoordinatorProcess coordinator(binary, dir, flags, /*insecure=*/!tls);
  if (absl::Status s = coordinator.Start(); !s.ok()) {
    std::cerr << "worker_fleet: " << s.message() << "\n";
    std::filesystem::remove_all(dir);
    return r;
  }
  {
    SimulatedFleet fleet(worker_address, fleet_options);
    // Each worker heartbeats from its registration on, as a daemon does: registering 10,000
    // takes longer than a lease.
    fleet.Start();
    const absl::Time registering = absl::Now();
    if (absl::Status s = fleet.Register(); !s.ok()) r.first_refusal = std::string(s.message());
    r.registration = absl::Now() - registering;
    r.refused = fleet.registrations_refused();
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);  // ListWorkers of every worker
    auto admin =
        v1::JobService::NewStub(grpc::CreateCustomChannel(coordinator.address(),
                                                          client_credentials, args));
    int64_t window_ok = 0, window_failed = 0;
    std::string job_id;
    const grpc::Status submitted =
        SubmitJob(*admin, LoadJobSpec("bench-fleet", 1, 1'000'000'000, v1::BACKEND_CPU), &job_id);
    if (!submitted.ok()) {
      std::cerr << "worker_fleet: submit: " << submitted.error_message() << "\n";
    } else {
      // Its worker lists the runner in its heartbeats, as a daemon would.
      if (std::optional<WorkerAssignment> a = fleet.NextAssignment(absl::Seconds(30))) {
        fleet.AddRunner(a->worker, job_id, a->assignment.attempt(),
                        a->assignment.process_index());
      }
      Clients clients(
          coordinator.address(),
          [&](int c) {
            return tls ? TlsCredentials(pki->Issue(absl::StrCat("bench-viewer-", c), "viewer"))
                       : client_credentials;
          },
          o.clients, job_id);
      // The window starts once every worker registered and every stream is open: registering
      // is measured apart (reg_s), and a heartbeat's latency here is the steady state's.
      absl::SleepFor(absl::Seconds(2));  // one heartbeat round opens the assignment streams
      fleet.heartbeat_latency().Clear();
      window_ok = fleet.heartbeats_ok();
      window_failed = fleet.heartbeats_failed();
      const absl::Duration coordinator_cpu = coordinator.CpuTime();
      const absl::Duration fleet_cpu = OwnCpuTime();
      const absl::Time window_start = absl::Now();
      absl::SleepFor(absl::Seconds(o.seconds));  // the measurement window
      r.window = absl::Now() - window_start;
      r.coordinator_cpu = coordinator.CpuTime() - coordinator_cpu;
      r.fleet_cpu = OwnCpuTime() - fleet_cpu;
      r.client_streams_ended = clients.Ended(&r.first_client_error);
      absl::StatusOr<std::vector<v1::Worker>> workers = ListWorkers(*admin);
      if (workers.ok()) {
        r.false_expiries = 0;
        for (const v1::Worker& w : *workers) {
          if (w.state() != v1::WORKER_STATE_ALIVE) ++r.false_expiries;
        }
      }
      r.rss_mib = coordinator.RssBytes() >> 20;
      r.ran = true;
    }
    fleet.Stop();
    const LatencyRecorder& latency = fleet.heartbeat_latency();
    r.heartbeats_ok = fleet.heartbeats_ok() - window_ok;
    r.heartbeats_failed = fleet.heartbeats_failed() - window_failed;
    r.p50 = latency.Percentile(0.5);
    r.p99 = latency.Percentile(0.99);
    r.max = latency.Percentile(1.0);
    r.declared_dead = fleet.workers_declared_dead();
    r.streams_ended = fleet.streams_ended();
    for (const std::string& e : fleet.heartbeat_errors()) std::cerr << "  " << e << "\n";
  }
  if (absl::Status s = coordinator.Stop(); !s.ok()) {
    std::cerr << "worker_fleet: " << s.message() << "\n";
  }
  std::filesystem::remove_all(dir);
  return r;
}

void Print(const std::vector<Result>& results) {
  std::cout << absl::StrFormat(
      "%-9s %-9s %8s %7s %10s %8s %9s %9s %9s %7s %8s %8s %7s %7s %7s %7s\n", "transport",
      "coord", "refused", "reg_s", "hb_ok", "hb_fail", "p50_ms", "p99_ms", "max_ms", "expired",
      "streams", "clients", "rss_MiB", "coord%", "fleet%", "us/hb");
  for (const Result& r : results) {
    // CPU as a percentage of one core over the window; the coordinator's CPU per heartbeat.
    const double window_s = std::max(1e-9, absl::ToDoubleSeconds(r.window));
    const double coordinator_s = absl::ToDoubleSeconds(r.coordinator_cpu);
    std::cout << absl::StrFormat(
        "%-9s %-9s %8d %7.1f %10d %8d %9.1f %9.1f %9.1f %7s %8d %8d %7d %7.0f %7.0f %7.0f\n",
        r.transport,
        r.coordinator, r.refused, absl::ToDoubleSeconds(r.registration), r.heartbeats_ok,
        r.heartbeats_failed, absl::ToDoubleMilliseconds(r.p50), absl::ToDoubleMilliseconds(r.p99),
        absl::ToDoubleMilliseconds(r.max),
        r.false_expiries < 0 ? std::string("n/a") : absl::StrCat(r.false_expiries),
        r.streams_ended, r.client_streams_ended, r.rss_mib, 100 * coordinator_s / window_s,
        100 * absl::ToDoubleSeconds(r.fleet_cpu) / window_s,
        r.heartbeats_ok > 0 ? 1e6 * coordinator_s / r.heartbeats_ok : 0.0);
    if (!r.first_refusal.empty()) std::cout << "  first refusal: " << r.first_refusal << "\n";
    if (!r.first_client_error.empty()) {
      std::cout << "  first client stream ended: " << r.first_client_error << "\n";
    }
    if (r.declared_dead > 0) {
      std::cout << "  heartbeats answered ABORTED/NOT_FOUND for " << r.declared_dead
                << " workers\n";
    }
  }
  // Ratios new/old where both sides measured heartbeats.
  for (const Result& r : results) {
    if (r.coordinator != "new") continue;
    for (const Result& b : results) {
      if (b.coordinator != "baseline" || b.transport != r.transport) continue;
      if (b.heartbeats_ok == 0 || r.heartbeats_ok == 0) continue;
      auto ratio = [](absl::Duration a, absl::Duration b) {
        return b == absl::ZeroDuration() ? 0.0 : absl::FDivDuration(a, b);
      };
      std::cout << absl::StrFormat(
          "ratio_new_vs_old_%s: p50 %.2f p99 %.2f max %.2f heartbeats_ok %.2f\n", r.transport,
          ratio(r.p50, b.p50), ratio(r.p99, b.p99), ratio(r.max, b.max),
          static_cast<double>(r.heartbeats_ok) / b.heartbeats_ok);
    }
  }
}

int Main(const Options& o) {
  RaiseFdLimit();
  rlimit limit;
  getrlimit(RLIMIT_NOFILE, &limit);
  std::cout << "host: " << std::thread::hardware_concurrency() << " CPUs, load average "
            << bench::LoadAverage() << " at start; " << o.workers << " workers ("
            << (o.channels > 0 ? absl::StrCat(o.channels, " connections") : "one connection each")
            << ", one with TLS), " << o.clients << " clients x (WatchJob + ReadLogs follow), "
            << o.seconds << " s, open files " << limit.rlim_cur << "\n";
  std::vector<bool> transports;
  if (o.transport != "insecure") transports.push_back(true);
  if (o.transport != "tls") transports.push_back(false);
  std::vector<Result> results;
  bool setup_failed = false;
  for (bool tls : transports) {
    std::vector<std::pair<std::string, std::string>> binaries = {
        {"new", o.coordinator_binary.empty() ? CoordinatorRunfile() : o.coordinator_binary}};
    if (!o.baseline_binary.empty()) binaries.emplace_back("baseline", o.baseline_binary);
    for (const auto& [label, binary] : binaries) {
      results.push_back(Run(o, binary, label, tls));
      if (!results.back().ran) setup_failed = true;
      std::cout << "done: " << results.back().transport << " " << label << "\n" << std::flush;
    }
  }
  Print(results);
  return setup_failed ? 1 : 0;
}

}  // namespace
}  // namespace substrax::load

int main(int argc, char** argv) {
  substrax::base::DisableMutexDeadlockDetectionInOptimizedBuilds();
  CLI::App app{"heartbeats of a 10,000-worker fleet against one substrax-coordinator"};
  substrax::load::Options o;
  app.add_option("--coordinator_binary", o.coordinator_binary,
                 "coordinator to start (default: the one in the runfiles)");
  app.add_option("--baseline_binary", o.baseline_binary,
                 "a coordinator of an earlier commit to run the same against (ratios new/old)");
  app.add_option("--transport", o.transport, "tls, insecure or both")
      ->capture_default_str()
      ->check(CLI::IsMember({"tls", "insecure", "both"}));
  app.add_option("--workers", o.workers, "simulated worker daemons")->capture_default_str();
  app.add_option("--seconds", o.seconds, "length of the measurement")->capture_default_str();
  app.add_option("--clients", o.clients, "clients holding WatchJob and ReadLogs follow")
      ->capture_default_str();
  app.add_option("--register_parallelism", o.register_parallelism,
                 "RegisterWorker calls in flight at once")
      ->capture_default_str();
  app.add_option("--channels", o.channels,
                 "insecure only: connections the workers share; 0: one per worker")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return substrax::load::Main(o);
}
