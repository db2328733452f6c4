// What the tests that start real processes see of them in /proc: command lines, states, the
// launch file of a job process (its SUBSTRAX_LAUNCH, the launch contract's handle whatever the
// process runs), and the processes that name a test's directory, so that a test can check that
// none outlived it.
#ifndef SUBSTRAX_TESTS_PROC_H_
#define SUBSTRAX_TESTS_PROC_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace substrax::testing {

// The command line of `pid` with NULs as spaces ("" when it is gone).
std::string CommandLine(pid_t pid);
// Its state letter (R, S, T, Z, ...; '?' when it is gone).
char ProcessState(pid_t pid);
// Its process group (0 when it is gone).
pid_t ProcessGroup(pid_t pid);
// The launch file a job process was started with (its SUBSTRAX_LAUNCH), or "".
std::string LaunchFileOf(pid_t pid);
// Every process but this one.
std::vector<pid_t> AllPids();

// A job process seen in /proc: its pid and the launch file it was started with (its
// SUBSTRAX_LAUNCH: "<work-dir>/<job>-attempt-<a>-process-<p>.launch"), whatever it runs (the
// built-in trainer, an SDK program, any executable).
struct RunnerProcess {
  pid_t pid = 0;
  std::string launch;
  bool stopped = false;  // state T (SIGSTOP)
};

// Every live process whose command line or launch file (SUBSTRAX_LAUNCH) mentions `dir`.
std::vector<pid_t> ProcessesMentioning(const std::string& dir);
// The job processes whose launch file lies under `dir`, alive now (not their own children).
std::vector<RunnerProcess> RunnersUnder(const std::string& dir);

}  // namespace substrax::testing

#endif  // SUBSTRAX_TESTS_PROC_H_
