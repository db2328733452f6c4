// A job process's answer to SIGTERM (how the agent stops an attempt, and how it preempts one:
// SIGTERM, then SIGKILL after the grace): the first SIGTERM only sets a flag, which the step loop
// (step_loop.h) and SDK programs (substrax::StopRequested) read at their next report to stop
// every device at the same step after a final checkpoint; a second SIGTERM kills the process
// as the default action does, and so does a fence's (contract/stop_signal.h: the attempt may
// already run elsewhere). And the status a run that stopped so ends with.
//
// Thread-safe: the flag is a lock-free atomic, set from the signal handler.
#ifndef SUBSTRAX_WORKER_RUNTIME_PREEMPTION_H_
#define SUBSTRAX_WORKER_RUNTIME_PREEMPTION_H_

#include <cstdint>

#include "absl/status/status.h"

namespace substrax {

// Installs the SIGTERM handler (again, when called again). After the first SIGTERM the handler
// puts back the default action, so a second one ends the process; a fence's SIGTERM ends it at
// once.
void InstallSigtermFlag();

// Whether SIGTERM has arrived since InstallSigtermFlag.
bool SigtermReceived();

// Sets the flag as SIGTERM does, for tests.
void SetSigtermReceivedForTest(bool received);

// ABORTED: "stopped after step N by SIGTERM (preempted); checkpoint of step N written", or
// "...; no checkpoint: the spec has none" when `checkpointed` is false. Carries a payload that
// IsStoppedBySigterm recognises.
absl::Status StoppedBySigterm(int64_t step, bool checkpointed);

// Whether `status` (annotated or not) is StoppedBySigterm's.
bool IsStoppedBySigterm(const absl::Status& status);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_PREEMPTION_H_
