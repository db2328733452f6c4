// Job failpoints: named faults a chaos test arms in a job process to make one rank hang the
// ways real jobs hang (tests/chaos/hang_test.cc), so that hang attribution can be shown to name
// exactly that rank. Compiled in always; armed only by the environment variable
// SUBSTRAX_JOB_FAILPOINTS, which the agent passes to a job process only when its operator names
// it in --job-env-pass. A comma-separated list of NAME:process=P:at=N[:peer=Q], read once:
//
//   sleep_before_all_reduce  the first all-reduce of process P numbered N or later on its
//                            communicator: the thread sleeps before entering it, forever
//   skip_all_reduce          the same all-reduce is skipped: the rank goes on to its next
//                            collective while its peers wait in this one (a desync)
//   hang_at_step             every device of process P stops at the start of step N, in its
//                            data phase, forever (a process that makes no progress without
//                            being stopped by a signal)
//   slow_link                `substraxctl doctor`'s link measurements of process P (with
//                            peer=Q: only its link to process Q) wait N milliseconds before
//                            each all-reduce: a slow link where tc netem is not available
//
// Each fires once per process (the first thread to reach it), slow_link at every all-reduce.
// Thread-safe.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_JOB_FAILPOINTS_H_
#define SUBSTRAX_WORKER_COLLECTIVES_JOB_FAILPOINTS_H_

#include <cstdint>

#include "absl/time/time.h"

namespace substrax {

inline constexpr char kJobFailpointsEnv[] = "SUBSTRAX_JOB_FAILPOINTS";

// This process's index in its attempt (until set, no failpoint fires).
void SetJobFailpointProcess(int process_index);

// What to do with an all-reduce numbered `number` (from 1) on its communicator.
enum class AllReduceFault { kNone, kSkip };
// Sleeps forever when sleep_before_all_reduce fires; kSkip when skip_all_reduce does.
AllReduceFault JobFailpointBeforeAllReduce(int64_t number);

// Sleeps forever when hang_at_step fires for step `step` (0-based steps completed + 1).
void JobFailpointAtStep(int64_t step);

// The delay slow_link adds before each all-reduce of this process's doctor link to process
// `peer` (zero when not armed).
absl::Duration JobFailpointLinkDelay(int peer);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_JOB_FAILPOINTS_H_
