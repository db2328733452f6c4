// The one place where Gloo's exceptions become absl::Status. Gloo reports a dead
// peer, a timeout and a misuse through three exception types whose meaning differs completely;
// each maps to the code its retry semantics call for, and the message says which collective,
// which communicator and rank, and, when the peer monitor knows, which process died.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_GLOO_ERRORS_H_
#define SUBSTRAX_WORKER_COLLECTIVES_GLOO_ERRORS_H_

#include <exception>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "worker/collectives/peer_monitor.h"

namespace substrax {

// What Gloo threw, classified.
enum class GlooErrorKind {
  kIo,                // gloo::IoException: a connection broke (peer died, network failed)
  kTimeout,           // gloo::IoException "Timed out ...": the operation's timeout expired
  kMisuse,            // gloo::EnforceNotMet: a precondition of the call failed
  kInvalidOperation,  // gloo::InvalidOperationException: not allowed in the current state
  kOther,             // anything else
};

// Classifies the exception currently being handled (call inside a catch block) and returns its
// message.
GlooErrorKind ClassifyCurrentGlooException(std::string* message);

// Who was calling what, for the message.
struct CollectiveCall {
  std::string op;            // "all_reduce"
  std::string communicator;  // "world"
  int rank = 0;
  int size = 0;
  std::string self;          // "device 0 (cpu:0 on host-a)"
  // Ranks of the group by process: ranks_of_process[p] lists the ranks process p drives.
  std::vector<std::vector<int>> ranks_of_process;
  // process_names[p]: who runs process p ("worker w-2 (host b)"), or empty.
  std::vector<std::string> process_names;
};

// kIo and kTimeout with a known death -> UNAVAILABLE naming the dead process, who ran it and its
// ranks;
// kIo otherwise -> UNAVAILABLE; kTimeout otherwise -> DEADLINE_EXCEEDED; kMisuse ->
// INVALID_ARGUMENT; kInvalidOperation -> FAILED_PRECONDITION; kOther -> INTERNAL.
absl::Status TranslateGlooError(GlooErrorKind kind, absl::string_view gloo_message,
                                const CollectiveCall& call,
                                const std::vector<PeerMonitor::Death>& deaths);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_GLOO_ERRORS_H_
