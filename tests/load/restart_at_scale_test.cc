// Load 4: restart at scale. A coordinator holding 1,000,000 metric points and 10,000 finished
// jobs, all produced through the RPCs by simulated workers and runners, is SIGTERMed and
// started again on the same state: it serves within 10 s of its start, and its resident memory
// stays under kRssBound.
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/load/load_harness.h"

namespace substrax::load {
namespace {

// The restarted coordinator's resident memory must stay under this. A coordinator that loads
// every stored metric point into memory at start needs several times this for 1M points; one
// that reads history from SQLite on demand needs its jobs and workers only (10,000 job records
// are a few MiB).
constexpr int64_t kRssBound = int64_t{256} << 20;  // 256 MiB
// It serves (grpc.health.v1 SERVING and a GetJob answered) within this of its start.
constexpr absl::Duration kServeBound = absl::Seconds(10);

constexpr int kFinishedJobs = 10'000;
constexpr int kWave = 250;  // jobs submitted before waiting for them to finish
// 4 jobs x 8 devices x 5,250 steps x 6 points (loss, metric_1 and the 4 timing fields).
constexpr int kHeavyJobs = 4;
constexpr int kHeavyDevices = 8;
constexpr int64_t kHeavySteps = 5'250;
constexpr int64_t kPoints = int64_t{kHeavyJobs} * kHeavyDevices * kHeavySteps * 6;

class RestartAtScaleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Durability is not what this test checks, and on this disk the ~40,000 fsyncs of 10,000
    // jobs took over 10 minutes: the state lives on tmpfs when there is room (it is ~40 MiB).
    dir_ = ScratchDir("restart-at-scale", int64_t{512} << 20);
    std::cout << "state and logs in " << dir_ << "\n";
    // It keeps every ended job of the test (the default keeps 10,000, and would expire the
    // four heavy jobs with their million points).
    coordinator_ = std::make_unique<CoordinatorProcess>(
        CoordinatorRunfile(), dir_,
        std::vector<std::string>{"--max-finished-jobs", absl::StrCat(2 * kFinishedJobs)});
    ASSERT_TRUE(coordinator_->Start().ok()) << coordinator_->Logs();
    jobs_ = v1::JobService::NewStub(Connect(coordinator_->address()));
    FleetOptions options;
    options.id_prefix = "scale";
    // Few workers with many devices: each change wakes every worker's assignment stream.
    options.workers = 8;
    options.devices_per_worker = 8;
    fleet_ = std::make_unique<SimulatedFleet>(coordinator_->address(), options);
    ASSERT_TRUE(fleet_->Register().ok());
    fleet_->Start();
  }

  void TearDown() override {
    fleet_.reset();
    coordinator_.reset();
    std::filesystem::remove_all(dir_);  // tmpfs is not cleaned by Bazel
  }

  // Submits `spec`, retrying while the coordinator answers RESOURCE_EXHAUSTED (a limit on active
  // jobs); the job id.
  std::string Submit(const v1::JobSpec& spec) {
    std::string id;
    for (int tries = 0; tries < 600; ++tries) {
      const grpc::Status status = SubmitJob(*jobs_, spec, &id);
      if (status.ok()) return id;
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << status.error_message();
      if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return "";
      absl::SleepFor(absl::Milliseconds(100));  // back off before the next wave's retry
    }
    return "";
  }

  std::string dir_;
  std::unique_ptr<CoordinatorProcess> coordinator_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<SimulatedFleet> fleet_;
};

TEST_F(RestartAtScaleTest, ServesSoonAndSmallAfterARestartWithAMillionPoints) {
  const absl::Time generation_start = absl::Now();
  // Heavy jobs: their runners report many steps of every device, 250 steps per request.
  std::vector<std::string> heavy;
  for (int j = 0; j < kHeavyJobs; ++j) {
    heavy.push_back(Submit(LoadJobSpec(absl::StrCat("heavy-", j), kHeavyDevices, kHeavySteps,
                                       v1::BACKEND_CPU)));
    ASSERT_FALSE(heavy.back().empty());
  }
  std::map<std::string, int> processes_left;  // job -> processes not yet assigned
  int jobs_assigned = 0;                       // jobs every process of which has arrived
  std::vector<WorkerAssignment> heavy_assignments;
  std::vector<std::unique_ptr<ReportLoop>> loops;
  ReportLoopOptions report_options;
  report_options.steps_per_request = 250;
  report_options.last_step = kHeavySteps;
  while (jobs_assigned < kHeavyJobs) {
    std::optional<WorkerAssignment> a = fleet_->NextAssignment(absl::Seconds(60));
    ASSERT_TRUE(a.has_value()) << coordinator_->Logs();
    const std::string& job = a->assignment.job_id();
    if (!processes_left.count(job)) processes_left[job] = a->assignment.num_processes();
    if (--processes_left[job] == 0) ++jobs_assigned;
    fleet_->AddRunner(a->worker, job, a->assignment.attempt(), a->assignment.process_index());
    loops.push_back(
        std::make_unique<ReportLoop>(&fleet_->stub(a->worker), a->assignment, report_options));
    loops.back()->Start();
    heavy_assignments.push_back(*std::move(a));
    if (heavy_assignments.size() > kHeavyJobs * kHeavyDevices) FAIL() << "more assignments than heavy processes";
  }
  int64_t points = 0;
  for (auto& loop : loops) {
    ASSERT_TRUE(loop->WaitDone(absl::Seconds(300)));
    ASSERT_TRUE(loop->error().ok()) << loop->error().error_message();
    points += loop->points();
  }
  ASSERT_EQ(points, kPoints);
  for (const WorkerAssignment& a : heavy_assignments) {
    ASSERT_TRUE(fleet_->ReportStatus(a, v1::RUNNER_STATE_SUCCEEDED).ok());
    fleet_->RemoveRunner(a.worker, a.assignment.job_id(), a.assignment.attempt(),
                         a.assignment.process_index());
  }
  const absl::Duration heavy_took = absl::Now() - generation_start;

  // Small jobs, in waves: runner threads take each assignment and report success at once.
  std::atomic<int> succeeded{0};
  std::atomic<bool> done{false};
  std::atomic<int> report_failures{0};
  std::vector<std::thread> runners;
  for (int t = 0; t < 2; ++t) {
    runners.emplace_back([&] {
      while (!done.load()) {
        std::optional<WorkerAssignment> a = fleet_->NextAssignment(absl::Milliseconds(200));
        if (!a.has_value()) continue;
        if (fleet_->ReportStatus(*a, v1::RUNNER_STATE_SUCCEEDED).ok()) {
          succeeded.fetch_add(1);
        } else {
          report_failures.fetch_add(1);
        }
      }
    });
  }
  const v1::JobSpec small = LoadJobSpec("small", 1, 10, v1::BACKEND_CPU);
  int submitted = 0;
  while (submitted < kFinishedJobs && !HasFailure()) {
    const int wave = std::min(kWave, kFinishedJobs - submitted);
    for (int i = 0; i < wave; ++i) {
      if (Submit(small).empty()) break;
      ++submitted;
    }
    EXPECT_TRUE(testing::PollUntil([&] { return succeeded.load() >= submitted; },
                                   absl::Seconds(120)))
        << succeeded.load() << " of " << submitted << " small jobs succeeded";
  }
  done = true;
  for (std::thread& runner : runners) runner.join();
  ASSERT_EQ(submitted, kFinishedJobs);
  ASSERT_EQ(report_failures.load(), 0);
  fleet_->Stop();
  const absl::Duration generation_took = absl::Now() - generation_start;
  absl::StatusOr<std::vector<v1::Job>> all = ListAllJobs(*jobs_, 1000);
  ASSERT_TRUE(all.ok()) << all.status();
  int finished = 0;
  for (const v1::Job& job : *all) finished += job.state() == v1::JOB_STATE_SUCCEEDED;
  ASSERT_EQ(finished, kFinishedJobs + kHeavyJobs);
  const int64_t rss_before = coordinator_->RssBytes();

  ASSERT_TRUE(coordinator_->Stop().ok()) << coordinator_->Logs();
  ASSERT_TRUE(coordinator_->Start().ok()) << coordinator_->Logs();
  const absl::Time started = coordinator_->started();
  ASSERT_TRUE(coordinator_->WaitServing(absl::Seconds(120))) << coordinator_->Logs();
  ASSERT_TRUE(testing::PollUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
        v1::GetJobRequest request;
        request.set_job_id(heavy[0]);
        v1::GetJobResponse response;
        return jobs_->GetJob(&context, request, &response).ok();
      },
      absl::Seconds(60)));
  const absl::Duration serve_time = absl::Now() - started;
  // Resident memory once serving, and again after a few seconds of serving (the highest).
  int64_t rss = coordinator_->RssBytes();
  testing::PollUntil([] { return false; }, absl::Seconds(3));
  rss = std::max(rss, coordinator_->RssBytes());

  std::cout << "restart at scale: generated " << kFinishedJobs + kHeavyJobs << " finished jobs and "
            << points << " metric points in " << absl::FormatDuration(generation_took)
            << " (heavy jobs' points in " << absl::FormatDuration(heavy_took) << "); RSS before "
            << "the restart " << rss_before / (1 << 20) << " MiB; after the restart: serving in "
            << absl::FormatDuration(serve_time) << " (bound "
            << absl::FormatDuration(kServeBound) << "), RSS " << rss / (1 << 20)
            << " MiB (bound " << kRssBound / (1 << 20) << " MiB)\n";
  EXPECT_LT(serve_time, kServeBound);
  EXPECT_GT(rss, 0);
  EXPECT_LT(rss, kRssBound) << "resident memory after the restart";
  EXPECT_TRUE(coordinator_->Stop().ok()) << coordinator_->Logs();
}

}  // namespace
}  // namespace substrax::load
