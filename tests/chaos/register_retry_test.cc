// An agent never gives up registering: the real `substrax-agent` against this test's own
// CoordinatorService, which refuses registrations with RESOURCE_EXHAUSTED (its worker cap
// reached) a few times, then makes room. The agent retries with backoff, logging each refusal,
// ends up registered and heartbeats; and when the coordinator later says its lease is gone
// (ABORTED) and refuses its re-registration the same way, it registers again and goes on
// heartbeating (it used to stop heartbeating for good).
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "tests/fake_coordinator.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

class FullCoordinator final : public v1::CoordinatorService::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override {
    absl::MutexLock lock(&mu_);
    if (refusals_left_ > 0) {
      --refusals_left_;
      ++refused_;
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                          "the coordinator holds 1 workers, its cap (test)");
    }
    incarnations_.push_back(request->incarnation());
    *response->mutable_devices() = request->devices();
    response->mutable_heartbeat_interval()->set_nanos(200 * 1000 * 1000);
    response->mutable_heartbeat_timeout()->set_seconds(30);
    return grpc::Status::OK;
  }

  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse*) override {
    absl::MutexLock lock(&mu_);
    if (lose_lease_ && !incarnations_.empty() && request->incarnation() == incarnations_.back()) {
      lose_lease_ = false;
      refusals_left_ = 2;
      return grpc::Status(grpc::StatusCode::ABORTED, "worker w-1 was declared dead (test)");
    }
    ++heartbeats_[request->incarnation()];
    return grpc::Status::OK;
  }

  grpc::Status WatchAssignments(grpc::ServerContext* context, const v1::WatchAssignmentsRequest*,
                                grpc::ServerWriter<v1::WatchAssignmentsResponse>*) override {
    // Held open (as a real coordinator does) until the agent goes or the test ends.
    while (!context->IsCancelled() &&
           !done_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    }
    return grpc::Status::OK;
  }

  void RefuseNext(int n) {
    absl::MutexLock lock(&mu_);
    refusals_left_ = n;
  }
  // The next heartbeat of the current incarnation gets ABORTED, and the 2 registrations after it
  // RESOURCE_EXHAUSTED.
  void LoseLease() {
    absl::MutexLock lock(&mu_);
    lose_lease_ = true;
  }
  int refused() {
    absl::MutexLock lock(&mu_);
    return refused_;
  }
  int registered() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(incarnations_.size());
  }
  // Heartbeats accepted from the latest registered incarnation.
  int heartbeats_of_latest() {
    absl::MutexLock lock(&mu_);
    return incarnations_.empty() ? 0 : heartbeats_[incarnations_.back()];
  }
  void Finish() {
    if (!done_.HasBeenNotified()) done_.Notify();
  }

 private:
  absl::Notification done_;
  absl::Mutex mu_;
  int refusals_left_ ABSL_GUARDED_BY(mu_) = 0;
  int refused_ ABSL_GUARDED_BY(mu_) = 0;
  bool lose_lease_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> incarnations_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> heartbeats_ ABSL_GUARDED_BY(mu_);
};

int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(RegisterRetryTest, AnAgentRefusedForLackOfRoomRetriesUntilRegisteredEvenAfterALostLease) {
  const std::string base = TempDir("register_retry");
  FullCoordinator coordinator;
  coordinator.RefuseNext(3);
  absl::StatusOr<LoopbackServer> served = ServeOnLoopback(&coordinator);
  ASSERT_TRUE(served.ok()) << served.status();
  Process agent(AgentAgainst(served->port, base + "/work"), base + "/agent.log");

  // Three refusals, then registered, then heartbeats.
  ASSERT_TRUE(PollUntil(
      [&] { return coordinator.registered() == 1 && coordinator.heartbeats_of_latest() >= 3; },
      absl::Seconds(60)))
      << agent.Log();
  EXPECT_EQ(coordinator.refused(), 3);
  const std::string refusal = "registration as w-1 refused by ";
  EXPECT_EQ(Count(agent.Log(), refusal), 3) << agent.Log();
  EXPECT_TRUE(absl::StrContains(agent.Log(), "RESOURCE_EXHAUSTED")) << agent.Log();

  // The lease lost, and the re-registration refused twice: registered again, heartbeating.
  coordinator.LoseLease();
  ASSERT_TRUE(PollUntil(
      [&] { return coordinator.registered() == 2 && coordinator.heartbeats_of_latest() >= 3; },
      absl::Seconds(60)))
      << agent.Log();
  EXPECT_EQ(coordinator.refused(), 5);
  EXPECT_EQ(Count(agent.Log(), refusal), 5) << agent.Log();
  EXPECT_TRUE(agent.Running()) << agent.Log();

  coordinator.Finish();
  const absl::Status stopped = StopAgentAndServer(agent, *served->server, base);
  EXPECT_TRUE(stopped.ok()) << stopped;
}

}  // namespace
}  // namespace substrax::testing
