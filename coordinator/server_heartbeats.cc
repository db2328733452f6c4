// HeartbeatServer: the Heartbeat calls on a completion queue of their own (see
// server_internal.h for why). A call goes through two phases on the queue: requested (its tag
// comes back when a heartbeat arrived in it), then answered (its tag comes back when the answer
// is sent, and it is deleted).
#include <memory>
#include <utility>

#include "coordinator/request_limits.h"
#include "coordinator/server_internal.h"
#include "rpc/grpc_status.h"
#include "rpc/proto_time.h"

namespace substrax::server_internal {

struct HeartbeatServer::Call {
  Call() : writer(&context) {}
  bool answered = false;
  grpc::ServerContext context;
  v1::HeartbeatRequest request;
  v1::HeartbeatResponse response;
  grpc::ServerAsyncResponseWriter<v1::HeartbeatResponse> writer;
};

HeartbeatServer::HeartbeatServer(ServerState* state, CoordinatorServiceBase* service,
                                 std::unique_ptr<grpc::ServerCompletionQueue> queue)
    : state_(state), service_(service), queue_(std::move(queue)) {}

HeartbeatServer::~HeartbeatServer() { Shutdown(); }

void HeartbeatServer::Start() {
  for (int i = 0; i < limits::kHeartbeatCallsRequested; ++i) Request();
  for (int i = 0; i < limits::kHeartbeatThreads; ++i) threads_.emplace_back([this] { Loop(); });
}

void HeartbeatServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  queue_->Shutdown();
  for (std::thread& t : threads_) t.join();  // they drain the queue
}

void HeartbeatServer::Request() {
  auto* call = new Call();
  service_->RequestHeartbeat(&call->context, &call->request, &call->writer, queue_.get(),
                             queue_.get(), call);
}

void HeartbeatServer::Loop() {
  void* tag = nullptr;
  bool ok = false;
  while (queue_->Next(&tag, &ok)) {
    auto* call = static_cast<Call*>(tag);
    if (call->answered || !ok) {
      // Answered (sent or not), or a requested call the server's shutdown cancelled.
      delete call;
      continue;
    }
    Request();  // the next heartbeat's call, before this one is handled
    Answer(call);
  }
}

void HeartbeatServer::Answer(Call* call) {
  absl::Status status;
  if (absl::StatusOr<Caller> caller = state_->authorizer.Decision(&call->context); !caller.ok()) {
    status = caller.status();
  } else if (status = ServerState::CheckWorker(*caller, call->request.worker_id());
             status.ok() && (status = CheckRequest(call->request)).ok()) {
    absl::StatusOr<v1::HeartbeatResponse> answer = state_->cluster->Heartbeat(call->request);
    status = answer.status();
    if (answer.ok()) call->response = *std::move(answer);
  }
  // The time it answers at, as late as possible: the agent measures its clock against it.
  *call->response.mutable_server_time() = ToProtoTime(absl::Now());
  call->answered = true;
  if (status.ok()) {
    call->writer.Finish(call->response, grpc::Status::OK, call);
  } else {
    call->writer.FinishWithError(ToGrpcStatus(status), call);
  }
}

}  // namespace substrax::server_internal
