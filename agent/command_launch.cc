#include "agent/command_launch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/data_paths.h"
#include "core/status.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

constexpr size_t kMaxPythonEnvNameBytes = 64;

bool PlainName(absl::string_view name, size_t max_bytes) {
  if (name.empty() || name.size() > max_bytes || name == "." || name == "..") return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' &&
        c != '-' && c != '+') {
      return false;
    }
  }
  return true;
}

std::string Where(const LaunchSettings& settings) {
  return absl::StrCat("on host ", settings.host, " (worker ", settings.worker_id, ")");
}

std::string PythonEnvsHint(const LaunchSettings& settings) {
  if (settings.python_envs.empty()) {
    return "this worker has no --python-env";
  }
  std::vector<std::string> names;
  for (const auto& [name, dir] : settings.python_envs) names.push_back(absl::StrCat(name, "=", dir));
  return absl::StrCat("this worker's --python-env: ", absl::StrJoin(names, ", "));
}

}  // namespace

bool RunsCommands(const LaunchSettings& settings) {
  return settings.switch_user || settings.allow_command_jobs;
}

absl::Status CheckRunsCommands(const LaunchSettings& settings, const v1::Assignment& assignment) {
  if (RunsCommands(settings)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "job ", assignment.job_id(), " is a command job, but the agent ", Where(settings),
      " runs no command jobs: a command runs any code its argv names, so the agent runs them "
      "only as a user of their own (--job-user USER) or when its operator allows them as the "
      "agent's own user (--allow-command-jobs; docs/command-jobs.md says what that exposes)"));
}

absl::StatusOr<std::pair<std::string, std::string>> ParsePythonEnv(absl::string_view flag) {
  const std::pair<std::string, std::string> parts = absl::StrSplit(flag, absl::MaxSplits('=', 1));
  const std::string& name = parts.first;
  if (!PlainName(name, kMaxPythonEnvNameBytes) || flag.find('=') == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--python-env '", flag, "': give NAME=DIR, NAME plain (letters, digits, '_', '.', '-', "
        "'+'; at most ", kMaxPythonEnvNameBytes, " bytes), DIR the environment's directory "
        "(a venv, or /usr for the system's Python)"));
  }
  absl::StatusOr<std::string> dir = NormalizeAbsolute(parts.second);
  if (!dir.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--python-env ", name, "=", parts.second, ": ", dir.status().message()));
  }
  const std::string bin = absl::StrCat(*dir == "/" ? "" : *dir, "/bin");
  struct stat st;
  if (stat(bin.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--python-env ", name, "=", *dir, ": ", bin, " is not a directory; give the directory "
        "of a venv (python3 -m venv DIR) or an installation prefix (/usr)"));
  }
  return std::make_pair(name, *std::move(dir));
}

absl::StatusOr<std::string> ResolveCommandExecutable(const LaunchSettings& settings,
                                                     const v1::CommandSpec& command) {
  if (command.argv().empty()) {
    return absl::FailedPreconditionError(
        "spec.command.argv is empty; the coordinator should have refused it at submit");
  }
  const std::string& name = command.argv(0);
  if (command.python_env().empty()) {
    absl::StatusOr<std::string> real = CheckProgram(settings, name);
    if (!real.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("spec.command.argv[0]: ", real.status().message()));
    }
    return real;
  }
  const auto env = settings.python_envs.find(command.python_env());
  if (env == settings.python_envs.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("spec.command.python_env '", command.python_env(), "' is not registered ",
                     Where(settings), "; ", PythonEnvsHint(settings)));
  }
  if (!PlainName(name, 255)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.command.argv[0] '", name, "': with python_env, argv[0] is a plain name of a file "
        "in the environment's bin/ (python, torchrun)"));
  }
  const std::string path = absl::StrCat(env->second == "/" ? "" : env->second, "/bin/", name);
  // The environment's own symbolic links are followed (a venv's bin/python leads to the
  // system's interpreter): the administrator registered the environment as a whole.
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.command.argv[0] '", name, "' not found in python_env ", command.python_env(), " ",
        Where(settings), ": ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode) || access(path.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.command.argv[0] '", name, "' in python_env ", command.python_env(), " ",
        Where(settings), ": ", path, " is not an executable file"));
  }
  return path;
}

absl::StatusOr<v1::CommandLaunch> PrepareCommandLaunch(const LaunchSettings& settings,
                                                       const v1::Assignment& assignment,
                                                       const AttemptFiles& files) {
  SUBSTRAX_RETURN_IF_ERROR(CheckRunsCommands(settings, assignment));
  if (files.job_dir.empty()) {
    return absl::FailedPreconditionError(
        "a command job's process needs a directory of its own in the work dir");
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::string executable,
                            ResolveCommandExecutable(settings, assignment.spec().command()));
  v1::CommandLaunch launch;
  launch.set_executable(executable);
  const std::string& working_dir = assignment.spec().command().working_dir();
  launch.set_working_dir(working_dir.empty() ? files.job_dir : working_dir);
  launch.set_attempt_dir(files.job_dir);
  launch.set_port_range_first(settings.command_port_first);
  launch.set_port_range_last(settings.command_port_last);
  for (const std::string& d : settings.agent_cuda_visible_devices) {
    launch.add_agent_cuda_visible_devices(d);
  }
  *launch.mutable_stop_grace() = ToProtoDuration(settings.stop_grace);
  return launch;
}

std::vector<std::string> AgentCudaVisibleDevices() {
  const char* value = std::getenv("CUDA_VISIBLE_DEVICES");
  if (value == nullptr || *value == '\0') return {};
  return absl::StrSplit(value, ',');
}

}  // namespace substrax
