// Hang attribution: when a job's progress stalls, which rank the others wait for, from the
// collective counts and phases its processes publish (contract/activity.h) and their agents
// relay with every heartbeat.
//
// For each communicator group (the same name on every rank), the collective the waiting ranks
// are in is #N, the most any rank has entered; a rank that has entered fewer and is not itself
// waiting in a collective is what the group waits for, and the report says what it is doing
// instead (its last phase, and since when). A rank behind in one group because it waits in
// another is not blamed (it is a waiter too). When every rank of a group has entered #N and
// waits, but not in the same collective (another kind or another size), the ranks are desynced:
// the report names the ranks whose collective differs from the most common one. A process that
// published nothing, or whose agent relays nothing any more, shows no sign of life. A summary
// names at most 8 ranks ("; and 55 more") and quotes the log lines of the first two processes
// blamed: its length is bounded whatever the job's size.
//
// Pure; thread-compatible.
#ifndef SUBSTRAX_COORDINATOR_HANG_ATTRIBUTION_H_
#define SUBSTRAX_COORDINATOR_HANG_ATTRIBUTION_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

// How much of the end of a process's log the coordinator keeps for hang reports.
inline constexpr size_t kHangLogTailBytes = 600;

// One process of the stalled attempt as the coordinator knows it.
struct ProcessView {
  // "process 1 (worker w-1 (host b))": for messages.
  std::string name;
  // The latest activity its agent relayed; absent: none yet (has_activity false).
  bool has_activity = false;
  v1::ProcessActivity activity;
  // Its devices (for a command job's stall: a device with no report line is named).
  std::vector<int> device_ids;
  // Its runner is stopped by a signal.
  bool suspended = false;
  // The end of its log (at most kHangLogTailBytes); its last whole lines (up to 3) are quoted
  // for the processes blamed.
  std::string log_tail;
};

// What the attribution found.
struct HangAttribution {
  // True when a rank (or a desync) could be named.
  bool found = false;
  // "all_reduce #4061 over axis 'data' group 0 entered by 3 of 4 ranks; rank 2 (device 2 of
  // process 1 (worker w-1 (host b))) has not entered it: in compute since 14:02:11 UTC (step
  // 812); its last log lines: ...". Empty when nothing was found.
  std::string summary;
  // The processes blamed (indices into the views), for the job's error.
  std::vector<int> blamed;
};

HangAttribution AttributeHang(const std::vector<ProcessView>& processes);

// A command job's stall. Its frameworks count no collectives; its launcher publishes when the
// report file of each of its devices' processes last had a line (a step or a heartbeat: the
// "report" phase). The devices named are those whose process wrote no line at all while others
// did, or whose last line is more than 2 s older than the newest of any: a process that still
// writes heartbeats is alive (waiting for the others), one that went silent first is what they
// wait for.
HangAttribution AttributeCommandStall(const std::vector<ProcessView>& processes);

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_HANG_ATTRIBUTION_H_
