// What the agent does for a command job (spec.command, docs/command-jobs.md) before its
// launcher starts: whether this agent runs command jobs at all, which file argv[0] runs as on
// this host, and the launch's command part (v1::CommandLaunch) that the launcher (`substrax-job
// command`, worker/command_launcher.h) reads. The launcher, a job process like the built-in
// trainer, does the rest: the rendezvous, the contract's environment, the command's processes,
// the report file.
#ifndef SUBSTRAX_AGENT_COMMAND_LAUNCH_H_
#define SUBSTRAX_AGENT_COMMAND_LAUNCH_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/launch.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/program.pb.h"

namespace substrax {

// Whether an agent with `settings` runs command jobs: as a user of their own (--job-user), or
// as its own user when its operator allowed it (--allow-command-jobs).
bool RunsCommands(const LaunchSettings& settings);

// OK when the agent runs command jobs; otherwise FAILED_PRECONDITION naming the job, the host
// and worker, and the two flags that would allow it.
absl::Status CheckRunsCommands(const LaunchSettings& settings, const v1::Assignment& assignment);

// Checks a --python-env value, "NAME=DIR": NAME plain ([A-Za-z0-9_.-], at most 64 bytes), DIR
// absolute with a bin/ directory. Returns {NAME, DIR normalized}. Errors: INVALID_ARGUMENT
// saying what to fix.
absl::StatusOr<std::pair<std::string, std::string>> ParsePythonEnv(absl::string_view flag);

// The file a command's argv[0] runs as on this host. With python_env: DIR/bin/argv[0] of the
// environment registered under that name (the environment's own symbolic links followed, a
// venv's bin/python is one), which must be an executable regular file. Without: argv[0] itself,
// checked as a program's path is (CheckProgram: under --programs-dir, symlinks resolved).
// Errors: FAILED_PRECONDITION naming the field, the host and worker, and what this agent has.
absl::StatusOr<std::string> ResolveCommandExecutable(const LaunchSettings& settings,
                                                     const v1::CommandSpec& command);

// The launch's command part for `assignment`'s process: the executable resolved, the working
// dir (spec.command.working_dir, or the attempt's own directory files.job_dir), the attempt dir,
// the agent's port range, CUDA devices and stop grace. Errors: ResolveCommandExecutable's,
// CheckRunsCommands', FAILED_PRECONDITION for a process without its own directory.
absl::StatusOr<v1::CommandLaunch> PrepareCommandLaunch(const LaunchSettings& settings,
                                                       const v1::Assignment& assignment,
                                                       const AttemptFiles& files);

// The agent's own CUDA_VISIBLE_DEVICES split at ',' (empty when unset or empty).
std::vector<std::string> AgentCudaVisibleDevices();

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_COMMAND_LAUNCH_H_
