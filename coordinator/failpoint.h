// Failpoints: named places in the coordinator where a chaos test can make it die with SIGKILL,
// to show that what it acknowledged survives and what it had not yet done is done after a
// restart. Compiled in always; armed only by the environment variable SUBSTRAX_FAILPOINTS, a
// comma-separated list of names, read once. Each armed name fires once per process (it dies).
//
//   before_send_start   WatchAssignments: a start event is stored and about to be sent
//   between_successes   ReportAttemptStatus: a SUCCEEDED report arrives while another process
//                       of the same attempt has already been acknowledged as SUCCEEDED
//   before_send_stop    WatchAssignments: a stop event (after a cancel or a failure) is about
//                       to be sent
//
// Thread-safe.
#ifndef SUBSTRAX_COORDINATOR_FAILPOINT_H_
#define SUBSTRAX_COORDINATOR_FAILPOINT_H_

#include "absl/strings/string_view.h"

namespace substrax {

// Whether `name` is armed.
bool FailpointArmed(absl::string_view name);
// Kills this process with SIGKILL (after a line on stderr) if `name` is armed.
void Failpoint(absl::string_view name);

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_FAILPOINT_H_
