// RunnerOutcome: what the worker daemon reports for a runner that exited.
//
// The runner writes its outcome to a result file; the daemon adds the exit status and, for a
// failure, the tail of the runner's log. A result file that is missing or unreadable (the runner
// crashed, or the disk was full when it wrote) never turns a successful run into a failure:
// `substrax-job run` exits 0 only when training succeeded (every error path, and a stop by
// the coordinator, exits non-zero or by a signal), so exit status 0 is reported as SUCCEEDED,
// without final metrics when the file cannot be read, and the reason is returned to be logged.
//
// A user's program (spec.program) is judged by the same rules once it has called
// substrax::Init (its started file exists, launch.h); before that, however it exits, the attempt
// fails saying that the program never called substrax::Init, and one that the daemon stopped at
// its init timeout fails as stalled.
#ifndef SUBSTRAX_AGENT_RUNNER_OUTCOME_H_
#define SUBSTRAX_AGENT_RUNNER_OUTCOME_H_

#include <string>

#include "absl/time/time.h"
#include "substrax/v1/coordinator_service.pb.h"

namespace substrax {

struct RunnerExit {
  // As waitpid returns it.
  int wait_status = 0;
  // The daemon stopped the runner, and why.
  bool stop_requested = false;
  std::string stop_reason;
  std::string result_path;
  std::string log_path;
  // A program job's program (spec.program.path); empty for the built-in runner.
  std::string program;
  // The file the program's substrax::Init creates (launch.h).
  std::string started_path;
  // The daemon stopped the program because it had not called substrax::Init within
  // `init_timeout` (--program-init-timeout).
  bool init_timed_out = false;
  absl::Duration init_timeout;
  // A command job's launcher (`substrax-job command`): its result's error already ends with the
  // failed process's own last lines, so the tail of the whole log (every process's lines and
  // the launcher's) is added only when it wrote none.
  bool command = false;
};

// The state, exit code, error and stderr tail of the report (the caller adds job, attempt,
// worker and process). `warning` (may be null): set when the outcome was decided without the
// result file.
v1::ReportAttemptStatusRequest RunnerOutcome(const RunnerExit& exit, std::string* warning);

// How much of the runner's log goes back with a failure.
inline constexpr size_t kStderrTailBytes = 2000;

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_RUNNER_OUTCOME_H_
