#include "agent/launch.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/data_paths.h"
#include "rpc/proto_time.h"
#include "substrax/version.h"

namespace substrax {
namespace {

// Where a failed program check points the reader: the directories this daemon runs programs
// from.
std::string ProgramsDirsHint(const LaunchSettings& settings) {
  if (settings.programs_dirs.empty()) {
    return "this worker has no --programs-dir, so it runs no programs";
  }
  return absl::StrCat("programs run from --programs-dir ",
                      absl::StrJoin(settings.programs_dirs, ", "));
}

// `path` with every symlink resolved into *real; otherwise the errno of the failure.
int RealPath(const std::string& path, std::string* real) {
  char* resolved = realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return errno;
  *real = resolved;
  free(resolved);
  return 0;
}

}  // namespace

AttemptFiles FilesOfAttempt(const std::string& work_dir, const v1::Assignment& assignment) {
  const std::string base = absl::StrCat(work_dir, "/", assignment.job_id(), "-attempt-",
                                        assignment.attempt(), "-process-",
                                        assignment.process_index());
  AttemptFiles files;
  files.launch = base + ".launch";
  files.result = base + ".result";
  files.started = base + ".started";
  files.log = base + ".log";
  return files;
}

v1::ProgramLaunch MakeProgramLaunch(const LaunchSettings& settings,
                                    const v1::Assignment& assignment, const AttemptFiles& files) {
  v1::ProgramLaunch launch;
  launch.set_sdk_version_major(SUBSTRAX_VERSION_MAJOR);
  *launch.mutable_assignment() = assignment;
  launch.set_coordinator(settings.coordinator);
  // What verifies the coordinator, and the attempt's own credential: never the daemon's
  // certificate, key or token, so that a job's code cannot act as its worker.
  v1::TransportSettings* transport = launch.mutable_transport();
  transport->set_insecure(settings.transport.insecure);
  transport->set_ca_file(settings.transport.ca_file);
  transport->set_server_name(settings.transport.server_name);
  *transport->mutable_reload_interval() = ToProtoDuration(settings.transport.reload_interval);
  // One place for the token in the file: the transport.
  transport->set_attempt_token(assignment.attempt_token());
  launch.mutable_assignment()->clear_attempt_token();
  launch.set_listen_host(settings.listen_host);
  *launch.mutable_collective_timeout() = ToProtoDuration(settings.collective_timeout);
  for (const std::string& root : settings.data_roots) launch.add_data_roots(root);
  for (const std::string& root : settings.checkpoint_roots) launch.add_checkpoint_roots(root);
  launch.set_result_path(files.result);
  launch.set_started_path(files.started);
  return launch;
}

absl::Status WriteAttemptFiles(const LaunchSettings& settings, const v1::Assignment& assignment,
                               const AttemptFiles& files) {
  const v1::ProgramLaunch launch = MakeProgramLaunch(settings, assignment, files);
  if (absl::Status s = WriteLaunchFile(files.launch, launch); !s.ok()) return s;
  // A file left by an earlier daemon's launch of the same name must not be taken for this one's.
  for (const std::string* stale : {&files.result, &files.started}) {
    if (std::remove(stale->c_str()) != 0 && errno != ENOENT) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot remove the old ", *stale));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckProgram(const LaunchSettings& settings,
                                         const std::string& path) {
  auto fail = [&](const std::string& reason) {
    return absl::FailedPreconditionError(absl::StrCat(reason, "; ", ProgramsDirsHint(settings)));
  };
  const std::string where =
      absl::StrCat("on host ", settings.host, " (worker ", settings.worker_id, ")");
  // The coordinator checked the path against every worker's directories; this one's may differ.
  if (FindRoot(path, settings.programs_dirs) == nullptr) {
    return fail(absl::StrCat("program ", path, " is not under a programs dir ", where));
  }
  std::string real;
  if (const int error = RealPath(path, &real); error != 0) {
    const bool missing = error == ENOENT || error == ENOTDIR;
    return fail(absl::StrCat("program ", path, missing ? " not found " : " cannot be resolved ",
                             where, ": ", std::strerror(error)));
  }
  bool inside = false;
  for (const std::string& dir : settings.programs_dirs) {
    std::string real_dir;
    if (RealPath(dir, &real_dir) == 0 && IsUnderRoot(real, real_dir)) inside = true;
  }
  if (!inside) {
    return fail(absl::StrCat("program ", path, " resolves to ", real, " ", where,
                             ", outside every programs dir: a symbolic link must not lead out of "
                             "it"));
  }
  struct stat st;
  if (stat(real.c_str(), &st) != 0) {
    return fail(absl::StrCat("program ", path, " not found ", where, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return fail(absl::StrCat("program ", path, " ", where, " is not a regular file",
                             S_ISDIR(st.st_mode) ? " (a directory)" : ""));
  }
  if (access(real.c_str(), X_OK) != 0) {
    return fail(absl::StrCat("program ", path, " ", where,
                             " is not executable by the worker daemon: ", std::strerror(errno)));
  }
  return real;
}

std::vector<std::string> ChildEnvironment(
    char* const* environment, const std::vector<std::pair<std::string, std::string>>& additions) {
  std::vector<std::string> env;
  for (char* const* e = environment; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (const auto& [added, value] : additions) replaced = replaced || added == name;
    if (!replaced) env.push_back(entry);
  }
  // A name given twice takes the last value, in the place of the first.
  std::vector<std::pair<std::string, std::string>> unique;
  for (const auto& [name, value] : additions) {
    auto it = std::find_if(unique.begin(), unique.end(),
                           [&name = name](const auto& u) { return u.first == name; });
    if (it != unique.end()) {
      it->second = value;
    } else {
      unique.emplace_back(name, value);
    }
  }
  for (const auto& [name, value] : unique) env.push_back(absl::StrCat(name, "=", value));
  return env;
}

absl::StatusOr<ChildCommand> BuildCommand(const LaunchSettings& settings,
                                          const v1::Assignment& assignment,
                                          const AttemptFiles& files) {
  ChildCommand command;
  std::vector<std::pair<std::string, std::string>> additions;
  const v1::JobSpec& spec = assignment.spec();
  if (spec.has_program()) {
    absl::StatusOr<std::string> real = CheckProgram(settings, spec.program().path());
    if (!real.ok()) return real.status();
    // The resolved file is executed (a symlink swapped meanwhile changes nothing); argv[0] is
    // the path the spec names.
    command.binary = *real;
    command.argv.push_back(spec.program().path());
    command.argv.insert(command.argv.end(), spec.program().args().begin(),
                        spec.program().args().end());
    for (const auto& [name, value] : spec.program().env()) additions.emplace_back(name, value);
  } else {
    command.binary = settings.job_binary;
    command.argv = {"substrax-job", "run"};
  }
  additions.emplace_back(kLaunchEnv, files.launch);
  command.env = ChildEnvironment(environ, additions);
  return command;
}

absl::StatusOr<pid_t> StartChild(const ChildCommand& command, int log_fd) {
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> args = command.argv;
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env = command.env;
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string binary = command.binary;
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid == 0) {
    // The child never outlives its daemon, and its own children go with it: it leads a process
    // group that the daemon signals as a whole.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    setpgid(0, 0);
    // The daemon blocks SIGTERM and SIGINT for its signal thread; the child must die of them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // An ignored SIGPIPE survives exec: give the child the default and let it choose.
    signal(SIGPIPE, SIG_DFL);
    // dup2 clears close-on-exec on the copies.
    if (dup2(log_fd, STDOUT_FILENO) < 0 || dup2(log_fd, STDERR_FILENO) < 0) _exit(127);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  // Also set in the child: whichever runs first, the group exists before anyone signals it.
  setpgid(pid, pid);
  return pid;
}

}  // namespace substrax
