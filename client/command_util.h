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

// An insecure channel to `address` (the coordinator serves plaintext on its cluster network).
std::shared_ptr<grpc::Channel> Connect(const std::string& address);

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
