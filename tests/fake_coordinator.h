// For tests that drive a real `substrax-agent` against a CoordinatorService of their own (a fake
// written in the test, answering what that test needs): serve the fake on loopback, the agent's
// command line against it, and the end such tests share (the agent stopped by SIGTERM and exiting
// 0, the server shut down, no process left that names the test's directory). The fake itself,
// and releasing the streams it holds open before the end, stay with each test.
// Not thread-safe: call from the test's thread.
#ifndef SUBSTRAX_TESTS_FAKE_COORDINATOR_H_
#define SUBSTRAX_TESTS_FAKE_COORDINATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/grpcpp.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "tests/process.h"

namespace substrax::testing {

// A gRPC server listening plaintext on 127.0.0.1.
struct LoopbackServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the port the system picked
};

// The base of a test's fake: accepts every registration (the devices the agent offers, heartbeats
// every 200 ms, a 30 s timeout) and every heartbeat; a test overrides what it needs. A stream it
// answers stays open (HoldOpen), as a real coordinator's does, until Finish or the agent goes.
// Thread-safe.
class AcceptingCoordinator : public v1::CoordinatorService::Service {
 public:
  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  // Releases every stream held open (call before StopAgentAndServer).
  void Finish();

 protected:
  // Returns once Finish was called or the call was cancelled.
  void HoldOpen(grpc::ServerContext* context);

 private:
  absl::Notification done_;
};

// Serves `service` (not owned: it must outlive the server) at a port the system picks. Fails with
// UNAVAILABLE when the server does not start or binds no port (loopback down or out of ports;
// gRPC logs why to the test's stderr).
absl::StatusOr<LoopbackServer> ServeOnLoopback(grpc::Service* service);

// The command line of `agent/substrax-agent` (from the runfiles, which this library brings)
// against the coordinator at 127.0.0.1:`port`: worker w-1 with 1 CPU device, working in
// `work_dir`, plaintext (InsecureFlags()).
std::vector<std::string> AgentAgainst(int port, const std::string& work_dir);

// Ends the test once the fake has released the streams it holds: SIGTERMs `agent` and waits up
// to 30 s for it to exit, shuts `server` down (5 s for calls in flight), then waits up to 10 s
// until no process mentions `test_dir` (ProcessesMentioning). Every step runs even when one
// before it failed. Fails with DEADLINE_EXCEEDED when the agent did not exit in time or processes
// naming `test_dir` remain, with INTERNAL when the agent exited with a status other than 0; the
// message carries the agent's log and what remained (the first failure gives the code).
absl::Status StopAgentAndServer(Process& agent, grpc::Server& server, const std::string& test_dir);

}  // namespace substrax::testing

#endif  // SUBSTRAX_TESTS_FAKE_COORDINATOR_H_
