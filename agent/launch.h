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
#include <optional>
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
  // With a job user (--job-user): <base>.job, a directory of the job user's, 0700, holding the
  // files the process reads or writes; the agent's work dir stays closed to it. Empty
  // otherwise.
  std::string job_dir;
  std::string launch;      // <base>.launch, or <base>.job/launch
  std::string result;      // <base>.result, or <base>.job/result
  std::string started;     // <base>.started, or <base>.job/started
  std::string activity;    // <base>.activity, or <base>.job/activity (contract/activity.h)
  std::string log;         // <base>.log (the child's stdout and stderr; the agent opens it)
};

// The files of `assignment`'s process in `work_dir` (the job id must be a checked DNS label),
// in a directory of their own when `own_dir` (a job user).
AttemptFiles FilesOfAttempt(const std::string& work_dir, const v1::Assignment& assignment,
                            bool own_dir = false);

// Whom job processes run as (--job-user): resolved once, before any fork.
struct JobUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;
  // Its supplementary groups (getgrouplist), its primary group among them.
  std::vector<gid_t> groups;
  // Its home directory (the passwd entry): the job's HOME.
  std::string home;
};

// The user `name` (getpwnam, getgrouplist). Errors: INVALID_ARGUMENT (no such user, or root,
// which would run jobs with every privilege), FAILED_PRECONDITION (this process cannot switch
// users, chown or open the job user's files, or signal its processes: it is not root and lacks
// one of CAP_SETUID, CAP_SETGID, CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_KILL, named in the message).
absl::StatusOr<JobUser> ResolveJobUser(const std::string& name);

// The user this process runs as, for a job run without --job-user (its name and HOME).
JobUser CurrentUser();

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
  // Whom job processes run as; `switch_user`: the agent switches to it (--job-user), otherwise
  // it is the agent's own user (only its name and home are used).
  JobUser job_user;
  bool switch_user = false;
  // Variables of the agent's own environment handed to every job process (--job-env-pass).
  std::vector<std::string> job_env_pass;
  // Command jobs (command_launch.h): the Python environments by name, whether this agent runs
  // command jobs as its own user, the rendezvous port range (0, 0: any), the stop grace, and
  // the agent's own CUDA_VISIBLE_DEVICES entries (empty: every GPU).
  std::map<std::string, std::string> python_envs;
  bool allow_command_jobs = false;
  int command_port_first = 0;
  int command_port_last = 0;
  absl::Duration stop_grace = absl::Seconds(10);
  std::vector<std::string> agent_cuda_visible_devices;
};

// The launch file's contents for `assignment` (sdk_version_major: SUBSTRAX_VERSION_MAJOR).
v1::ProgramLaunch MakeProgramLaunch(const LaunchSettings& settings,
                                    const v1::Assignment& assignment, const AttemptFiles& files);

// Writes the launch file (atomically, 0600; for a command job with `command` as its command
// part) and removes a stale result and started file; with a job dir (files.job_dir), makes it
// afresh (0700) and gives it and the launch file to the job user. Errors: the path and the system's reason ("cannot write ...: No space left on
// device").
absl::Status WriteAttemptFiles(const LaunchSettings& settings, const v1::Assignment& assignment,
                               const AttemptFiles& files,
                               const v1::CommandLaunch* command = nullptr);

// Checks on this host that `path` (a program job's spec.program.path) may run: it lies under one
// of `settings.programs_dirs` and so does its real path (symlinks resolved, the directories'
// too), it exists, is a regular file and the daemon may execute it. Returns the real path.
// Errors: FAILED_PRECONDITION naming the program, the host and worker, the reason and the
// programs dirs ("program /opt/p/train not found on host h1 (worker w1): No such file or
// directory; programs run from --programs-dir /opt/p").
absl::StatusOr<std::string> CheckProgram(const LaunchSettings& settings, const std::string& path);

// The credentials a child takes right before exec (ApplyChildCredentials).
struct ChildCredentials {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;
  std::string user;  // for the message when the switch fails
  // Where the process starts (its attempt's directory): the agent's own working directory may
  // be closed to the job user.
  std::string working_dir;
};

// A process to start: the file to execute, its argv, its whole environment and, with a job
// user, whom it runs as.
struct ChildCommand {
  std::string binary;
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "NAME=value"
  std::optional<ChildCredentials> credentials;
};

// The fixed environment every job process starts from, whatever the agent's own:
// PATH=/usr/local/bin:/usr/bin:/bin, HOME=<user's home, or "/">, USER and LOGNAME=<user> (when
// it has a name), LANG=C.UTF-8.
std::vector<std::pair<std::string, std::string>> BaseJobEnvironment(const JobUser& user);

// A job process's environment: `base`, then each variable named in `pass` that `environment`
// (the agent's own, as `environ`: "NAME=value" strings, null-terminated) has, then `additions`.
// A later value of a name replaces an earlier one, in the place of the first. Nothing else of
// `environment` is taken.
std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& base, char* const* environment,
    const std::vector<std::string>& pass,
    const std::vector<std::pair<std::string, std::string>>& additions);

// The command of `assignment`'s process: `<job_binary> run`, `<job_binary> command` for a
// command job (its launcher, which starts the command itself: refused FAILED_PRECONDITION on an
// agent that runs no command jobs, command_launch.h), or the program (CheckProgram
// first: its errors), with BaseJobEnvironment, the variables of settings.job_env_pass, for a
// program spec.program.env, and SUBSTRAX_LAUNCH=<files.launch> last: one launch path for every
// kind of process; with settings.switch_user, run as the job user. The spec's variables are
// checked again here (the assignment may come from anything that reached the agent): errors:
// FAILED_PRECONDITION naming spec.program.env.NAME, why (core/job_env.h), the job, host and
// worker.
absl::StatusOr<ChildCommand> BuildCommand(const LaunchSettings& settings,
                                          const v1::Assignment& assignment,
                                          const AttemptFiles& files);

// In a forked child, right before exec: takes `credentials` (setgroups, setgid, setuid, then
// chdir to its working_dir when set: all async-signal-safe). The name of the call that failed, errno set (the child must not exec
// then); null when all succeeded.
const char* ApplyChildCredentials(const ChildCredentials& credentials);

// Forks and executes `command` with stdout and stderr on `log_fd`, in a process group of its
// own, killed when the forking thread ends (PR_SET_PDEATHSIG), with an empty signal mask and
// SIGPIPE's default action, as command.credentials' user when set. Returns its pid. Errors:
// fork's (UNAVAILABLE). An exec or a user switch that fails makes the child exit 127 (a switch
// says why in the log). The agent starts job processes with StartSupervised; this is the same
// start without a supervisor (tests, tools).
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
