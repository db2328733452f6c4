#include "agent/launch.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/wait.h>
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
#include "agent/command_launch.h"
#include "core/data_paths.h"
#include "core/job_env.h"
#include "core/status.h"
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
    files.activity = files.job_dir + "/activity";
  } else {
    files.launch = base + ".launch";
    files.result = base + ".result";
    files.started = base + ".started";
    files.activity = base + ".activity";
  }
  files.log = base + ".log";
  return files;
}

namespace {

// The capabilities (linux/capability.h) an agent needs to run jobs as another user: switch to
// it, give it its attempt's files, still read what it writes there, and signal its processes
// (the supervisor stops and fences them; a process of another user needs CAP_KILL).
constexpr struct {
  int bit;
  const char* name;
} kJobUserCapabilities[] = {
    {0, "CAP_CHOWN"}, {1, "CAP_DAC_OVERRIDE"}, {5, "CAP_KILL"}, {6, "CAP_SETGID"},
    {7, "CAP_SETUID"}};

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
  // A job bound to its owner's directory gets that directory of each root as its roots: the
  // process's own checks (symbolic links resolved) then keep it there.
  // A name that could leave the root (a '/', "..") gets none: the process can then write no
  // checkpoint at all, and says so.
  const std::string& owner_dir = assignment.checkpoint_owner_directory();
  const std::vector<std::string> checkpoint_roots =
      owner_dir.empty()                 ? settings.checkpoint_roots
      : IsDirectoryEntryName(owner_dir) ? OwnerCheckpointRoots(settings.checkpoint_roots, owner_dir)
                                        : std::vector<std::string>{};
  for (const std::string& root : checkpoint_roots) launch.add_checkpoint_roots(root);
  launch.set_result_path(files.result);
  launch.set_started_path(files.started);
  // A command job's launcher publishes there when each of its processes last wrote a report
  // line (its frameworks count no collectives: the report file's heartbeats stand in).
  launch.set_activity_path(files.activity);
  return launch;
}

absl::Status WriteAttemptFiles(const LaunchSettings& settings, const v1::Assignment& assignment,
                               const AttemptFiles& files, const v1::CommandLaunch* command) {
  v1::ProgramLaunch launch = MakeProgramLaunch(settings, assignment, files);
  if (command != nullptr) *launch.mutable_command() = *command;
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

namespace {

// The coordinator refused a bad spec env at submit; an assignment that carries one anyway (an
// old or impostor coordinator) must not start a process with it.
absl::Status CheckSpecEnv(const LaunchSettings& settings, const v1::Assignment& assignment,
                          absl::string_view field,
                          const google::protobuf::Map<std::string, std::string>& env) {
  for (const auto& [name, value] : env) {
    std::string why = JobEnvNameProblem(name);
    if (why.empty()) why = JobEnvDenial(name);
    if (!why.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", assignment.job_id(), " attempt ", assignment.attempt(), ": ", field, ".", name,
          " refused on host ", settings.host, " (worker ", settings.worker_id, "): ", why,
          "; the coordinator should have refused it at submit: check its version"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ChildCommand> BuildCommand(const LaunchSettings& settings,
                                          const v1::Assignment& assignment,
                                          const AttemptFiles& files) {
  ChildCommand command;
  std::vector<std::pair<std::string, std::string>> additions;
  const v1::JobSpec& spec = assignment.spec();
  if (spec.has_command()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckRunsCommands(settings, assignment));
    SUBSTRAX_RETURN_IF_ERROR(
        CheckSpecEnv(settings, assignment, "spec.command.env", spec.command().env()));
    // The launcher (`substrax-job command`) starts the command's processes with the contract.
    command.binary = settings.job_binary;
    command.argv = {"substrax-job", "command"};
    for (const auto& [name, value] : spec.command().env()) additions.emplace_back(name, value);
  } else if (spec.has_program()) {
    SUBSTRAX_RETURN_IF_ERROR(
        CheckSpecEnv(settings, assignment, "spec.program.env", spec.program().env()));
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

namespace {

// Writes `value` (>= 0) in decimal at `out` and a NUL after it. Async-signal-safe.
void WriteDecimal(char* out, int64_t value) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value > 0 && n < 23);
  while (n > 0) *out++ = digits[--n];
  *out = '\0';
}

// A command with its argv and envp built: fork leaves one thread of the multithreaded agent,
// so after it the child (and a forked supervisor) may make only async-signal-safe calls, and
// everything they need is made before. Not copyable: the pointers lead into its own strings.
struct PreparedCommand {
  explicit PreparedCommand(const ChildCommand& command)
      : binary(command.binary),
        args(command.argv),
        env(command.env),
        credentials(command.credentials),
        switch_failed(command.credentials.has_value()
                          ? absl::StrCat("substrax-agent: cannot run the job as --job-user ",
                                         command.credentials->user, " (uid ",
                                         command.credentials->uid, "): ")
                          : "") {
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
  }
  PreparedCommand(const PreparedCommand&) = delete;
  PreparedCommand& operator=(const PreparedCommand&) = delete;

  const std::string binary;
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::vector<char*> argv;
  std::vector<char*> envp;
  // The job user's, when the job runs as one (--job-user); what the log says if the switch fails.
  const std::optional<ChildCredentials> credentials;
  const std::string switch_failed;
};

// Forks the job process and executes it: the one place where a job process is executed (with
// or without a supervisor). Async-signal-safe. Returns its pid, or -1 with errno set.
pid_t ForkJob(const PreparedCommand& command, int log_fd) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    // It leads a process group that is signalled as a whole, so its own children go with it.
    setpgid(0, 0);
    // The agent blocks SIGTERM and SIGINT for its signal thread; the child must die of them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    // An ignored SIGPIPE survives exec: give the child the default and let it choose.
    signal(SIGPIPE, SIG_DFL);
    // dup2 clears close-on-exec on the copies.
    if (dup2(log_fd, STDOUT_FILENO) < 0 || dup2(log_fd, STDERR_FILENO) < 0) _exit(127);
    // The job user's credentials (one call, here wherever exec moves), before
    // PR_SET_PDEATHSIG: a change of credentials clears it.
    if (command.credentials.has_value()) {
      if (const char* failed = ApplyChildCredentials(*command.credentials); failed != nullptr) {
        // strerror is not async-signal-safe: the errno's number.
        char number[24];
        WriteDecimal(number, errno);
        ssize_t ignored =
            write(STDERR_FILENO, command.switch_failed.data(), command.switch_failed.size());
        ignored = write(STDERR_FILENO, failed, strlen(failed));
        ignored = write(STDERR_FILENO, " failed with errno ", 19);
        ignored = write(STDERR_FILENO, number, strlen(number));
        ignored = write(STDERR_FILENO, "\n", 1);
        (void)ignored;
        _exit(127);
      }
    }
    // The child never outlives the process that forked it (the supervisor, single-threaded: so
    // the death of its only thread); one that died before this is caught by the check.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    execve(command.binary.c_str(), command.argv.data(), command.envp.data());
    _exit(127);
  }
  // Also set in the child: whichever runs first, the group exists before anyone signals it.
  if (pid > 0) setpgid(pid, pid);
  return pid;
}

// Reads exactly sizeof(*message) bytes; false at EOF or on an error.
bool ReadMessage(int fd, SupervisorMessage* message) {
  size_t done = 0;
  char* bytes = reinterpret_cast<char*>(message);
  while (done < sizeof(*message)) {
    const ssize_t n = read(fd, bytes + done, sizeof(*message) - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::StatusOr<pid_t> StartChild(const ChildCommand& command, int log_fd) {
  const PreparedCommand prepared(command);
  const pid_t pid = ForkJob(prepared, log_fd);
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  return pid;
}

absl::StatusOr<SupervisedChild> StartSupervised(const ChildCommand& command, int log_fd,
                                                const Supervision& supervision) {
  const PreparedCommand job(command);
  int control[2];
  int status[2];
  if (pipe2(control, O_CLOEXEC) != 0) {
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  if (pipe2(status, O_CLOEXEC) != 0) {
    const int error = errno;
    close(control[0]);
    close(control[1]);
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(error)));
  }
  // A supervisor that does not read (stopped) must never block the agent's writes.
  fcntl(control[1], F_SETFL, O_NONBLOCK);
  constexpr char kJobPidFlag[] = "--job-pid=";
  ChildCommand supervisor_command;
  supervisor_command.binary = supervision.binary;
  supervisor_command.argv = {
      "substrax-agent",
      kSupervisorMode,
      absl::StrCat("--control-fd=", control[0]),
      absl::StrCat("--status-fd=", status[1]),
      // Room for the pid, written by the forked supervisor once it knows it.
      absl::StrCat(kJobPidFlag, std::string(24, ' ')),
      absl::StrCat("--grace-ms=", absl::ToInt64Milliseconds(supervision.grace)),
      absl::StrCat("--deadline-ns=", absl::ToInt64Nanoseconds(supervision.deadline)),
      absl::StrCat("--job=", supervision.label)};
  for (char* const* e = environ; e != nullptr && *e != nullptr; ++e) {
    supervisor_command.env.emplace_back(*e);
  }
  PreparedCommand supervisor(supervisor_command);
  char* const job_pid_arg = supervisor.argv[4] + sizeof(kJobPidFlag) - 1;

  const pid_t pid = fork();
  if (pid == 0) {
    // The supervisor: in a group of its own (a signal to the agent's group does not reach it),
    // and no PR_SET_PDEATHSIG: it outlives the agent to fence the job.
    setpgid(0, 0);
    SupervisorMessage started;
    started.kind = kStartedMessage;
    const pid_t job_pid = ForkJob(job, log_fd);
    started.value = job_pid > 0 ? job_pid : -errno;
    if (write(status[1], &started, sizeof(started)) < 0 || job_pid < 0) {
      if (job_pid > 0) kill(-job_pid, SIGKILL);
      _exit(127);
    }
    WriteDecimal(job_pid_arg, job_pid);
    // Only now, after the job's fork, do the supervisor's ends of the pipes survive exec.
    fcntl(control[0], F_SETFD, 0);
    fcntl(status[1], F_SETFD, 0);
    execve(supervisor.binary.c_str(), supervisor.argv.data(), supervisor.envp.data());
    // Never a job without its supervisor.
    kill(-job_pid, SIGKILL);
    _exit(127);
  }
  const int fork_error = errno;
  close(control[0]);
  close(status[1]);
  if (pid < 0) {
    close(control[1]);
    close(status[0]);
    return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(fork_error)));
  }
  setpgid(pid, pid);
  SupervisedChild child;
  child.supervisor = pid;
  child.control_fd = control[1];
  child.status_fd = status[0];
  SupervisorMessage started;
  if (!ReadMessage(child.status_fd, &started) || started.kind != kStartedMessage ||
      started.value <= 0) {
    const int error = started.kind == kStartedMessage && started.value < 0
                          ? static_cast<int>(-started.value)
                          : 0;
    close(child.control_fd);
    close(child.status_fd);
    int ignored = 0;
    while (waitpid(pid, &ignored, 0) < 0 && errno == EINTR) {
    }
    return absl::UnavailableError(
        error != 0 ? absl::StrCat("fork: ", std::strerror(error))
                   : std::string("its supervisor exited before starting it"));
  }
  child.job = static_cast<pid_t>(started.value);
  return child;
}

}  // namespace substrax
