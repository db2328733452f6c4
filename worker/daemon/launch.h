// How the worker daemon starts the process of one job attempt: the built-in trainer
// (`substrax-worker run ...`) or, for a program job (spec.program), the user's program.
//
// For every attempt the daemon writes, in its work dir, under the base name
// `<job>-attempt-<a>-process-<p>`:
//   .assignment  the v1::Assignment (the built-in runner reads it: --assignment)
//   .launch      a v1::ProgramLaunch (proto/substrax/v1/program.proto) naming everything the
//                process needs to join the attempt; its path is in the child's environment as
//                SUBSTRAX_LAUNCH, which substrax::Init (the SDK, docs/sdk.md) reads
// and removes a stale `.result` and `.started`. The child writes `.result` (a serialized
// ReportAttemptStatusRequest) when it ends; a program's substrax::Init creates `.started` once
// it has joined its job, which tells a program that never called Init from one that failed
// after it (runner_outcome.h) and ends the init timeout.
//
// Everything the child needs (argv, envp, the binary) is prepared before fork; after fork the
// child makes only async-signal-safe calls.
#ifndef SUBSTRAX_WORKER_DAEMON_LAUNCH_H_
#define SUBSTRAX_WORKER_DAEMON_LAUNCH_H_

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/transport.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/program.pb.h"
#include "worker/sdk/launch_env.h"

namespace substrax {

// The work-dir files of one attempt's process.
struct AttemptFiles {
  std::string assignment;  // <base>.assignment
  std::string launch;      // <base>.launch
  std::string result;      // <base>.result
  std::string started;     // <base>.started
  std::string log;         // <base>.log (the child's stdout and stderr)
};

// The files of `assignment`'s process in `work_dir` (the job id must be a checked DNS label).
AttemptFiles FilesOfAttempt(const std::string& work_dir, const v1::Assignment& assignment);

// What every launch of this daemon shares: the daemon's own settings.
struct LaunchSettings {
  // This worker and its host, for messages.
  std::string worker_id;
  std::string host;
  // host:port of the coordinator and how to reach it (the daemon's transport).
  std::string coordinator;
  TransportOptions transport;
  // Address peers reach this host's processes on.
  std::string listen_host;
  // Every collective must finish within this time.
  absl::Duration collective_timeout = absl::Seconds(30);
  // The daemon's --data-root, --checkpoint-root and --programs-dir directories (normalized).
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
  std::vector<std::string> programs_dirs;
  // The binary started as `<runner_binary> run ...` for built-in jobs.
  std::string runner_binary;
};

// The launch file's contents for `assignment` (sdk_version_major: SUBSTRAX_VERSION_MAJOR).
v1::ProgramLaunch MakeProgramLaunch(const LaunchSettings& settings,
                                    const v1::Assignment& assignment, const AttemptFiles& files);

// Writes the assignment and launch files (atomically) and removes a stale result and started
// file. Errors: the path and the system's reason ("cannot write ...: No space left on device").
absl::Status WriteAttemptFiles(const LaunchSettings& settings, const v1::Assignment& assignment,
                               const AttemptFiles& files);

// Checks on this host that `path` (a program job's spec.program.path) may run: it lies under one
// of `settings.programs_dirs` and so does its real path (symlinks resolved, the directories'
// too), it exists, is a regular file and the daemon may execute it. Returns the real path.
// Errors: FAILED_PRECONDITION naming the program, the host and worker, the reason and the
// programs dirs ("program /opt/p/train not found on host h1 (worker w1): No such file or
// directory; programs run from --programs-dir /opt/p").
absl::StatusOr<std::string> CheckProgram(const LaunchSettings& settings, const std::string& path);

// A process to start: the file to execute, its argv and its whole environment.
struct ChildCommand {
  std::string binary;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "NAME=value"
};

// `environment` (as `environ`: "NAME=value" strings, null-terminated) with `additions` set,
// replacing variables of the same name; additions last, in order.
std::vector<std::string> ChildEnvironment(
    char* const* environment, const std::vector<std::pair<std::string, std::string>>& additions);

// The command of `assignment`'s process: `substrax-worker run` with its flags, or the program
// (CheckProgram first: its errors), with the daemon's environment plus, for a program,
// spec.program.env, and SUBSTRAX_LAUNCH=<files.launch> for both.
absl::StatusOr<ChildCommand> BuildCommand(const LaunchSettings& settings,
                                          const v1::Assignment& assignment,
                                          const AttemptFiles& files);

// Forks and executes `command` with stdout and stderr on `log_fd`, in a process group of its
// own, killed when the daemon dies (PR_SET_PDEATHSIG), with an empty signal mask and SIGPIPE's
// default action. Returns its pid. Errors: fork's (UNAVAILABLE). An exec that fails makes the
// child exit 127.
absl::StatusOr<pid_t> StartChild(const ChildCommand& command, int log_fd);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DAEMON_LAUNCH_H_
