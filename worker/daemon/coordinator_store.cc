#include "worker/daemon/coordinator_store.h"

#include <chrono>

#include "absl/strings/str_cat.h"

namespace substrax {

absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(what, ": ", status.error_message()));
}

CoordinatorStore::CoordinatorStore(std::shared_ptr<v1::CoordinatorService::StubInterface> stub,
                                   std::string job_id, int attempt)
    : stub_(std::move(stub)), job_id_(std::move(job_id)), attempt_(attempt) {}

absl::Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  v1::KeyValueSetRequest request;
  request.mutable_scope()->set_job_id(job_id_);
  request.mutable_scope()->set_attempt(attempt_);
  request.set_key(key);
  request.set_value(value);
  request.set_allow_overwrite(true);
  v1::KeyValueSetResponse response;
  return FromGrpc(stub_->KeyValueSet(&context, request, &response),
                  absl::StrCat("rendezvous set '", key, "'"));
}

absl::StatusOr<std::string> CoordinatorStore::Get(const std::string& key, absl::Duration timeout) {
  grpc::ClientContext context;
  // The server waits up to `timeout`; the RPC gets a little more to carry the answer back.
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(10)));
  v1::KeyValueGetRequest request;
  request.mutable_scope()->set_job_id(job_id_);
  request.mutable_scope()->set_attempt(attempt_);
  request.set_key(key);
  request.mutable_timeout()->set_seconds(absl::ToInt64Seconds(timeout));
  request.mutable_timeout()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(timeout - absl::Seconds(absl::ToInt64Seconds(timeout)))));
  v1::KeyValueGetResponse response;
  absl::Status status = FromGrpc(stub_->KeyValueGet(&context, request, &response),
                                 absl::StrCat("rendezvous get '", key, "'"));
  if (!status.ok()) return status;
  return response.value();
}

}  // namespace substrax
