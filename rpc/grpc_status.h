// Conversions between absl::Status and grpc::Status. The one place in substrax that does them:
// the coordinator's gRPC adapter, the worker daemon and the CLI all call these. absl and gRPC
// share the canonical status codes, so codes map one to one and messages are kept.
#ifndef SUBSTRAX_RPC_GRPC_STATUS_H_
#define SUBSTRAX_RPC_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace substrax {

// What a server handler returns for `status`.
grpc::Status ToGrpcStatus(const absl::Status& status);

// What a client makes of an RPC's status. With `what` (e.g. "rendezvous get 'addr/0'"), the
// message becomes "<what>: <message>", so the caller's error says which call failed.
absl::Status FromGrpcStatus(const grpc::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view what);

}  // namespace substrax

#endif  // SUBSTRAX_RPC_GRPC_STATUS_H_
