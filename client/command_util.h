// What the commands share: channels, deadlines, how an RPC error is reported, and the format
// options of a context. Internal to //client:commands.
#ifndef SUBSTRAX_CLIENT_COMMAND_UTIL_H_
#define SUBSTRAX_CLIENT_COMMAND_UTIL_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "client/commands.h"
#include "grpcpp/grpcpp.h"

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

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_COMMAND_UTIL_H_
