// HealthServer: a plaintext gRPC server that serves only grpc.health.v1, for Kubernetes' native
// grpc probes. Statuses are set per service name ("" is the server as a whole); Check of a name
// never set is NOT_FOUND, as the protocol says.
//
// Thread-safe.
#ifndef SUBSTRAX_RPC_HEALTH_SERVER_H_
#define SUBSTRAX_RPC_HEALTH_SERVER_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace substrax {

class HealthServer {
 public:
  // Serves on `address` (host:port; port 0 picks one). "" starts SERVING.
  // Errors: UNAVAILABLE naming the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HealthServer>> Start(const std::string& address);
  ~HealthServer();

  void SetServing(const std::string& service, bool serving);
  int port() const { return port_; }
  void Shutdown();

 private:
  class Service final : public grpc::health::v1::Health::Service {
   public:
    grpc::Status Check(grpc::ServerContext* context,
                       const grpc::health::v1::HealthCheckRequest* request,
                       grpc::health::v1::HealthCheckResponse* response) override;
    grpc::Status Watch(grpc::ServerContext* context,
                       const grpc::health::v1::HealthCheckRequest* request,
                       grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;
    void Set(const std::string& service, bool serving);
    void Stop();

   private:
    absl::Mutex mu_;
    std::map<std::string, bool> serving_ ABSL_GUARDED_BY(mu_);
    bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  };

  HealthServer() = default;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace substrax

#endif  // SUBSTRAX_RPC_HEALTH_SERVER_H_
