#include "worker/collectives/nccl_errors.h"

#include "absl/strings/str_cat.h"

namespace substrax {

std::string NcclResultName(int result) {
  switch (static_cast<NcclResult>(result)) {
    case NcclResult::kSuccess:
      return "ncclSuccess";
    case NcclResult::kUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case NcclResult::kSystemError:
      return "ncclSystemError";
    case NcclResult::kInternalError:
      return "ncclInternalError";
    case NcclResult::kInvalidArgument:
      return "ncclInvalidArgument";
    case NcclResult::kInvalidUsage:
      return "ncclInvalidUsage";
    case NcclResult::kRemoteError:
      return "ncclRemoteError";
    case NcclResult::kInProgress:
      return "ncclInProgress";
  }
  return absl::StrCat("ncclResult ", result);
}

absl::Status TranslateNcclResult(int result, absl::string_view last_error, const NcclCall& call) {
  const auto kind = static_cast<NcclResult>(result);
  // In progress is a state, not a failure: the caller polls until it resolves.
  if (kind == NcclResult::kSuccess || kind == NcclResult::kInProgress) return absl::OkStatus();
  std::string where = absl::StrCat(call.op, " on NCCL communicator '", call.communicator,
                                   "' (rank ", call.rank, " of ", call.size);
  if (!call.self.empty()) absl::StrAppend(&where, ", ", call.self);
  absl::StrAppend(&where, ") failed: ");
  const std::string nccl =
      absl::StrCat(" (nccl: ", NcclResultName(result),
                   last_error.empty() ? "" : absl::StrCat(": ", last_error), ")");
  switch (kind) {
    case NcclResult::kRemoteError:
    case NcclResult::kSystemError: {
      // A peer died or a connection (socket, IB, NVLink) broke: the same collective can only
      // succeed once the job attempt is restarted with live peers.
      const std::string who =
          call.peers.empty()
              ? std::string("a peer died or a connection to it broke and no process is known "
                            "to have died; check the network and the other ranks' logs")
              : absl::StrCat(call.peers, "; the job attempt cannot continue, check that "
                                         "process's log");
      return absl::UnavailableError(absl::StrCat(where, who, nccl));
    }
    case NcclResult::kInvalidArgument:
      return absl::InvalidArgumentError(
          absl::StrCat(where, "NCCL rejected the arguments (buffer, count, type, root)", nccl));
    case NcclResult::kInvalidUsage:
      return absl::FailedPreconditionError(absl::StrCat(
          where, "NCCL cannot run it in the communicator's current state (aborted, not "
                 "initialized, or calls out of order)",
          nccl));
    case NcclResult::kUnhandledCudaError:
      return absl::InternalError(absl::StrCat(
          where, "a CUDA call inside NCCL failed: a device fault; check the GPU (nvidia-smi, "
                 "dmesg)",
          nccl));
    case NcclResult::kInternalError:
      return absl::InternalError(absl::StrCat(
          where, "an internal NCCL error (a bug or memory corruption); check the NCCL_DEBUG=WARN "
                 "log",
          nccl));
    case NcclResult::kSuccess:
    case NcclResult::kInProgress:
      break;
  }
  return absl::InternalError(absl::StrCat(where, "unknown NCCL result", nccl));
}

}  // namespace substrax
