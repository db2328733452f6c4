// Load 3: a report storm. 64 simulated workers of 8 devices hold one running job of 512
// data-parallel devices; each worker's simulated runner reports every step as fast as the
// coordinator answers (one ReportSteps per step with its 8 devices' reports, as a runner does)
// for 30 s. Meanwhile the workers heartbeat every second: the p99 of those heartbeats' round
// trips stays under a tenth of the heartbeat timeout (the bound).
//
// A coordinator that holds its one lock across SQLite fsyncs queues heartbeats behind the
// reports' transactions; this test is the one that shows it.
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/load/load_harness.h"

namespace substrax::load {
namespace {

constexpr int kWorkers = 64;
constexpr int kDevicesPerWorker = 8;
constexpr absl::Duration kStorm = absl::Seconds(30);
constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(10);
// The bound: a heartbeat's p99 round trip under a tenth of the timeout.
const absl::Duration kHeartbeatP99Bound = absl::Seconds(1);  // kHeartbeatTimeout / 10

TEST(ReportStormTest, HeartbeatsStayFastWhile512DevicesReportEveryStep) {
  CoordinatorProcess coordinator(
      CoordinatorRunfile(), testing::TempDir("report-storm"),
      {"--heartbeat-interval", "1s", "--heartbeat-timeout",
       absl::FormatDuration(kHeartbeatTimeout)});
  ASSERT_TRUE(coordinator.Start().ok()) << coordinator.Logs();
  FleetOptions options;
  options.id_prefix = "storm";
  options.workers = kWorkers;
  options.devices_per_worker = kDevicesPerWorker;
  SimulatedFleet fleet(coordinator.address(), options);
  ASSERT_TRUE(fleet.Register().ok());
  fleet.Start();

  auto jobs = v1::JobService::NewStub(Connect(coordinator.address()));
  std::string job_id;
  const int devices = kWorkers * kDevicesPerWorker;
  const grpc::Status submitted = SubmitJob(
      *jobs, LoadJobSpec("report-storm", devices, 1'000'000'000, v1::BACKEND_CPU), &job_id);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();

  // One assignment per worker: process p is the p-th worker of the mesh.
  std::vector<std::unique_ptr<ReportLoop>> runners;
  int local_devices = 0;
  while (static_cast<int>(runners.size()) < kWorkers) {
    std::optional<WorkerAssignment> a = fleet.NextAssignment(absl::Seconds(60));
    ASSERT_TRUE(a.has_value()) << "only " << runners.size() << " of " << kWorkers
                               << " assignments arrived\n" << coordinator.Logs();
    ASSERT_EQ(a->assignment.job_id(), job_id);
    local_devices += a->assignment.local_device_ids_size();
    fleet.AddRunner(a->worker, job_id, a->assignment.attempt(), a->assignment.process_index());
    runners.push_back(
        std::make_unique<ReportLoop>(&fleet.stub(a->worker), a->assignment, ReportLoopOptions{}));
  }
  ASSERT_EQ(local_devices, devices);

  fleet.heartbeat_latency().Clear();
  const int64_t heartbeats_before = fleet.heartbeats_ok();
  for (auto& runner : runners) runner->Start();
  absl::SleepFor(kStorm);  // the measurement window
  for (auto& runner : runners) runner->Stop();
  const absl::Duration p50 = fleet.heartbeat_latency().Percentile(0.5);
  const absl::Duration p99 = fleet.heartbeat_latency().Percentile(0.99);
  const std::string heartbeat_summary = fleet.heartbeat_latency().Summary();
  fleet.Stop();

  int64_t points = 0, requests = 0;
  LatencyRecorder all_reports;
  std::vector<std::string> errors;
  for (auto& runner : runners) {
    points += runner->points();
    requests += runner->requests();
    all_reports.Add(runner->latency().Percentile(0.99));
    if (!runner->error().ok()) errors.push_back(runner->error().error_message());
  }
  const double seconds = absl::ToDoubleSeconds(kStorm);
  std::cout << "report storm: " << devices << " devices on " << kWorkers << " workers for "
            << absl::FormatDuration(kStorm) << ": " << requests << " ReportSteps ("
            << requests / seconds << "/s), " << points << " metric points (" << points / seconds
            << "/s); runners' p99 ReportSteps latencies: " << all_reports.Summary()
            << "\nreport storm: heartbeats during the storm: " << heartbeat_summary
            << " (p50 " << absl::FormatDuration(p50) << ", p99 " << absl::FormatDuration(p99)
            << ", bound " << absl::FormatDuration(kHeartbeatP99Bound) << "); "
            << fleet.heartbeats_ok() - heartbeats_before << " OK, " << fleet.heartbeats_failed()
            << " failed, " << fleet.heartbeats_skipped() << " skipped\n";

  EXPECT_TRUE(errors.empty()) << absl::StrJoin(errors, "\n");
  EXPECT_EQ(fleet.heartbeats_failed(), 0) << absl::StrJoin(fleet.heartbeat_errors(), "\n");
  EXPECT_GT(requests, 0);
  EXPECT_GT(fleet.heartbeat_latency().count(), 0);
  EXPECT_LT(p99, kHeartbeatP99Bound)
      << "heartbeat p99 " << absl::FormatDuration(p99) << " under the report storm";

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  v1::CancelJobResponse cancelled;
  EXPECT_TRUE(jobs->CancelJob(&context, cancel, &cancelled).ok());
  EXPECT_TRUE(coordinator.Stop().ok()) << coordinator.Logs();
}

}  // namespace
}  // namespace substrax::load
