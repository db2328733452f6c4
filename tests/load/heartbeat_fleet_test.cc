// Load 2: 500 simulated workers heartbeat every second for 60 s while a real job trains on a
// real worker daemon. No simulated worker is ever declared dead (every heartbeat answered OK,
// every ListWorkers poll shows them ALIVE) and the real job succeeds.
//
// The coordinator runs with the default lease terms, given explicitly: --heartbeat-interval 1s
// --heartbeat-timeout 10s. The simulated workers have CUDA devices and the job the cpu backend,
// so its mesh can only land on the real daemon's 2 CPU devices.
#include <signal.h>

#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"
#include "tests/load/load_harness.h"

namespace substrax::load {
namespace {

constexpr int kSimulatedWorkers = 500;
constexpr absl::Duration kWindow = absl::Seconds(60);

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

TEST(HeartbeatFleetTest, FiveHundredWorkersKeepTheirLeasesWhileARealJobTrains) {
  const std::string dir = testing::TempDir("heartbeat-fleet");
  CoordinatorProcess coordinator(CoordinatorRunfile(), dir,
                                 {"--heartbeat-interval", "1s", "--heartbeat-timeout", "10s"});
  ASSERT_TRUE(coordinator.Start().ok()) << coordinator.Logs();

  FleetOptions options;
  options.id_prefix = "sim";
  options.workers = kSimulatedWorkers;
  options.device_kind = v1::DEVICE_KIND_CUDA;
  SimulatedFleet fleet(coordinator.address(), options);
  const absl::Time registering = absl::Now();
  ASSERT_TRUE(fleet.Register().ok());
  fleet.Start();
  std::cout << "registered " << kSimulatedWorkers << " simulated workers in "
            << absl::FormatDuration(absl::Now() - registering) << "\n";

  std::vector<std::string> daemon_argv = {
      testing::Runfile("agent/substrax-agent"), "--coordinator",
      coordinator.address(), "--cpu-devices", "2", "--worker-id", "real-1", "--host",
      "real-host", "--work-dir", dir + "/real-1", "--collective-timeout", "60s",
      "--stop-grace", "2s"};
  for (std::string& flag : testing::InsecureFlags()) daemon_argv.push_back(std::move(flag));
  testing::Process daemon(daemon_argv, dir + "/real-1.log");
  auto jobs = v1::JobService::NewStub(Connect(coordinator.address()));
  ASSERT_TRUE(testing::PollUntil(
      [&] {
        absl::StatusOr<std::vector<v1::Worker>> workers = ListWorkers(*jobs);
        if (!workers.ok()) return false;
        for (const v1::Worker& w : *workers) {
          if (w.worker_id() == "real-1" && w.state() == v1::WORKER_STATE_ALIVE) return true;
        }
        return false;
      },
      absl::Seconds(60)))
      << daemon.Log();

  std::string job_id;
  const grpc::Status submitted =
      SubmitJob(*jobs, LoadJobSpec("real-job", 2, 5000, v1::BACKEND_CPU), &job_id);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();

  // The window: poll the workers' states every few seconds; any simulated worker seen not ALIVE
  // is a false lease expiry.
  std::set<std::string> seen_dead;
  int polls = 0;
  std::optional<absl::Time> job_ended;
  const absl::Time window_start = absl::Now();
  while (absl::Now() - window_start < kWindow) {
    absl::StatusOr<std::vector<v1::Worker>> workers = ListWorkers(*jobs);
    ASSERT_TRUE(workers.ok()) << workers.status();
    ++polls;
    int simulated = 0;
    for (const v1::Worker& w : *workers) {
      if (w.worker_id() == "real-1") continue;
      ++simulated;
      if (w.state() != v1::WORKER_STATE_ALIVE) seen_dead.insert(w.worker_id());
    }
    EXPECT_EQ(simulated, kSimulatedWorkers);
    if (!job_ended.has_value()) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
      v1::GetJobRequest request;
      request.set_job_id(job_id);
      v1::GetJobResponse response;
      if (jobs->GetJob(&context, request, &response).ok() &&
          IsTerminal(response.job().state())) {
        job_ended = absl::Now();
      }
    }
    absl::SleepFor(absl::Seconds(5));  // the polling period of the window
  }
  fleet.Stop();

  // The real job (5,000 steps: about as long as the window on an idle machine) may still be
  // training after the window.
  std::optional<v1::Job> job;
  testing::PollUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
        v1::GetJobRequest request;
        request.set_job_id(job_id);
        v1::GetJobResponse response;
        if (!jobs->GetJob(&context, request, &response).ok()) return false;
        job = response.job();
        return IsTerminal(job->state());
      },
      absl::Seconds(180));

  std::cout << "heartbeat fleet: " << kSimulatedWorkers << " workers over "
            << absl::FormatDuration(kWindow) << ": " << fleet.heartbeats_ok() << " OK, "
            << fleet.heartbeats_failed() << " failed, " << fleet.heartbeats_skipped()
            << " skipped (previous one still outstanding); latency "
            << fleet.heartbeat_latency().Summary() << "; " << polls << " ListWorkers polls; "
            << "real job " << (job.has_value() ? v1::JobState_Name(job->state()) : "unknown")
            << (job_ended.has_value()
                    ? absl::StrCat(" (ended ", absl::FormatDuration(*job_ended - window_start),
                                   " into the window)")
                    : " (still running at the window's end)")
            << "\n";
  EXPECT_TRUE(seen_dead.empty()) << seen_dead.size() << " simulated workers declared dead: "
                                 << absl::StrJoin(seen_dead, ", ");
  EXPECT_EQ(fleet.heartbeats_failed(), 0) << absl::StrJoin(fleet.heartbeat_errors(), "\n");
  EXPECT_EQ(fleet.streams_ended(), 0) << absl::StrJoin(fleet.heartbeat_errors(), "\n");
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED)
      << job->DebugString() << "\n" << daemon.Log() << "\n" << coordinator.Logs();

  daemon.Signal(SIGTERM);
  EXPECT_TRUE(daemon.Wait(absl::Seconds(30)).has_value());
  EXPECT_TRUE(coordinator.Stop().ok()) << coordinator.Logs();
  // Nothing outlives the test: no coordinator, daemon or runner still names its directory.
  std::vector<pid_t> left;
  EXPECT_TRUE(testing::PollUntil(
      [&] {
        left = testing::ProcessesMentioning(dir);
        return left.empty();
      },
      absl::Seconds(10)))
      << left.size() << " processes outlived the test, the first pid " << left.front();
}

}  // namespace
}  // namespace substrax::load
