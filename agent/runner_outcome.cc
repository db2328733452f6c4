#include "agent/runner_outcome.h"

#include <sys/wait.h>
#include <unistd.h>


#include "absl/strings/str_cat.h"
#include "agent/work_files.h"
#include "contract/launch.h"

namespace substrax {

namespace {

// "exit status 3", "killed by signal 9".
std::string HowItEnded(int status) {
  return WIFSIGNALED(status) ? absl::StrCat("killed by signal ", WTERMSIG(status))
                             : absl::StrCat("exit status ", WEXITSTATUS(status));
}

void AddLogTail(const RunnerExit& exit, v1::ReportAttemptStatusRequest* report) {
  absl::StatusOr<std::string> tail = TailOfFile(exit.log_path, kStderrTailBytes);
  report->set_stderr_tail(tail.ok() ? *tail
                                    : absl::StrCat("(no log: ", tail.status().message(), ")"));
}

}  // namespace

v1::ReportAttemptStatusRequest RunnerOutcome(const RunnerExit& exit, std::string* warning) {
  v1::ReportAttemptStatusRequest report;
  absl::StatusOr<v1::ReportAttemptStatusRequest> result = ReadAttemptResult(exit.result_path);
  const bool have_result = result.ok();
  if (have_result) report = *std::move(result);
  const int status = exit.wait_status;
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  report.set_exit_code(code);
  const bool program = !exit.program.empty();
  if (program && exit.init_timed_out) {
    report.Clear();
    report.set_exit_code(code);
    report.set_state(v1::RUNNER_STATE_FAILED);
    report.set_error(absl::StrCat("the program ", exit.program,
                                  " did not call substrax::Init within ",
                                  absl::FormatDuration(exit.init_timeout),
                                  " (--program-init-timeout): stalled"));
    AddLogTail(exit, &report);
    return report;
  }
  // A program that never joined its job (no started file, no result), however it exited: most
  // often a program that does not use the SDK, or one that failed before substrax::Init.
  if (program && !have_result && !exit.stop_requested &&
      access(exit.started_path.c_str(), F_OK) != 0) {
    report.set_state(v1::RUNNER_STATE_FAILED);
    report.set_error(absl::StrCat("the program ", exit.program, " exited (", HowItEnded(status),
                                  ") without calling substrax::Init; programs must join their "
                                  "job first: substrax::Init (docs/sdk.md), or create the "
                                  "launch's started_path (docs/launch.md)"));
    AddLogTail(exit, &report);
    return report;
  }
  if (code == 0) {
    // Exit status 0 is success whatever the file says (see the header): a result that cannot
    // be read costs the final metrics, never the run.
    if (!have_result || report.state() != v1::RUNNER_STATE_SUCCEEDED) {
      if (warning != nullptr) {
        *warning = absl::StrCat("runner exited 0 but its result ", exit.result_path,
                                " is missing or unreadable; reporting success without final "
                                "metrics (the runner's log says why it was not written)");
      }
      report.clear_final_metrics();
      report.clear_error();
      report.clear_error_code();
    }
    report.set_state(v1::RUNNER_STATE_SUCCEEDED);
    return report;
  }
  report.set_state(v1::RUNNER_STATE_FAILED);
  if (exit.command && have_result && !report.error().empty()) return report;
  if (report.error().empty()) {
    const std::string who = program ? absl::StrCat("the program ", exit.program) : "the runner";
    report.set_error(WIFSIGNALED(status)
                         ? absl::StrCat(who, " was killed by signal ", WTERMSIG(status),
                                        exit.stop_requested ? " (stopped: " + exit.stop_reason + ")"
                                                            : "")
                         : absl::StrCat(who, " exited with status ", code));
  }
  AddLogTail(exit, &report);
  return report;
}

}  // namespace substrax
