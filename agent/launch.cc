#include "agent/launch.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/data_paths.h"
#include "core/job_env.h"
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

AttemptFiles FilesOfAttempt(const std::string& work_dir, const v1::Assignment& assignment,
                            bool own_dir) {
  const std::string base = absl::StrCat(work_dir, "/", assignment.job_id(), "-attempt-",
                                        assignment.attempt(), "-process-",
                                        assignment.process_index());
  AttemptFiles files;
  if (own_dir) {
    files.job_dir = base + ".job";
    files.launch = files.job_dir + "/launch";
    files.result = files.job_dir + "/result";
    files.started = files.job_dir + "/started";
  } else {
    files.launch = base + ".launch";
    files.result = base + ".result";
    files.started = base + ".started";
  }
  files.log = base + ".log";
  return files;
}

namespace {

// The capabilities (linux/capability.h) an agent needs to run jobs as another user: switch to
// it, give it its attempt's files, and still read what it writes there.
constexpr struct {
  int bit;
  const char* name;
} kJobUserCapabilities[] = {
    {0, "CAP_CHOWN"}, {1, "CAP_DAC_OVERRIDE"}, {6, "CAP_SETGID"}, {7, "CAP_SETUID"}};

// The effective capabilities of this process (/proc/self/status CapEff); 0 when unreadable.
uint64_t EffectiveCapabilities() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    uint64_t caps = 0;
    if (absl::ConsumePrefix(&rest, "CapEff:") &&
        absl::SimpleHexAtoi(absl::StripAsciiWhitespace(rest), &caps)) {
      return caps;
    }
  }
  return 0;
}

}  // namespace

absl::StatusOr<JobUser> ResolveJobUser(const std::string& name) {
  std::vector<std::string> missing;
  const uint64_t caps = EffectiveCapabilities();
  for (const auto& cap : kJobUserCapabilities) {
    if ((caps & (uint64_t{1} << cap.bit)) == 0) missing.push_back(cap.name);
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--job-user ", name, ": this agent (uid ", geteuid(), ") cannot run jobs as another user: "
        "it lacks ", absl::StrJoin(missing, ", "), "; start it as root (or with those "
        "capabilities), or leave --job-user out to run jobs as the agent's own user"));
  }
  passwd entry;
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  const int error = getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found);
  if (found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job-user ", name, ": no such user on this host",
        error != 0 ? absl::StrCat(" (", std::strerror(error), ")") : "",
        "; create it (useradd --system ", name, ") or name another"));
  }
  if (entry.pw_uid == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--job-user ", name, " is root (uid 0): jobs would run with every privilege of the "
        "host; name an unprivileged user"));
  }
  JobUser user;
  user.name = name;
  user.uid = entry.pw_uid;
  user.gid = entry.pw_gid;
  user.home = entry.pw_dir != nullptr ? entry.pw_dir : "";
  int count = 64;
  user.groups.resize(count);
  while (getgrouplist(name.c_str(), user.gid, user.groups.data(), &count) < 0) {
    user.groups.resize(count);
  }
  user.groups.resize(count);
  return user;
}

JobUser CurrentUser() {
  JobUser user;
  user.uid = geteuid();
  user.gid = getegid();
  passwd entry;
  passwd* found = nullptr;
  std::vector<char> buffer(16384);
  if (getpwuid_r(user.uid, &entry, buffer.data(), buffer.size(), &found) == 0 &&
      found != nullptr) {
    user.name = entry.pw_name;
    user.home = entry.pw_dir != nullptr ? entry.pw_dir : "";
  }
  return user;
}

v1::ProgramLaunch MakeProgramLaunch(const LaunchSettings& settings,
                                    const v1::Assignment& assignment, const AttemptFiles& files) {
  v1::ProgramLaunch launch;
  launch.set_sdk_version_major(SUBSTRAX_VERSION_MAJOR);
  *launch.mutable_assignment() = assignment;
  launch.set_coordinator(settings.coordinator);
  v1::TransportSettings* transport = launch.mutable_transport();
  transport->set_insecure(settings.transport.insecure);
  transport->set_ca_file(settings.transport.ca_file);
  transport->set_cert_file(settings.transport.cert_file);
  transport->set_key_file(settings.transport.key_file);
  transport->set_server_name(settings.transport.server_name);
  *transport->mutable_reload_interval() = ToProtoDuration(settings.transport.reload_interval);
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
  if (!files.job_dir.empty()) {
    // Made afresh and the agent's until the launch file is in it: nothing an earlier process
    // of the job user left there (a symlink named launch) is followed. Given to the job user
    // last, with the launch file (still 0600): the process reads it and writes its result and
    // started file beside it, and reaches nothing else of the work dir.
    std::error_code error;
    std::filesystem::remove_all(files.job_dir, error);
    if (mkdir(files.job_dir.c_str(), 0700) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", files.job_dir));
    }
    if (absl::Status s = WriteLaunchFile(files.launch, launch); !s.ok()) return s;
    for (const std::string* path : {&files.launch, &files.job_dir}) {
      if (lchown(path->c_str(), settings.job_user.uid, settings.job_user.gid) != 0) {
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot give ", *path, " to --job-user ",
                                                       settings.job_user.name));
      }
    }
    return absl::OkStatus();
  }
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

std::vector<std::pair<std::string, std::string>> BaseJobEnvironment(const JobUser& user) {
  std::vector<std::pair<std::string, std::string>> base = {
      {"PATH", "/usr/local/bin:/usr/bin:/bin"}, {"HOME", user.home.empty() ? "/" : user.home}};
  // A uid without a passwd entry (a container's) has no name to give.
  if (!user.name.empty()) {
    base.emplace_back("USER", user.name);
    base.emplace_back("LOGNAME", user.name);
  }
  base.emplace_back("LANG", "C.UTF-8");
  return base;
}

std::vector<std::string> ChildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& base, char* const* environment,
    const std::vector<std::string>& pass,
    const std::vector<std::pair<std::string, std::string>>& additions) {
  std::vector<std::pair<std::string, std::string>> all = base;
  for (const std::string& name : pass) {
    for (char* const* e = environment; e != nullptr && *e != nullptr; ++e) {
      const absl::string_view entry(*e);
      const size_t equals = entry.find('=');
      if (equals != absl::string_view::npos && entry.substr(0, equals) == name) {
        all.emplace_back(name, std::string(entry.substr(equals + 1)));
        break;
      }
    }
  }
  all.insert(all.end(), additions.begin(), additions.end());
  // A name given twice takes the last value, in the place of the first.
  std::vector<std::pair<std::string, std::string>> unique;
  for (const auto& [name, value] : all) {
    auto it = std::find_if(unique.begin(), unique.end(),
                           [&name = name](const auto& u) { return u.first == name; });
    if (it != unique.end()) {
      it->second = value;
    } else {
      unique.emplace_back(name, value);
    }
  }
  std::vector<std::string> env;
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
    // The coordinator refused these at submit; an assignment that carries one anyway (an old or
    // impostor coordinator) must not start a process with it.
    for (const auto& [name, value] : spec.program().env()) {
      std::string why = JobEnvNameProblem(name);
      if (why.empty()) why = JobEnvDenial(name);
      if (!why.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", assignment.job_id(), " attempt ", assignment.attempt(), ": spec.program.env.",
            name, " refused on host ", settings.host, " (worker ", settings.worker_id, "): ", why,
            "; the coordinator should have refused it at submit: check its version"));
      }
    }
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
  // Never the agent's own environment: only the fixed base and what the operator names.
  command.env = ChildEnvironment(BaseJobEnvironment(settings.job_user), environ,
                                 settings.job_env_pass, additions);
  if (settings.switch_user) {
    command.credentials =
        ChildCredentials{settings.job_user.uid, settings.job_user.gid, settings.job_user.groups,
                         settings.job_user.name, files.job_dir};
  }
  return command;
}

const char* ApplyChildCredentials(const ChildCredentials& credentials) {
  // Groups first: once the uid is dropped, the groups can no longer be changed.
  if (setgroups(credentials.groups.size(), credentials.groups.data()) != 0) return "setgroups";
  if (setgid(credentials.gid) != 0) return "setgid";
  if (setuid(credentials.uid) != 0) return "setuid";
  if (!credentials.working_dir.empty() && chdir(credentials.working_dir.c_str()) != 0) {
    return "chdir to its attempt's directory";
  }
  return nullptr;
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
  const std::string switch_failed =
      command.credentials.has_value()
          ? absl::StrCat("substrax-agent: cannot run the job as --job-user ",
                         command.credentials->user, " (uid ", command.credentials->uid, "): ")
          : "";

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
    // The last step before exec: the job user's credentials (one call, wherever exec moves).
    if (command.credentials.has_value()) {
      if (const char* failed = ApplyChildCredentials(*command.credentials); failed != nullptr) {
        // strerror is not async-signal-safe: the errno's number, written by hand.
        char number[16];
        int at = sizeof(number);
        for (int e = errno; at == sizeof(number) || e > 0; e /= 10) number[--at] = '0' + e % 10;
        ssize_t ignored = write(STDERR_FILENO, switch_failed.data(), switch_failed.size());
        ignored = write(STDERR_FILENO, failed, strlen(failed));
        ignored = write(STDERR_FILENO, " failed with errno ", 19);
        ignored = write(STDERR_FILENO, number + at, sizeof(number) - at);
        ignored = write(STDERR_FILENO, "\n", 1);
        (void)ignored;
        _exit(127);
      }
    }
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  // Also set in the child: whichever runs first, the group exists before anyone signals it.
  setpgid(pid, pid);
  return pid;
}

}  // namespace substrax
