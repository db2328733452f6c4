// The one place where NCCL's results become absl::Status. Builds without CUDA:
// NcclResult mirrors ncclResult_t's stable values, so the mapping and its table test run in the
// default build; under --config=cuda, nccl_communicator.cc static_asserts the mirror against
// nccl.h.
//
// Codes by retry semantics (communicator.h):
//   kRemoteError, kSystemError  a peer died or a connection broke    -> UNAVAILABLE
//   kInvalidArgument            the call is wrong                    -> INVALID_ARGUMENT
//   kInvalidUsage               wrong state / order of calls         -> FAILED_PRECONDITION
//   kUnhandledCudaError         a CUDA call inside NCCL failed: a device fault -> INTERNAL
//   kInternalError              a bug or corruption inside NCCL      -> INTERNAL
//   kSuccess                    -> OK
//   kInProgress                 -> OK: not an error of its own. A non-blocking communicator
//                                  returns it while an operation is still being set up or
//                                  enqueued; the caller keeps polling ncclCommGetAsyncError
//                                  (NcclWatchdog does) until it turns into success or an error.
//   any other value             -> INTERNAL ("unknown NCCL result")
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_NCCL_ERRORS_H_
#define SUBSTRAX_WORKER_COLLECTIVES_NCCL_ERRORS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace substrax {

// ncclResult_t's values (nccl.h), which NCCL keeps stable across versions.
enum class NcclResult : int {
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// "ncclRemoteError", or "ncclResult 42" for a value this mirror does not know.
std::string NcclResultName(int result);

// Who was calling what, for the message.
struct NcclCall {
  std::string op;            // "all_reduce", "init", "split"
  std::string communicator;  // "world", "axis 'data' group 1"
  int rank = 0;
  int size = 0;
  std::string self;          // "device 0 (cuda:0 on host-a)"; may be empty
  // What is known about the peers when the error is a remote or system one: "process 2
  // (worker w-2, host b) died" from the peer monitor or coordinator; may be empty.
  std::string peers;
};

// `result` is an ncclResult_t value; `last_error` is ncclGetLastError(comm)'s text (may be
// empty). See the table above.
absl::Status TranslateNcclResult(int result, absl::string_view last_error, const NcclCall& call);
inline absl::Status TranslateNcclResult(NcclResult result, absl::string_view last_error,
                                        const NcclCall& call) {
  return TranslateNcclResult(static_cast<int>(result), last_error, call);
}

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_NCCL_ERRORS_H_
