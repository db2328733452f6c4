// An assignment event larger than a daemon receives is skipped, never re-read forever: the real
// agent against this test's own CoordinatorService, whose stream sends a small event, then one of
// 5 MiB (over gRPC's default receive limit of 4 MiB, which the agent keeps), then a small one.
// Before, the daemon reopened its stream at the same cursor every second and failed on the same
// event for good; now it logs the skip, resumes after it, and its stream stays open.
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "tests/fake_coordinator.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

constexpr char kEpoch[] = "test-epoch";

v1::WatchAssignmentsResponse StopEvent(int64_t cursor, const std::string& job_id,
                                       size_t reason_bytes) {
  v1::WatchAssignmentsResponse event;
  event.set_epoch(kEpoch);
  event.set_cursor(cursor);
  event.mutable_stop()->set_job_id(job_id);
  event.mutable_stop()->set_attempt(1);
  event.mutable_stop()->set_reason(std::string(reason_bytes, 'r'));
  return event;
}

// Events 1 (small), 2 (5 MiB) and 3 (small) after the cursor a stream asks for; each stream's
// request is recorded.
class FakeCoordinator final : public AcceptingCoordinator {
 public:
  grpc::Status WatchAssignments(grpc::ServerContext* context,
                                const v1::WatchAssignmentsRequest* request,
                                grpc::ServerWriter<v1::WatchAssignmentsResponse>* writer) override {
    {
      absl::MutexLock lock(&mu_);
      cursors_.push_back(request->epoch() == kEpoch ? request->cursor() : 0);
    }
    const std::vector<v1::WatchAssignmentsResponse> events = {
        StopEvent(1, "job-a", 10), StopEvent(2, "job-b", 5 << 20), StopEvent(3, "job-c", 10)};
    const int64_t after = request->epoch() == kEpoch ? request->cursor() : 0;
    for (const v1::WatchAssignmentsResponse& event : events) {
      if (event.cursor() > after && !writer->Write(event)) return grpc::Status::OK;
    }
    HoldOpen(context);
    return grpc::Status::OK;
  }

  std::vector<int64_t> cursors() {
    absl::MutexLock lock(&mu_);
    return cursors_;
  }

 private:
  absl::Mutex mu_;
  std::vector<int64_t> cursors_ ABSL_GUARDED_BY(mu_);
};

TEST(DaemonEventSizeTest, AnEventTooLargeToReceiveIsSkippedOnce) {
  const std::string base = TempDir("daemon_event_size");
  FakeCoordinator coordinator;
  absl::StatusOr<LoopbackServer> served = ServeOnLoopback(&coordinator);
  ASSERT_TRUE(served.ok()) << served.status();
  Process daemon(AgentAgainst(served->port, base + "/work"), base + "/daemon.log");

  // The first stream fails on event 2; the second asks for what follows it.
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::vector<int64_t> cursors = coordinator.cursors();
        return cursors.size() >= 2 && cursors[1] == 2;
      },
      absl::Seconds(30)))
      << daemon.Log();
  EXPECT_TRUE(absl::StrContains(daemon.Log(), "skipped assignment event 2")) << daemon.Log();
  // And it stays on that stream (event 3 arrived; nothing failed it): no third stream comes in
  // the time the old daemon would have reopened it three times.
  EXPECT_FALSE(PollUntil([&] { return coordinator.cursors().size() > 2; }, absl::Seconds(3)))
      << daemon.Log();
  EXPECT_EQ(coordinator.cursors()[0], 0);

  coordinator.Finish();
  const absl::Status stopped = StopAgentAndServer(daemon, *served->server, base);
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace substrax::testing
