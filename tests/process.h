// Real processes for integration tests: start a binary with arguments, capture its output to a
// file, signal it, and wait for it with a deadline (never forever).
#ifndef SUBSTRAX_TESTS_PROCESS_H_
#define SUBSTRAX_TESTS_PROCESS_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace substrax::testing {

// A path inside the test's runfiles tree ("coordinator/substrax-coordinator"): relative to the
// working directory (bazel test and bazel run start there), else in <this binary>.runfiles.
std::string Runfile(const std::string& path);
// A fresh directory under TEST_TMPDIR.
std::string TempDir(const std::string& name);

// True under CI=true: a test that cannot run for want of something (a venv, root, a mount) fails
// there, and skips itself elsewhere:
//   if (InCi()) FAIL() << why;
//   GTEST_SKIP() << why;
bool InCi();
// A file's whole contents ("" when it cannot be read).
std::string ReadFile(const std::string& path);

// The flags that run a coordinator or worker daemon plaintext and unauthenticated, for tests of
// something other than credentials (faults, load, a fake coordinator); tests/security and
// tests/e2e_test run mutual TLS (tests/credentials.h).
std::vector<std::string> InsecureFlags();

class Process {
 public:
  // Starts argv[0] with argv; stdout and stderr go to `log_path`. Extra environment: `env`
  // ("NAME=value").
  Process(std::vector<std::string> argv, std::string log_path,
          std::vector<std::string> env = {});
  ~Process();  // SIGKILLs the process if it is still running

  pid_t pid() const { return pid_; }
  void Signal(int signal);
  // The exit status (0-255, or 128 + signal) once it has ended, or nothing at the deadline.
  std::optional<int> Wait(absl::Duration timeout);
  bool Running();
  std::string Log() const;

 private:
  pid_t pid_ = -1;
  std::string log_path_;
  std::optional<int> status_;
};

struct CommandResult {
  int exit_code = -1;  // -1: did not finish in time (then killed)
  std::string out;
  std::string err;
};

// Runs a command to completion (killing it at the timeout).
CommandResult Run(const std::vector<std::string>& argv, absl::Duration timeout,
                  const std::vector<std::string>& env = {});

// Polls `condition` every 50 ms until it holds or `timeout` passes; true if it held.
template <typename F>
bool PollUntil(F condition, absl::Duration timeout);

}  // namespace substrax::testing

#include "absl/time/clock.h"

namespace substrax::testing {
template <typename F>
bool PollUntil(F condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    if (condition()) return true;
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));  // polling with a deadline
  }
}
}  // namespace substrax::testing

#endif  // SUBSTRAX_TESTS_PROCESS_H_
