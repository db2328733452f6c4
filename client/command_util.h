// What the commands share: channels, deadlines, how an RPC error is reported, and the format
// options of a context. Internal to //client:commands.
#ifndef SUBSTRAX_CLIENT_COMMAND_UTIL_H_
#define SUBSTRAX_CLIENT_COMMAND_UTIL_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/commands.h"
#include "grpcpp/grpcpp.h"
#include "substrax/v1/job_service.grpc.pb.h"

namespace substrax::ctl {

// A channel to `address` with the credentials of `ctx` (mutual TLS or a token; or plaintext
// with --insecure, and for `plaintext`: the health-only listeners). Errors: INVALID_ARGUMENT
// (no CA, unreadable credential files), to be reported with ReportCredentialError.
absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const CommandContext& ctx,
                                                       const std::string& address,
                                                       bool plaintext = false);

// Prints "substraxctl: <message>" and how to give credentials; returns kExitUsage.
int ReportCredentialError(const CommandContext& ctx, const absl::Status& status);

// Sets the deadline of one RPC to now + `timeout`.
void SetDeadline(grpc::ClientContext* context, absl::Duration timeout);

// Prints "substraxctl: <CODE>: <message>" on ctx.err and returns the exit code. UNAVAILABLE, and
// DEADLINE_EXCEEDED while `channel` never connected, mean the coordinator is unreachable: the
// message names ctx.coordinator and suggests `substraxctl local up` or --coordinator (exit 3).
// A deadline hit on a connected channel is a slow coordinator (exit 1, suggests --timeout).
int ReportRpcError(const CommandContext& ctx, const grpc::Status& status,
                   grpc::Channel* channel);

// The table options of `ctx`: its clock's now, its zone and colour setting.
FormatOptions FormatOptionsOf(const CommandContext& ctx);

// One unary JobService call with the context's deadline; errors are reported and mapped.
template <typename Request, typename Response>
int CallJobService(const CommandContext& ctx,
                   grpc::Status (v1::JobService::Stub::*method)(grpc::ClientContext*,
                                                                const Request&, Response*),
                   const Request& request, Response* response) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = Connect(ctx, ctx.coordinator);
  if (!channel.ok()) return ReportCredentialError(ctx, channel.status());
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(*channel);
  grpc::ClientContext context;
  SetDeadline(&context, ctx.timeout);
  const grpc::Status status = (stub.get()->*method)(&context, request, response);
  if (!status.ok()) return ReportRpcError(ctx, status, channel->get());
  return kExitOk;
}

// Prints a command's result: `message` as JSON or YAML, else `table()`, except that an `empty`
// result in table form is `empty_note` on stderr (so stdout stays empty for scripts).
int PrintResult(const CommandContext& ctx, const google::protobuf::Message& message,
                const std::function<std::string()>& table, bool empty = false,
                absl::string_view empty_note = "");

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_COMMAND_UTIL_H_
