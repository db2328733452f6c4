// substraxctl local: the processes of an embedded cluster on this machine and the state
// directory that records them. No RPC here (the health probe lives with the commands).
//
// State directory layout:
//   pids                 one line per process: NAME PID EXECUTABLE (see FormatPidFile)
//   address              the coordinator's "host:port", written by the coordinator once serving
//   logs/NAME.log        stdout and stderr of each process
//   coordinator/         the coordinator's --state-dir
//   workers/NAME/        each worker daemon's --work-dir
//
// Functions are thread-compatible; SpawnDaemon forks and must not race with another fork that
// expects to own the children.
#ifndef SUBSTRAX_CLIENT_LOCAL_CLUSTER_H_
#define SUBSTRAX_CLIENT_LOCAL_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace substrax::ctl {

// One process of a local cluster.
struct LocalProcess {
  // "coordinator" or the worker id ("local-0").
  std::string name;
  pid_t pid = 0;
  // The absolute path it was started from; guards against pid reuse (a pid whose
  // /proc/PID/exe is another program is not ours).
  std::string executable;

  friend bool operator==(const LocalProcess& a, const LocalProcess& b) {
    return a.name == b.name && a.pid == b.pid && a.executable == b.executable;
  }
};

std::string PidFilePath(absl::string_view state_dir);
std::string AddressFilePath(absl::string_view state_dir);
std::string LogPath(absl::string_view state_dir, absl::string_view name);

// "# comment\nNAME PID EXECUTABLE\n..." and back. Parse errors: INVALID_ARGUMENT naming the
// line. Blank lines and lines starting with '#' are skipped.
std::string FormatPidFile(const std::vector<LocalProcess>& processes);
absl::StatusOr<std::vector<LocalProcess>> ParsePidFile(absl::string_view text,
                                                       absl::string_view source);
// Errors: NOT_FOUND when there is no pid file (no cluster was started there), else as
// ParsePidFile.
absl::StatusOr<std::vector<LocalProcess>> ReadPidFile(absl::string_view state_dir);
// Written to a temporary file and renamed, so a reader never sees half a file.
absl::Status WritePidFile(absl::string_view state_dir, const std::vector<LocalProcess>& processes);
// Removes the pid file and the address file (missing files are fine).
void RemoveClusterFiles(absl::string_view state_dir);

// Whether the process runs: it exists, is not a zombie (our own exited children are reaped
// here), and, when `executable` is recorded, /proc/PID/exe is that file (also when it was
// replaced by a rebuild since: "(deleted)").
bool IsAlive(const LocalProcess& process);

// Starts `argv` (argv[0] an absolute path) in a new session (setsid), stdin from /dev/null,
// stdout and stderr appended to `log_path`. Returns once the exec has happened. Errors:
// FAILED_PRECONDITION (the log cannot be opened), INTERNAL (fork failed), and the errno of a
// failed exec (e.g. PERMISSION_DENIED, NOT_FOUND) naming the program.
absl::StatusOr<pid_t> SpawnDaemon(const std::vector<std::string>& argv,
                                  const std::string& log_path);

// Sends SIGTERM to each live process (and its process group: the runners it started), waits up
// to `grace` for all to exit, then SIGKILLs what is left. Returns the names that needed SIGKILL.
std::vector<std::string> StopProcesses(const std::vector<LocalProcess>& processes,
                                       absl::Duration grace);

// Where the binary `name` is, as an absolute path: `override_path` when given (it must be an
// executable file), else the first executable of `candidates`. Errors: NOT_FOUND naming every
// place looked at and, as the fix, `build_hint` (e.g. "bazel build
// //coordinator:substrax-coordinator") and `flag`.
absl::StatusOr<std::string> FindBinary(absl::string_view name, absl::string_view override_path,
                                       const std::vector<std::string>& candidates,
                                       absl::string_view build_hint, absl::string_view flag);
// Where to look for a sibling binary of substraxctl: next to it (an install), then in the Bazel
// layout (bazel-bin/client/substraxctl -> bazel-bin/<package>/<name>).
std::vector<std::string> SiblingCandidates(absl::string_view self_dir, absl::string_view package,
                                           absl::string_view name);
// The directory of this executable (/proc/self/exe); "" when unknown.
std::string SelfDirectory();

// The last `max_lines` lines of a file ("" when it cannot be read), for error messages.
std::string TailFile(const std::string& path, int max_lines);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_LOCAL_CLUSTER_H_
