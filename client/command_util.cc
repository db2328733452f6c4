#include "client/command_util.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"

namespace substrax::ctl {

absl::StatusOr<std::shared_ptr<grpc::Channel>> Connect(const CommandContext& ctx,
                                                       const std::string& address,
                                                       bool plaintext) {
  TransportOptions transport = ctx.transport;
  if (plaintext) transport.insecure = true;
  return MakeChannel(address, transport);
}

int ReportCredentialError(const CommandContext& ctx, const absl::Status& status) {
  *ctx.err << "substraxctl: " << status.message() << "\n"
           << "substraxctl: give the coordinator's CA with --tls-ca (or $" << kTlsCaEnv
           << ") and your identity with --tls-cert/--tls-key ($" << kTlsCertEnv << ", $"
           << kTlsKeyEnv << ") or --token-file ($" << kTokenFileEnv
           << "); a `substraxctl local up` cluster's credentials are found in "
           << kDefaultLocalStateDir << "/tls (docs/security.md)\n";
  return kExitUsage;
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
}

int ReportRpcError(const CommandContext& ctx, const grpc::Status& status,
                   grpc::Channel* channel) {
  const absl::StatusCode code = FromGrpcStatus(status).code();
  *ctx.err << "substraxctl: " << absl::StatusCodeToString(code) << ": "
           << status.error_message() << "\n";
  const bool connected =
      channel != nullptr && channel->GetState(false) == GRPC_CHANNEL_READY;
  if (code == absl::StatusCode::kDeadlineExceeded && connected) {
    *ctx.err << "substraxctl: the coordinator at " << ctx.coordinator << " did not answer within "
             << absl::FormatDuration(ctx.timeout) << "; try again or raise --timeout\n";
    return kExitError;
  }
  if (IsUnreachable(code)) {
    *ctx.err << "substraxctl: cannot reach the coordinator at " << ctx.coordinator
             << "; start a local cluster with `substraxctl local up`, or give the address of a "
                "running one with --coordinator or "
             << kCoordinatorEnv << "\n";
  }
  return ExitCodeForStatus(code);
}

FormatOptions FormatOptionsOf(const CommandContext& ctx) {
  FormatOptions options;
  options.now = ctx.clock();
  options.zone = ctx.zone;
  options.color = ctx.color;
  return options;
}

int PrintResult(const CommandContext& ctx, const google::protobuf::Message& message,
                const std::function<std::string()>& table, bool empty,
                absl::string_view empty_note) {
  if (ctx.format != OutputFormat::kTable) {
    *ctx.out << FormatMessage(message, ctx.format);
  } else if (empty) {
    *ctx.err << empty_note << "\n";
  } else {
    *ctx.out << table();
  }
  ctx.out->flush();
  return kExitOk;
}

}  // namespace substrax::ctl
