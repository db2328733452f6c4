// How the agent stops a runner for one StopAttempt of the coordinator: the reason it logs and
// reports, and the grace between SIGTERM and SIGKILL. A preemption (StopAttempt.preempt) gets
// the longer of the agent's --stop-grace and the event's grace, so that the job can write a
// final checkpoint, and says so in the attempt's log.
#ifndef SUBSTRAX_AGENT_STOP_ORDER_H_
#define SUBSTRAX_AGENT_STOP_ORDER_H_

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "substrax/v1/coordinator_service.pb.h"

namespace substrax {

struct StopOrder {
  // Why, as the runner's outcome and the agent's log give it.
  std::string reason;
  // SIGKILL this long after SIGTERM, unless the runner has exited.
  absl::Duration grace;
  bool preempt = false;
  // The agent lost its lease or cannot renew it: the coordinator may start the attempt elsewhere,
  // so the job must end at once (a fence's SIGTERM, contract/stop_signal.h), never checkpoint.
  bool fence = false;
};

// The order for `stop` on an agent whose --stop-grace is `stop_grace`; `from` is put before the
// coordinator's reason ("the coordinator says: " for a heartbeat's stop, empty for the stream's).
// A preemption's reason reads "preempted: <reason>" and its grace is max(stop_grace, its grace).
StopOrder StopOrderOf(const v1::StopAttempt& stop, absl::Duration stop_grace,
                      absl::string_view from = "");

// The line the agent adds to the attempt's log (the job's stderr) when it stops a preempted
// runner: "preempted: <reason>; SIGTERM, SIGKILL after <grace>". Empty for other stops (the
// runner's outcome names them).
std::string StopLogLine(const StopOrder& order);

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_STOP_ORDER_H_
