#include "tests/fake_coordinator.h"

#include <signal.h>
#include <sys/types.h>

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/proc.h"

namespace substrax::testing {

grpc::Status AcceptingCoordinator::RegisterWorker(grpc::ServerContext*,
                                                  const v1::RegisterWorkerRequest* request,
                                                  v1::RegisterWorkerResponse* response) {
  *response->mutable_devices() = request->devices();
  response->mutable_heartbeat_interval()->set_nanos(200 * 1000 * 1000);
  response->mutable_heartbeat_timeout()->set_seconds(30);
  return grpc::Status::OK;
}

grpc::Status AcceptingCoordinator::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest*,
                                             v1::HeartbeatResponse*) {
  return grpc::Status::OK;
}

void AcceptingCoordinator::Finish() {
  if (!done_.HasBeenNotified()) done_.Notify();
}

void AcceptingCoordinator::HoldOpen(grpc::ServerContext* context) {
  while (!context->IsCancelled() &&
         !done_.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
  }
}

absl::StatusOr<LoopbackServer> ServeOnLoopback(grpc::Service* service) {
  LoopbackServer served;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &served.port);
  builder.RegisterService(service);
  served.server = builder.BuildAndStart();
  if (served.server == nullptr || served.port <= 0) {
    return absl::UnavailableError(absl::StrCat(
        "the fake coordinator did not start on 127.0.0.1 (port ", served.port,
        "): is loopback up, with ports free? gRPC's reason is in the test's stderr"));
  }
  return served;
}

std::vector<std::string> AgentAgainst(int port, const std::string& work_dir) {
  std::vector<std::string> argv = {Runfile("agent/substrax-agent"), "--coordinator",
                                   absl::StrCat("127.0.0.1:", port), "--cpu-devices", "1",
                                   "--worker-id", "w-1", "--work-dir", work_dir};
  for (std::string& flag : InsecureFlags()) argv.push_back(std::move(flag));
  return argv;
}

absl::Status StopAgentAndServer(Process& agent, grpc::Server& server, const std::string& test_dir) {
  // Each step runs whatever the one before gave, as the tests' separate expectations did: a
  // hung agent must not leave the server up, nor hide what outlived it.
  absl::Status status;
  agent.Signal(SIGTERM);
  const std::optional<int> exit = agent.Wait(absl::Seconds(30));
  if (!exit.has_value()) {
    status = absl::DeadlineExceededError(absl::StrCat(
        "the agent (pid ", agent.pid(), ") did not exit within 30s of SIGTERM; its log:\n",
        agent.Log()));
  } else if (*exit != 0) {
    status = absl::InternalError(absl::StrCat("the agent exited with ", *exit,
                                              " after SIGTERM, not 0; its log:\n", agent.Log()));
  }
  server.Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  std::vector<pid_t> left;
  const bool none_left = PollUntil(
      [&] {
        left = ProcessesMentioning(test_dir);
        return left.empty();
      },
      absl::Seconds(10));
  if (!none_left) {
    std::string named;
    for (pid_t pid : left) absl::StrAppend(&named, "\n  ", pid, ": ", CommandLine(pid));
    const absl::Status outlived = absl::DeadlineExceededError(absl::StrCat(
        left.size(), " process(es) still name ", test_dir, " 10s after the agent stopped:", named));
    if (status.ok()) {
      status = outlived;
    } else {
      status = absl::Status(status.code(),
                            absl::StrCat(status.message(), "\n", outlived.message()));
    }
  }
  return status;
}

}  // namespace substrax::testing
