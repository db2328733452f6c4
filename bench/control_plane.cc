// Control-plane throughput of substrax-coordinator: heartbeats/s, submits/s and metric
// points/s it sustains, with p50/p99 latencies, driven by simulated workers, runners and
// clients (//tests/load:load_harness) over gRPC. Prints one table; asserts no timing.
//
//   bazel run -c opt //bench:control_plane                      # starts its own coordinator
//   bazel run -c opt //bench:control_plane -- --coordinator 127.0.0.1:7070
//
// Plaintext: its simulated workers take thousands of worker ids, which no set of certificates
// covers, so the coordinator it starts (or is given) runs with --insecure; what TLS adds per
// call is not measured here.
//
// Exit status: 0 when every call was answered as expected; 1 when one was not (a failed
// heartbeat or report, a refused submit, a job lost); non-zero from CLI11 for a bad command line.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/mutex_mode.h"
#include "bench/host.h"
#include "tests/load/load_harness.h"

namespace substrax::load {
namespace {

struct Options {
  std::string coordinator;  // empty: start one
  std::string coordinator_binary;
  double seconds = 10;
  int heartbeat_workers = 200;
  double heartbeat_interval_ms = 20;
  int submit_threads = 8;
  int report_workers = 8;
  int devices_per_worker = 8;
};

struct Row {
  std::string what;
  double rate = 0;  // per second
  int64_t calls = 0;
  absl::Duration p50, p99;
  std::string notes;
};

bool failed = false;

void Fail(const std::string& message) {
  std::cerr << "control_plane: " << message << "\n";
  failed = true;
}

// Heartbeats of `workers` simulated workers, each every `interval` at most (one outstanding per
// worker): the rate the coordinator sustains with that many daemons pushing.
Row Heartbeats(const std::string& address, const Options& o) {
  FleetOptions fleet_options;
  fleet_options.id_prefix = absl::StrCat("bench-hb-", getpid());
  fleet_options.workers = o.heartbeat_workers;
  fleet_options.device_kind = v1::DEVICE_KIND_CUDA;  // nothing is ever scheduled on them
  fleet_options.watch_assignments = false;
  fleet_options.heartbeat_interval = absl::Milliseconds(o.heartbeat_interval_ms);
  SimulatedFleet fleet(address, fleet_options);
  if (absl::Status s = fleet.Register(); !s.ok()) Fail(std::string(s.message()));
  fleet.Start();
  absl::SleepFor(absl::Seconds(o.seconds));  // the measurement window
  fleet.Stop();
  if (fleet.heartbeats_failed() > 0) Fail(absl::StrCat(fleet.heartbeats_failed(), " heartbeats failed"));
  const double offered = o.heartbeat_workers * 1000.0 / o.heartbeat_interval_ms;
  return {"heartbeats", fleet.heartbeats_ok() / o.seconds, fleet.heartbeats_ok(),
          fleet.heartbeat_latency().Percentile(0.5), fleet.heartbeat_latency().Percentile(0.99),
          absl::StrFormat("%d workers, offered %.0f/s, %d skipped (previous outstanding)",
                          o.heartbeat_workers, offered, fleet.heartbeats_skipped())};
}

// SubmitJob from `submit_threads` clients back to back. The jobs (1 CPU device each) wait
// PENDING behind one simulated worker's device; they are cancelled after, so that they neither
// take the next phase's devices nor run on a given coordinator's workers.
Row Submits(const std::string& address, const Options& o) {
  FleetOptions fleet_options;
  fleet_options.id_prefix = absl::StrCat("bench-submit-", getpid());
  fleet_options.watch_assignments = false;
  SimulatedFleet fleet(address, fleet_options);
  if (absl::Status s = fleet.Register(); !s.ok()) Fail(std::string(s.message()));
  fleet.Start();
  const v1::JobSpec spec = LoadJobSpec("bench-submit", 1, 100, v1::BACKEND_CPU);
  LatencyRecorder latency;
  std::atomic<int64_t> refused{0};
  absl::Mutex mu;
  std::vector<std::string> ids;
  const absl::Time end = absl::Now() + absl::Seconds(o.seconds);
  std::vector<std::thread> clients;
  for (int t = 0; t < o.submit_threads; ++t) {
    clients.emplace_back([&, t] {
      grpc::ChannelArguments args;
      args.SetInt("substrax.bench.client", t);
      auto jobs = v1::JobService::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
      while (absl::Now() < end) {
        std::string id;
        const absl::Time sent = absl::Now();
        const grpc::Status status = SubmitJob(*jobs, spec, &id);
        if (!status.ok()) {
          refused.fetch_add(1);
          continue;
        }
        latency.Add(absl::Now() - sent);
        absl::MutexLock lock(&mu);
        ids.push_back(id);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  fleet.Stop();
  auto jobs = v1::JobService::NewStub(Connect(address));
  for (const std::string& id : ids) {
    grpc::ClientContext context;
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::CancelJobResponse response;
    const grpc::Status status = jobs->CancelJob(&context, request, &response);
    // The one job that got the device may have failed already (its runner never reports).
    if (!status.ok() && status.error_code() != grpc::StatusCode::FAILED_PRECONDITION) {
      Fail(absl::StrCat("cancel ", id, ": ", status.error_message()));
    }
  }
  if (refused.load() > 0) Fail(absl::StrCat(refused.load(), " submits refused"));
  return {"submits", ids.size() / o.seconds, static_cast<int64_t>(ids.size()),
          latency.Percentile(0.5), latency.Percentile(0.99),
          absl::StrFormat("%d client threads, %d refused", o.submit_threads, refused.load())};
}

// ReportSteps of one job on report_workers x devices_per_worker simulated devices, each runner
// sending its devices' reports of the next step as soon as the previous call is answered; and
// the heartbeats of those workers meanwhile (1/s each).
std::vector<Row> Reports(const std::string& address, const Options& o) {
  FleetOptions fleet_options;
  fleet_options.id_prefix = absl::StrCat("bench-report-", getpid());
  fleet_options.workers = o.report_workers;
  fleet_options.devices_per_worker = o.devices_per_worker;
  SimulatedFleet fleet(address, fleet_options);
  if (absl::Status s = fleet.Register(); !s.ok()) Fail(std::string(s.message()));
  fleet.Start();
  auto jobs = v1::JobService::NewStub(Connect(address));
  const int devices = o.report_workers * o.devices_per_worker;
  std::string job_id;
  const grpc::Status submitted = SubmitJob(
      *jobs, LoadJobSpec("bench-reports", devices, 1'000'000'000, v1::BACKEND_CPU), &job_id);
  if (!submitted.ok()) {
    Fail(absl::StrCat("submit: ", submitted.error_message()));
    return {};
  }
  std::vector<std::unique_ptr<ReportLoop>> loops;
  while (static_cast<int>(loops.size()) < o.report_workers) {
    std::optional<WorkerAssignment> a = fleet.NextAssignment(absl::Seconds(60));
    if (!a.has_value()) {
      Fail(absl::StrCat("only ", loops.size(), " of ", o.report_workers, " assignments came"));
      return {};
    }
    if (a->assignment.job_id() != job_id) continue;  // a job of an earlier run on a given coordinator
    fleet.AddRunner(a->worker, job_id, a->assignment.attempt(), a->assignment.process_index());
    loops.push_back(
        std::make_unique<ReportLoop>(&fleet.stub(a->worker), a->assignment, ReportLoopOptions{}));
  }
  fleet.heartbeat_latency().Clear();
  const int64_t heartbeats_before = fleet.heartbeats_ok();
  for (auto& loop : loops) loop->Start();
  absl::SleepFor(absl::Seconds(o.seconds));  // the measurement window
  for (auto& loop : loops) loop->Stop();
  const int64_t heartbeats = fleet.heartbeats_ok() - heartbeats_before;
  fleet.Stop();
  LatencyRecorder latency;
  int64_t points = 0, requests = 0;
  for (auto& loop : loops) {
    latency.AddAll(loop->latency());
    points += loop->points();
    requests += loop->requests();
    if (!loop->error().ok()) Fail(absl::StrCat("ReportSteps: ", loop->error().error_message()));
  }
  grpc::ClientContext context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  v1::CancelJobResponse cancelled;
  jobs->CancelJob(&context, cancel, &cancelled);
  return {{"metric points", points / o.seconds, requests, latency.Percentile(0.5),
           latency.Percentile(0.99),
           absl::StrFormat("%d runners x %d devices; latency per ReportSteps (%d reports, %d "
                           "points); %.0f ReportSteps/s",
                           o.report_workers, o.devices_per_worker, o.devices_per_worker,
                           o.devices_per_worker * 6, requests / o.seconds)},
          {"heartbeats during reports", heartbeats / o.seconds, heartbeats,
           fleet.heartbeat_latency().Percentile(0.5), fleet.heartbeat_latency().Percentile(0.99),
           absl::StrFormat("the %d report workers' own, 1/s each", o.report_workers)}};
}

int Main(const Options& o) {
  std::unique_ptr<CoordinatorProcess> own;
  std::string address = o.coordinator;
  std::string dir;
  if (address.empty()) {
    dir = testing::TempDir(absl::StrCat("substrax-bench-control-plane-", getpid()));
    // The submit phase queues every job it submits: lift the active-jobs limit (1000 by
    // default) so that it measures the rate, not the limit.
    own = std::make_unique<CoordinatorProcess>(
        o.coordinator_binary.empty() ? CoordinatorRunfile() : o.coordinator_binary, dir,
        std::vector<std::string>{"--max-active-jobs", "1000000"});
    if (absl::Status s = own->Start(); !s.ok()) {
      std::cerr << "control_plane: " << s.message() << "\n";
      return 1;
    }
    address = own->address();
  }
  std::cout << "host: " << std::thread::hardware_concurrency() << " CPUs, load average "
            << bench::LoadAverage() << " at start; coordinator "
            << (own ? absl::StrCat("started here on ", address, " (state in ", dir, ")")
                    : absl::StrCat("at ", address))
            << "; " << o.seconds << " s per phase\n";
  std::vector<Row> rows;
  rows.push_back(Heartbeats(address, o));
  rows.push_back(Submits(address, o));
  for (Row& row : Reports(address, o)) rows.push_back(std::move(row));
  std::cout << absl::StrFormat("%-26s %12s %9s %10s %10s  %s\n", "what", "per_second", "calls",
                               "p50_ms", "p99_ms", "notes");
  for (const Row& row : rows) {
    std::cout << absl::StrFormat("%-26s %12.1f %9d %10.2f %10.2f  %s\n", row.what, row.rate,
                                 row.calls, absl::ToDoubleMilliseconds(row.p50),
                                 absl::ToDoubleMilliseconds(row.p99), row.notes);
  }
  if (own != nullptr) {
    if (absl::Status s = own->Stop(); !s.ok()) Fail(std::string(s.message()));
    own.reset();
    std::filesystem::remove_all(dir);
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace substrax::load

int main(int argc, char** argv) {
  substrax::base::DisableMutexDeadlockDetectionInOptimizedBuilds();
  CLI::App app{"control-plane throughput of substrax-coordinator: heartbeats, submits, metric "
               "points"};
  substrax::load::Options o;
  app.add_option("--coordinator", o.coordinator,
                 "host:port of a running coordinator started with --insecure; empty: start one "
                 "(state in a temp dir)");
  app.add_option("--coordinator_binary", o.coordinator_binary,
                 "coordinator to start (default: the one in the runfiles)");
  app.add_option("--seconds", o.seconds, "length of each phase")->capture_default_str();
  app.add_option("--heartbeat_workers", o.heartbeat_workers, "simulated workers heartbeating")
      ->capture_default_str();
  app.add_option("--heartbeat_interval_ms", o.heartbeat_interval_ms,
                 "each of those workers' heartbeat interval (one outstanding at most)")
      ->capture_default_str();
  app.add_option("--submit_threads", o.submit_threads, "clients submitting back to back")
      ->capture_default_str();
  app.add_option("--report_workers", o.report_workers, "simulated runners reporting steps")
      ->capture_default_str();
  app.add_option("--devices_per_worker", o.devices_per_worker, "devices of each runner")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return substrax::load::Main(o);
}
