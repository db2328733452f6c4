// CoordinatorStore: the Store of a job attempt, kept by the coordinator (KeyValueSet /
// KeyValueGet of CoordinatorService, scoped to the attempt). Runners of one attempt connect their
// collectives through it; it is the production counterpart of InMemoryStore and FileStore.
//
// Thread-safe (the gRPC stub is).
#ifndef SUBSTRAX_WORKER_SDK_COORDINATOR_STORE_H_
#define SUBSTRAX_WORKER_SDK_COORDINATOR_STORE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "worker/collectives/store.h"

namespace substrax {

class CoordinatorStore final : public Store {
 public:
  // `secret`: the attempt's Assignment.rendezvous_secret, sent with every call.
  CoordinatorStore(std::shared_ptr<v1::CoordinatorService::StubInterface> stub, std::string job_id,
                   int attempt, std::string secret);

  // Errors: as KeyValueSet (FAILED_PRECONDITION once the attempt has ended; UNAVAILABLE when the
  // coordinator cannot be reached).
  absl::Status Set(const std::string& key, const std::string& value) override;
  // Errors: as KeyValueGet (DEADLINE_EXCEEDED when the key is not set in time).
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  const std::shared_ptr<v1::CoordinatorService::StubInterface> stub_;
  const std::string job_id_;
  const int attempt_;
  const std::string secret_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_SDK_COORDINATOR_STORE_H_
