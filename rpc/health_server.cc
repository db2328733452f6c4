#include "rpc/health_server.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace substrax {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

grpc::Status HealthServer::Service::Check(grpc::ServerContext*, const HealthCheckRequest* request,
                                          HealthCheckResponse* response) {
  absl::MutexLock lock(&mu_);
  auto it = serving_.find(request->service());
  if (it == serving_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("unknown service '", request->service(), "'"));
  }
  response->set_status(it->second ? HealthCheckResponse::SERVING
                                  : HealthCheckResponse::NOT_SERVING);
  return grpc::Status::OK;
}

grpc::Status HealthServer::Service::Watch(grpc::ServerContext* context,
                                          const HealthCheckRequest* request,
                                          grpc::ServerWriter<HealthCheckResponse>* writer) {
  int last = -1;
  while (!context->IsCancelled()) {
    HealthCheckResponse response;
    {
      absl::MutexLock lock(&mu_);
      if (stopped_) break;
      auto it = serving_.find(request->service());
      response.set_status(it == serving_.end() ? HealthCheckResponse::SERVICE_UNKNOWN
                          : it->second         ? HealthCheckResponse::SERVING
                                               : HealthCheckResponse::NOT_SERVING);
    }
    if (response.status() != last) {
      if (!writer->Write(response)) break;
      last = response.status();
    }
    // Re-check at least every 250 ms, or as soon as a status changes.
    absl::MutexLock lock(&mu_);
    const std::map<std::string, bool> seen = serving_;
    auto changed = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || serving_ != seen; };
    mu_.AwaitWithTimeout(absl::Condition(&changed), absl::Milliseconds(250));
  }
  return grpc::Status::OK;
}

void HealthServer::Service::Set(const std::string& service, bool serving) {
  absl::MutexLock lock(&mu_);
  serving_[service] = serving;
}

void HealthServer::Service::Stop() {
  absl::MutexLock lock(&mu_);
  stopped_ = true;
}

absl::StatusOr<std::unique_ptr<HealthServer>> HealthServer::Start(const std::string& address) {
  std::unique_ptr<HealthServer> server(new HealthServer());
  server->service_.Set("", true);
  grpc::ServerBuilder builder;
  // A second server on a taken port must fail, not share it (gRPC sets SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(&server->service_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve health checks on ", address,
                                               ": the address is in use or not local"));
  }
  return server;
}

void HealthServer::SetServing(const std::string& service, bool serving) {
  service_.Set(service, serving);
}

void HealthServer::Shutdown() {
  if (server_ == nullptr) return;
  service_.Stop();
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  server_.reset();
}

HealthServer::~HealthServer() { Shutdown(); }

}  // namespace substrax
