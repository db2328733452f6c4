#include "worker/sdk/coordinator_store.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"
#include "rpc/proto_time.h"

namespace substrax {

CoordinatorStore::CoordinatorStore(std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
                                   std::string job_id, int attempt, std::string secret)
    : stub_(std::move(stub)),
      job_id_(std::move(job_id)),
      attempt_(attempt),
      secret_(std::move(secret)) {}

absl::Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::KeyValueSetRequest request;
  request.mutable_scope()->set_job_id(job_id_);
  request.mutable_scope()->set_attempt(attempt_);
  request.mutable_scope()->set_secret(secret_);
  request.set_key(key);
  request.set_value(value);
  request.set_allow_overwrite(true);
  v1::KeyValueSetResponse response;
  return FromGrpcStatus(stub_->KeyValueSet(&context, request, &response),
                  absl::StrCat("rendezvous set '", key, "'"));
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext context;
  // The server waits up to `timeout`; the RPC gets a little more to carry the answer back.
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(10)));
  v1::KeyValueGetRequest request;
  request.mutable_scope()->set_job_id(job_id_);
  request.mutable_scope()->set_attempt(attempt_);
  request.mutable_scope()->set_secret(secret_);
  request.set_key(key);
  *request.mutable_timeout() = ToProtoDuration(timeout);
  v1::KeyValueGetResponse response;
  absl::Status status = FromGrpcStatus(stub_->KeyValueGet(&context, request, &response),
                                 absl::StrCat("rendezvous get '", key, "'"));
  if (!status.ok()) return status;
  return response.value();
}

}  // namespace substrax
