// A preemption's stop reaches the job process with the coordinator's grace: the real agent
// (--stop-grace 1s) against this test's own CoordinatorService, which starts a program job whose
// program notes SIGTERM and goes on, then sends StopAttempt{preempt, grace 4s}. The attempt's log
// says "preempted: ...; SIGTERM, SIGKILL after 4s" before the program's own note, and the
// SIGKILL comes after the 4 s, not after the agent's 1 s.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/proto_time.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "tests/fake_coordinator.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kJob[] = "preempted-1";
constexpr absl::Duration kPreemptGrace = absl::Seconds(4);

// Streams the program job's start, then, once told (StopNow), its preemption; records the
// runner's outcome and when it came.
class FakeCoordinator final : public AcceptingCoordinator {
 public:
  explicit FakeCoordinator(std::string program) : program_(std::move(program)) {}

  grpc::Status WatchAssignments(grpc::ServerContext* context,
                                const v1::WatchAssignmentsRequest* request,
                                grpc::ServerWriter<v1::WatchAssignmentsResponse>* writer) override {
    if (request->cursor() == 0) {
      v1::WatchAssignmentsResponse event;
      event.set_epoch("test-epoch");
      event.set_cursor(1);
      v1::Assignment* start = event.mutable_start();
      start->set_job_id(kJob);
      start->set_attempt(1);
      start->set_process_index(0);
      start->set_num_processes(1);
      start->mutable_spec()->mutable_program()->set_path(program_);
      if (!writer->Write(event)) return grpc::Status::OK;
    }
    while (!context->IsCancelled() &&
           !stop_now_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    }
    if (stop_now_.HasBeenNotified() && request->cursor() < 2) {
      v1::WatchAssignmentsResponse event;
      event.set_epoch("test-epoch");
      event.set_cursor(2);
      v1::StopAttempt* stop = event.mutable_stop();
      stop->set_job_id(kJob);
      stop->set_attempt(1);
      stop->set_reason("job urgent-2 of priority high needs its devices");
      stop->set_preempt(true);
      *stop->mutable_grace() = ToProtoDuration(kPreemptGrace);
      {
        absl::MutexLock lock(&mu_);
        stop_sent_ = absl::Now();
      }
      writer->Write(event);
    }
    HoldOpen(context);
    return grpc::Status::OK;
  }

  grpc::Status ReportAttemptStatus(grpc::ServerContext*,
                                   const v1::ReportAttemptStatusRequest* request,
                                   v1::ReportAttemptStatusResponse*) override {
    absl::MutexLock lock(&mu_);
    if (!report_.has_value()) {
      report_ = *request;
      reported_ = absl::Now();
    }
    return grpc::Status::OK;
  }

  void StopNow() { stop_now_.Notify(); }
  // The runner's outcome and how long after the stop it came, once reported.
  std::optional<std::pair<v1::ReportAttemptStatusRequest, absl::Duration>> Outcome() {
    absl::MutexLock lock(&mu_);
    if (!report_.has_value()) return std::nullopt;
    return std::make_pair(*report_, reported_ - stop_sent_);
  }

 private:
  const std::string program_;
  absl::Notification stop_now_;
  absl::Mutex mu_;
  absl::Time stop_sent_ ABSL_GUARDED_BY(mu_);
  std::optional<v1::ReportAttemptStatusRequest> report_ ABSL_GUARDED_BY(mu_);
  absl::Time reported_ ABSL_GUARDED_BY(mu_);
};

// The attempt's log in the agent's work dir (empty until there is one).
std::string AttemptLog(const std::string& work_dir) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(work_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (absl::StrContains(name, kJob) && absl::EndsWith(name, ".log")) {
      return ReadFile(entry.path().string());
    }
  }
  return "";
}

TEST(PreemptGraceTest, APreemptedProcessGetsTheCoordinatorsLongerGraceAndItsLogSaysSo) {
  const std::string base = TempDir("preempt_grace");
  const std::string programs = base + "/programs";
  const std::string work_dir = base + "/work";
  fs::create_directories(programs);
  fs::create_directories(work_dir);
  // Notes SIGTERM and goes on (a program writing its checkpoint): only SIGKILL ends it.
  const std::string program = programs + "/stubborn";
  std::ofstream(program) << "#!/bin/sh\n"
                            "trap 'echo \"program: got SIGTERM\"' TERM\n"
                            "echo \"program: ready\"\n"
                            "while :; do sleep 0.1; done\n";
  ASSERT_EQ(chmod(program.c_str(), 0755), 0);

  FakeCoordinator coordinator(program);
  absl::StatusOr<LoopbackServer> served = ServeOnLoopback(&coordinator);
  ASSERT_TRUE(served.ok()) << served.status();
  std::vector<std::string> argv = AgentAgainst(served->port, work_dir);
  for (const char* flag : {"--programs-dir", programs.c_str(), "--stop-grace", "1s"}) {
    argv.push_back(flag);
  }
  Process daemon(argv, base + "/daemon.log");

  ASSERT_TRUE(PollUntil([&] { return absl::StrContains(AttemptLog(work_dir), "program: ready"); },
                        absl::Seconds(30)))
      << daemon.Log();
  coordinator.StopNow();
  std::optional<std::pair<v1::ReportAttemptStatusRequest, absl::Duration>> outcome;
  ASSERT_TRUE(PollUntil([&] { return (outcome = coordinator.Outcome()).has_value(); },
                        absl::Seconds(30)))
      << daemon.Log();

  const std::string log = AttemptLog(work_dir);
  const std::string line =
      "substrax-agent: preempted: job urgent-2 of priority high needs its devices; SIGTERM, "
      "SIGKILL after 4s\n";
  ASSERT_THAT(log, ::testing::HasSubstr(line)) << log;
  ASSERT_THAT(log, ::testing::HasSubstr("program: got SIGTERM")) << log;
  EXPECT_LT(log.find(line), log.find("program: got SIGTERM")) << log;
  // SIGKILL after the preemption's 4 s, not the agent's 1 s (the margin below is for a loaded
  // machine: the stop travels and the report returns after the kill).
  EXPECT_GE(outcome->second, kPreemptGrace - absl::Milliseconds(500)) << daemon.Log();
  EXPECT_EQ(outcome->first.state(), v1::RUNNER_STATE_FAILED);
  EXPECT_THAT(outcome->first.error(), ::testing::HasSubstr("killed by signal 9")) << daemon.Log();
  EXPECT_THAT(daemon.Log(), ::testing::HasSubstr("still there after 4s: SIGKILL"));

  coordinator.Finish();
  const absl::Status stopped = StopAgentAndServer(daemon, *served->server, base);
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace substrax::testing
