#include "worker/daemon/runner_outcome.h"

#include <sys/wait.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "worker/daemon/work_files.h"

namespace substrax {

v1::ReportAttemptStatusRequest RunnerOutcome(const RunnerExit& exit, std::string* warning) {
  v1::ReportAttemptStatusRequest report;
  bool have_result = false;
  {
    std::ifstream result(exit.result_path, std::ios::binary);
    have_result = result && report.ParseFromIstream(&result);
    if (!have_result) report.Clear();
  }
  const int status = exit.wait_status;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  report.set_exit_code(code);
  if (code == 0) {
    // Exit status 0 is success whatever the file says (see the header): a result that cannot
    // be read costs the final metrics, never the run.
    if (!have_result || report.state() != v1::RUNNER_STATE_SUCCEEDED) {
      *warning = absl::StrCat("runner exited 0 but its result ", exit.result_path,
                              " is missing or unreadable; reporting success without final "
                              "metrics (the runner's log says why it was not written)");
      report.clear_final_metrics();
      report.clear_error();
      report.clear_error_code();
    }
    report.set_state(v1::RUNNER_STATE_SUCCEEDED);
    return report;
  }
  report.set_state(v1::RUNNER_STATE_FAILED);
  if (report.error().empty()) {
    report.set_error(WIFSIGNALED(status)
                         ? absl::StrCat("the runner was killed by signal ", WTERMSIG(status),
                                        exit.stop_requested ? " (stopped: " + exit.stop_reason + ")"
                                                            : "")
                         : absl::StrCat("the runner exited with status ", code));
  }
  absl::StatusOr<std::string> tail = TailOfFile(exit.log_path, kStderrTailBytes);
  report.set_stderr_tail(tail.ok() ? *tail : absl::StrCat("(no log: ", tail.status().message(), ")"));
  return report;
}

}  // namespace substrax
