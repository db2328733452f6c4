// The worker daemon refuses job ids that are not DNS labels before they name a file: the real
// `substrax-worker daemon` against this test's own CoordinatorService, which accepts the
// registration and then sends assignments (and stops) for "../../escape" and "a/b". The daemon
// must stay alive, log each refusal, and create nothing for those ids, in its work dir or
// anywhere else.
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "tests/fake_coordinator.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kBadJobIds = {"../../escape", "a/b"};

// Accepts any registration, answers heartbeats with stops of the bad ids, and streams one start
// per bad id to each WatchAssignments, then holds the stream open until the test ends.
class FakeCoordinator final : public v1::CoordinatorService::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    {
      absl::MutexLock lock(&mu_);
      registrations_.push_back(*request);
    }
    *response->mutable_devices() = request->devices();
    response->mutable_heartbeat_interval()->set_nanos(200 * 1000 * 1000);
    response->mutable_heartbeat_timeout()->set_seconds(30);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                         v1::HeartbeatResponse* response) override {
    for (const std::string& id : kBadJobIds) {
      v1::StopAttempt* stop = response->add_stop();
      stop->set_job_id(id);
      stop->set_attempt(1);
      stop->set_reason("test");
    }
    return grpc::Status::OK;
  }

  grpc::Status WatchAssignments(
      grpc::ServerContext* context, const v1::WatchAssignmentsRequest*,
      grpc::ServerWriter<v1::WatchAssignmentsResponse>* writer) override {
    int64_t cursor = 0;
    for (const std::string& id : kBadJobIds) {
      v1::WatchAssignmentsResponse event;
      event.set_epoch("test-epoch");
      event.set_cursor(++cursor);
      v1::Assignment* start = event.mutable_start();
      start->set_job_id(id);
      start->set_attempt(1);
      start->set_process_index(0);
      start->set_num_processes(1);
      if (!writer->Write(event)) return grpc::Status::OK;
    }
    v1::WatchAssignmentsResponse stop;
    stop.set_epoch("test-epoch");
    stop.set_cursor(++cursor);
    stop.mutable_stop()->set_job_id(kBadJobIds[0]);
    stop.mutable_stop()->set_attempt(1);
    writer->Write(stop);
    // Held open (as a real coordinator does) until the daemon goes or the test ends.
    while (!context->IsCancelled() &&
           !done_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    }
    return grpc::Status::OK;
  }

  grpc::Status ReportAttemptStatus(grpc::ServerContext*,
                                   const v1::ReportAttemptStatusRequest* request,
                                   v1::ReportAttemptStatusResponse*) override {
    absl::MutexLock lock(&mu_);
    reports_.push_back(*request);
    return grpc::Status::OK;
  }

  void Finish() {
    if (!done_.HasBeenNotified()) done_.Notify();
  }
  int registrations() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(registrations_.size());
  }
  int reports() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(reports_.size());
  }

 private:
  absl::Notification done_;
  absl::Mutex mu_;
  std::vector<v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::ReportAttemptStatusRequest> reports_ ABSL_GUARDED_BY(mu_);
};

// Every path under `dir` (recursively), relative to it.
std::vector<std::string> Tree(const std::string& dir) {
  std::vector<std::string> paths;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    paths.push_back(fs::relative(it->path(), dir).string());
  }
  return paths;
}

TEST(DaemonJobIdTest, RefusesJobIdsThatAreNotDnsLabelsAndStaysUp) {
  // base/outside/... would be where "../../escape" leads from base/outside/work.
  const std::string base = TempDir("daemon_job_id");
  const std::string work_dir = base + "/outside/work";
  fs::create_directories(work_dir);

  FakeCoordinator coordinator;
  absl::StatusOr<LoopbackServer> served = ServeOnLoopback(&coordinator);
  ASSERT_TRUE(served.ok()) << served.status();
  Process daemon(AgentAgainst(served->port, work_dir), base + "/daemon.log");

  auto logged_refusals = [&] {
    const std::string log = daemon.Log();
    for (const std::string& id : kBadJobIds) {
      if (!absl::StrContains(log, absl::StrCat("refused an assignment for job id '", id, "'"))) {
        return false;
      }
    }
    return absl::StrContains(log, "refused a stop event for job id '../../escape'") &&
           absl::StrContains(log, "refused a heartbeat's stop for job id 'a/b'");
  };
  ASSERT_TRUE(PollUntil(logged_refusals, absl::Seconds(30))) << daemon.Log();
  EXPECT_EQ(coordinator.registrations(), 1) << daemon.Log();
  EXPECT_TRUE(daemon.Running()) << daemon.Log();
  EXPECT_THAT(daemon.Log(), ::testing::HasSubstr("not a DNS-1123 label"));

  // Nothing was written for the bad ids: the work dir is empty, and nothing under the test's
  // directory is named after them; nothing was reported for them either.
  EXPECT_THAT(Tree(work_dir), ::testing::IsEmpty());
  for (const std::string& path : Tree(base)) {
    EXPECT_FALSE(absl::StrContains(path, "escape")) << path;
    EXPECT_FALSE(absl::StrContains(path, "attempt")) << path;
  }
  EXPECT_FALSE(fs::exists(work_dir + "/a"));
  EXPECT_EQ(coordinator.reports(), 0);

  // Still alive and serving: it stops cleanly on SIGTERM.
  EXPECT_TRUE(daemon.Running()) << daemon.Log();
  coordinator.Finish();
  // Nothing outlives the test: no daemon or runner still names its directory.
  const absl::Status stopped = StopAgentAndServer(daemon, *served->server, base);
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace substrax::testing
