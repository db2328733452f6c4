// RunnerOutcome: what the worker daemon reports for a runner that exited.
//
// The runner writes its outcome to a result file; the daemon adds the exit status and, for a
// failure, the tail of the runner's log. A result file that is missing or unreadable (the runner
// crashed, or the disk was full when it wrote) never turns a successful run into a failure:
// `substrax-worker run` exits 0 only when training succeeded (every error path, and a stop by
// the coordinator, exits non-zero or by a signal), so exit status 0 is reported as SUCCEEDED,
// without final metrics when the file cannot be read, and the reason is returned to be logged.
#ifndef SUBSTRAX_WORKER_DAEMON_RUNNER_OUTCOME_H_
#define SUBSTRAX_WORKER_DAEMON_RUNNER_OUTCOME_H_

#include <string>

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
};

// The state, exit code, error and stderr tail of the report (the caller adds job, attempt,
// worker and process). `warning`: set when the outcome was decided without the result file.
v1::ReportAttemptStatusRequest RunnerOutcome(const RunnerExit& exit, std::string* warning);

// How much of the runner's log goes back with a failure.
inline constexpr size_t kStderrTailBytes = 2000;

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DAEMON_RUNNER_OUTCOME_H_
