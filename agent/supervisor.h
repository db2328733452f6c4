// The supervisor of one job process: a small process between the agent and the job process that
// holds the attempt's lease and fences the job on its own, so that fencing works for any command
// and does not depend on the agent running.
//
// The agent forks the supervisor, which forks the job process (launch.h: the job's exec is
// there) in a process group of its own, then executes `substrax-agent supervise` (the agent's
// own binary, /proc/self/exe, in a mode of its own). The supervisor is in a process group of its
// own too, so a signal to the agent's group (a terminal's ^Z) does not stop it, and it outlives
// the agent. Two pipes join them:
//   control (agent -> supervisor): lease renewals, each an absolute deadline on CLOCK_MONOTONIC
//     (system-wide), and signals for the job's group (the agent's own stops: SIGTERM, then
//     SIGKILL after --stop-grace);
//   status (supervisor -> agent): the job's pid once it is forked, and when it has exited its
//     wait status exactly as waitpid returned it (runner_outcome.h judges that) and whether the
//     supervisor fenced it.
// The supervisor fences the job (SIGTERM to its process group, SIGKILL after the grace) when the
// deadline passes without renewal (the agent is stopped, hung, or cannot reach the coordinator:
// the agent's deadline is the last acknowledged heartbeat's send time plus the lease minus a
// margin, so the job is told to stop before the coordinator can start the attempt elsewhere),
// when the control pipe reaches EOF (the agent is gone, however it died) and when the supervisor
// itself gets SIGTERM, SIGINT or SIGHUP. Once the job's leader has exited, whatever is left in
// its group gets SIGKILL, and the supervisor exits.
//
// If the supervisor itself is SIGKILLed, the job's leader dies with it (PR_SET_PDEATHSIG: the
// supervisor is single-threaded) and the agent, which reaps the supervisor, SIGKILLs the rest of
// the group.
#ifndef SUBSTRAX_AGENT_SUPERVISOR_H_
#define SUBSTRAX_AGENT_SUPERVISOR_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace substrax {

// The first argument that makes `substrax-agent` a supervisor (main.cc).
inline constexpr char kSupervisorMode[] = "supervise";

// Runs the supervisor (after `substrax-agent supervise --control-fd=N --status-fd=N
// --job-pid=N --grace-ms=N --deadline-ns=N [--job=LABEL]`, as StartSupervised executes it).
// Returns the process's exit status: 0 once the job's exit is reported, 2 for a bad command line
// (the mode is internal to the agent).
int SupervisorMain(int argc, char** argv);

// Why the supervisor stopped the job on its own (none: it did not).
enum class FenceCause : int64_t {
  kNone = 0,
  kLeaseExpired = 1,  // the deadline passed without renewal
  kAgentGone = 2,     // the control pipe reached EOF
  kSignalled = 3,     // the supervisor got SIGTERM, SIGINT or SIGHUP
};

// What the agent reads of one finished supervised process.
struct SupervisedExit {
  // The job process's wait status as waitpid returned it; when the supervisor died without
  // reporting it, the supervisor's own.
  int wait_status = 0;
  FenceCause fence = FenceCause::kNone;
  // False when the supervisor died without reporting (then wait_status is its own).
  bool reported = true;
};

// "the agent missed its lease renewal ..." for a fence cause (empty for kNone): why the job was
// stopped, for the attempt's outcome.
std::string FenceReason(FenceCause cause);

// One supervised job process as the agent holds it. Not copyable in spirit: exactly one owner
// closes the fds (Close, AwaitExit).
struct SupervisedChild {
  pid_t supervisor = 0;
  pid_t job = 0;       // the job process, leader of its own group
  int control_fd = -1;  // write end (non-blocking)
  int status_fd = -1;   // read end
};

// Writes a renewal (the job may run until `deadline` on the monotonic clock, as
// std::chrono::steady_clock counts it) or a signal order to the supervisor. Non-blocking: false
// when the supervisor is gone or does not read (its pipe full); the caller goes on either way.
// The process must ignore SIGPIPE (the agent does), or a write to a supervisor that has exited
// kills it.
// A `fence` SIGTERM is marked for the job's leader as a fence's (contract/stop_signal.h): the
// attempt may already run elsewhere, so the job ends at once instead of checkpointing.
bool SendRenewal(int control_fd, absl::Duration deadline);
bool SendSignal(int control_fd, int signal, bool fence = false);

// Blocks until the supervisor has exited (reading the status pipe to its end, then reaping it),
// closes status_fd and returns the job's exit. If the supervisor died without reporting, the
// job's group gets SIGKILL. Call once, from one thread.
SupervisedExit AwaitExit(SupervisedChild* child);

// The wire messages (24 bytes each, under PIPE_BUF, so each write is atomic). Exposed for
// launch.cc, which writes kStarted from the forked supervisor before it executes.
struct SupervisorMessage {
  int64_t kind = 0;
  int64_t value = 0;
  int64_t detail = 0;
};
inline constexpr int64_t kRenewMessage = 1;    // value: deadline, ns on CLOCK_MONOTONIC
inline constexpr int64_t kSignalMessage = 2;   // value: the signal for the job's group;
                                               // detail: 1 for a fence's (SendSignal)
inline constexpr int64_t kStartedMessage = 3;  // value: the job's pid, or -errno of its fork
inline constexpr int64_t kExitedMessage = 4;   // value: wait status; detail: FenceCause

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_SUPERVISOR_H_
