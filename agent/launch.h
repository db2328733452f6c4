// How the agent starts the process of one job attempt: the built-in trainer (`substrax-job
// run`) or, for a program job (spec.program), the user's program. Both get their part of the
// attempt the same way, through the launch contract (contract/launch.h): a launch file named by
// SUBSTRAX_LAUNCH.
//
// For every attempt the agent writes, in its work dir, under the base name
// `<job>-attempt-<a>-process-<p>`:
//   .launch      the v1::ProgramLaunch (JSON, 0600) naming everything the process needs to join
//                the attempt
// and removes a stale `.result` and `.started`. The child writes `.result` (a serialized
// ReportAttemptStatusRequest) when it ends, and creates `.started` once it has joined its job
// (the SDK's substrax::Init does both), which tells a program that never joined from one that
// failed after it (runner_outcome.h) and ends the init timeout.
//
// Everything the child needs (argv, envp, the binary) is prepared before fork; after fork the
// child makes only async-signal-safe calls. The job process is started by ForkJob (launch.cc),
// the one place where it is executed, under a supervisor (supervisor.h) that fences it.
#ifndef SUBSTRAX_AGENT_LAUNCH_H_
#define SUBSTRAX_AGENT_LAUNCH_H_

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
#include "contract/launch.h"
#include "agent/supervisor.h"

namespace substrax {

// The work-dir files of one attempt's process.
struct AttemptFiles {
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
  // The job binary, started as `<job_binary> run` for built-in jobs.
  std::string job_binary;
};

// The launch file's contents for `assignment` (sdk_version_major: SUBSTRAX_VERSION_MAJOR).
v1::ProgramLaunch MakeProgramLaunch(const LaunchSettings& settings,
                                    const v1::Assignment& assignment, const AttemptFiles& files);

// Writes the launch file (atomically, 0600) and removes a stale result and started file. Errors: the path and the system's reason ("cannot write ...: No space left on device").
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

// The command of `assignment`'s process: `<job_binary> run`, or the program (CheckProgram
// first: its errors), with the agent's environment plus, for a program, spec.program.env, and
// SUBSTRAX_LAUNCH=<files.launch> for both: one launch path for every kind of process.
absl::StatusOr<ChildCommand> BuildCommand(const LaunchSettings& settings,
                                          const v1::Assignment& assignment,
                                          const AttemptFiles& files);

// Forks and executes `command` with stdout and stderr on `log_fd`, in a process group of its
// own, killed when the forking thread ends (PR_SET_PDEATHSIG), with an empty signal mask and
// SIGPIPE's default action. Returns its pid. Errors: fork's (UNAVAILABLE). An exec that fails
// makes the child exit 127. The agent starts job processes with StartSupervised; this is the
// same start without a supervisor (tests, tools).
absl::StatusOr<pid_t> StartChild(const ChildCommand& command, int log_fd);

// How StartSupervised supervises the job process (supervisor.h).
struct Supervision {
  // The binary whose `supervise` mode is the supervisor: the agent's own.
  std::string binary = "/proc/self/exe";
  // The lease's first deadline, on the monotonic clock (std::chrono::steady_clock's count).
  absl::Duration deadline;
  // SIGTERM, then SIGKILL this much later, when the supervisor fences the job.
  absl::Duration grace = absl::Seconds(10);
  // Shown in the supervisor's command line and log lines (the launch file's path).
  std::string label;
};

// Starts `command` as StartChild does, but as the child of a supervisor (supervisor.h) that
// holds its lease: forks the supervisor, which forks the job process and then executes
// `supervision.binary supervise ...`. Returns once the job process is forked. Errors: fork's
// or pipe's (UNAVAILABLE). An exec of the job that fails makes it exit 127; one of the
// supervisor that fails kills the job, and the supervisor exits 127.
absl::StatusOr<SupervisedChild> StartSupervised(const ChildCommand& command, int log_fd,
                                                const Supervision& supervision);

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_LAUNCH_H_
