// Load 1: 1,000 concurrent submits. Every answer is OK or RESOURCE_EXHAUSTED (a limit on active
// jobs may refuse some), the acknowledged ids are unique, and after a coordinator restart
// (SIGTERM, start on the same state) ListJobs, page by page, holds exactly the acknowledged jobs.
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/load/load_harness.h"

namespace substrax::load {
namespace {

constexpr int kJobs = 1000;
constexpr int kClientThreads = 16;

TEST(SubmitStormTest, ConcurrentSubmitsAreAllAnsweredAndSurviveARestart) {
  CoordinatorProcess coordinator(CoordinatorRunfile(), testing::TempDir("submit-storm"));
  ASSERT_TRUE(coordinator.Start().ok()) << coordinator.Logs();
  // One simulated worker with one device, so that the cluster could hold every job (else the
  // coordinator refuses them as never fitting): one job runs, the others wait PENDING.
  FleetOptions fleet_options;
  fleet_options.id_prefix = "storm";
  fleet_options.watch_assignments = false;
  auto fleet = std::make_unique<SimulatedFleet>(coordinator.address(), fleet_options);
  ASSERT_TRUE(fleet->Register().ok());
  fleet->Start();

  const v1::JobSpec spec = LoadJobSpec("storm", 1, 1000, v1::BACKEND_CPU);
  struct Answer {
    grpc::StatusCode code = grpc::StatusCode::UNKNOWN;
    std::string message;
    std::string id;
  };
  std::vector<Answer> answers(kJobs);
  LatencyRecorder latency;
  const absl::Time start = absl::Now();
  std::vector<std::thread> clients;
  for (int t = 0; t < kClientThreads; ++t) {
    clients.emplace_back([&, t] {
      // Each client thread has its own connection, as separate clients would.
      grpc::ChannelArguments args;
      args.SetInt("substrax.load.client", t);
      auto jobs = v1::JobService::NewStub(
          grpc::CreateCustomChannel(coordinator.address(), grpc::InsecureChannelCredentials(), args));
      for (int i = t; i < kJobs; i += kClientThreads) {
        const absl::Time sent = absl::Now();
        const grpc::Status status = SubmitJob(*jobs, spec, &answers[i].id, absl::Seconds(60));
        latency.Add(absl::Now() - sent);
        answers[i].code = status.error_code();
        answers[i].message = status.error_message();
      }
    });
  }
  for (std::thread& client : clients) client.join();
  const absl::Duration took = absl::Now() - start;

  std::set<std::string> acknowledged;
  int exhausted = 0;
  for (int i = 0; i < kJobs; ++i) {
    const Answer& a = answers[i];
    if (a.code == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++exhausted;
      continue;
    }
    ASSERT_EQ(a.code, grpc::StatusCode::OK) << "submit " << i << ": " << a.message;
    ASSERT_FALSE(a.id.empty()) << "submit " << i;
    EXPECT_TRUE(acknowledged.insert(a.id).second) << "job id " << a.id << " given twice";
  }
  std::cout << "submit storm: " << kJobs << " submits from " << kClientThreads << " threads in "
            << absl::FormatDuration(took) << ": " << acknowledged.size() << " OK, " << exhausted
            << " RESOURCE_EXHAUSTED; latency " << latency.Summary() << "\n";
  ASSERT_FALSE(acknowledged.empty());

  fleet->Stop();
  fleet.reset();
  ASSERT_TRUE(coordinator.Stop().ok()) << coordinator.Logs();
  ASSERT_TRUE(coordinator.Start().ok()) << coordinator.Logs();
  ASSERT_TRUE(coordinator.WaitServing(absl::Seconds(60))) << coordinator.Logs();

  auto jobs = v1::JobService::NewStub(Connect(coordinator.address()));
  absl::StatusOr<std::vector<v1::Job>> listed = ListAllJobs(*jobs, 100);
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::set<std::string> after;
  std::vector<std::string> unknown;
  for (const v1::Job& job : *listed) {
    EXPECT_TRUE(after.insert(job.id()).second) << "ListJobs gave " << job.id() << " twice";
    if (acknowledged.count(job.id()) == 0) unknown.push_back(job.id());
  }
  std::vector<std::string> lost;
  for (const std::string& id : acknowledged) {
    if (after.count(id) == 0) lost.push_back(id);
  }
  EXPECT_TRUE(unknown.empty()) << unknown.size() << " jobs listed that no client was told of: "
                               << absl::StrJoin(unknown, ", ");
  EXPECT_TRUE(lost.empty()) << lost.size() << " acknowledged jobs lost across the restart: "
                            << absl::StrJoin(lost, ", ");
  EXPECT_EQ(listed->size(), acknowledged.size());
  EXPECT_TRUE(coordinator.Stop().ok()) << coordinator.Logs();
}

}  // namespace
}  // namespace substrax::load
