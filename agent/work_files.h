// The files of the worker daemon's work dir: how they are written, read and deleted.
//
// Every attempt's process has `<job>-attempt-<a>-process-<p>.launch` (written by the agent, read
// by the process: contract/launch.h), `.log` (the process's stdout and stderr), `.result`
// (written by the process, read by the agent) and, once the process joined its job, `.started`;
// with a job user (--job-user) the launch, result and started files lie instead in the job
// user's directory `<job>-attempt-<a>-process-<p>.job` (agent/launch.h), deleted as a whole.
// Writes are atomic (base/files.h: a temporary `<path>.tmp.XXXXXX` renamed into place when
// complete and synced), so a reader never sees half a file. Old attempts' files are deleted by
// CleanWorkDir (the agent runs it at start, every minute and after each process ends).
#ifndef SUBSTRAX_AGENT_WORK_FILES_H_
#define SUBSTRAX_AGENT_WORK_FILES_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace substrax {

// The last `max_bytes` of the file at `path`, reading only those (a log may be gigabytes), with
// "..." in front when the file is longer. Errors name the path and the errno text.
absl::StatusOr<std::string> TailOfFile(const std::string& path, size_t max_bytes);

// The default --work-dir: `$XDG_RUNTIME_DIR/substrax-agent` when XDG_RUNTIME_DIR is set (a
// directory of the user's own, 0700), else `/var/lib/substrax-agent` for root, else
// `/tmp/substrax-agent-<uid>`. PrepareWorkDir checks whichever it is.
std::string DefaultWorkDir();

// Makes `dir` safe to hold the files of job attempts (launch files name the attempt's secret,
// result files decide its outcome): creates it 0700 when missing (missing parents as the umask
// says), or checks the one there: opened without following a symbolic link (O_NOFOLLOW), it
// must be a directory owned by this process's user or by root (an administrator's choice, e.g.
// a Kubernetes emptyDir); one of the agent's own that others may access is made 0700. Errors:
// FAILED_PRECONDITION (a symbolic link, not a directory, owned by another user: the path, what
// is wrong and what to do), UNAVAILABLE (cannot be created or opened: the path and errno text).
absl::Status PrepareWorkDir(const std::string& dir);

// "<job>-attempt-<a>": the prefix of every work-dir file of that attempt.
std::string AttemptFilePrefix(absl::string_view job_id, int attempt);

struct LogRetention {
  // Files of ended attempts whose newest file is older than this are deleted; zero: no age limit.
  absl::Duration max_age = absl::Hours(7 * 24);
  // Then, oldest attempt first, until all attempt files together take at most this many bytes;
  // zero: no size limit. Files of running attempts count but are never deleted.
  int64_t max_bytes = int64_t{1} << 30;
};

struct CleanupResult {
  int attempts_deleted = 0;
  int64_t bytes_deleted = 0;
  // What the attempt files left take (running attempts included).
  int64_t bytes_kept = 0;
  // Files that could not be deleted or examined ("<path>: <errno text>").
  std::vector<std::string> errors;
};

// Deletes the files of ended attempts in `dir` as `retention` says. `running` holds the
// AttemptFilePrefix of every attempt with a runner: their files stay, however old or large.
// Only files named like attempt files are looked at. Errors: the directory cannot be listed.
absl::StatusOr<CleanupResult> CleanWorkDir(const std::string& dir, const LogRetention& retention,
                                           const std::set<std::string>& running, absl::Time now);

// "7d", "36h", "90m", "0" (no limit): the --log-retention flag. Errors: INVALID_ARGUMENT.
absl::StatusOr<absl::Duration> ParseRetention(absl::string_view text);
// "1GiB", "512MiB", "64KiB", "1048576", "0" (no limit): the --log-budget flag. Errors:
// INVALID_ARGUMENT.
absl::StatusOr<int64_t> ParseByteSize(absl::string_view text);

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_WORK_FILES_H_
