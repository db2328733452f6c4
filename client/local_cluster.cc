#include "client/local_cluster.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/files.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace substrax::ctl {

std::string PidFilePath(absl::string_view state_dir) { return absl::StrCat(state_dir, "/pids"); }

std::string AddressFilePath(absl::string_view state_dir) {
  return absl::StrCat(state_dir, "/address");
}

std::string LogPath(absl::string_view state_dir, absl::string_view name) {
  return absl::StrCat(state_dir, "/logs/", name, ".log");
}

std::string FormatPidFile(const std::vector<LocalProcess>& processes) {
  std::string out = "# substraxctl local cluster: NAME PID EXECUTABLE\n";
  for (const LocalProcess& p : processes) {
    absl::StrAppend(&out, p.name, " ", p.pid, " ", p.executable, "\n");
  }
  return out;
}

absl::StatusOr<std::vector<LocalProcess>> ParsePidFile(absl::string_view text,
                                                       absl::string_view source) {
  std::vector<LocalProcess> processes;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    // NAME PID EXECUTABLE; the executable may contain spaces, so it is the rest of the line.
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(' ', 2));
    LocalProcess p;
    int pid = 0;
    if (parts.size() < 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &pid) || pid <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", line_number, ": expected 'NAME PID EXECUTABLE', got '", line,
          "'; if no cluster runs there, delete the file"));
    }
    p.name = std::string(parts[0]);
    p.pid = pid;
    if (parts.size() == 3) p.executable = std::string(parts[2]);
    processes.push_back(std::move(p));
  }
  return processes;
}

absl::StatusOr<std::vector<LocalProcess>> ReadPidFile(absl::string_view state_dir) {
  const std::string path = PidFilePath(state_dir);
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no local cluster in ", state_dir));
  std::stringstream text;
  text << in.rdbuf();
  return ParsePidFile(text.str(), path);
}

absl::Status WritePidFile(absl::string_view state_dir,
                          const std::vector<LocalProcess>& processes) {
  const absl::Status written =
      WriteFileAtomically(PidFilePath(state_dir), FormatPidFile(processes));
  if (written.ok()) return written;
  return absl::FailedPreconditionError(written.message());
}

void RemoveClusterFiles(absl::string_view state_dir) {
  std::remove(PidFilePath(state_dir).c_str());
  std::remove(AddressFilePath(state_dir).c_str());
}

namespace {

// /proc/PID/stat: "pid (comm) S ..."; the state letter follows the last ')'.
bool IsZombie(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
}

bool RunsExecutable(pid_t pid, const std::string& executable) {
  if (executable.empty()) return true;
  char buffer[4096];
  const std::string link = absl::StrCat("/proc/", pid, "/exe");
  const ssize_t n = readlink(link.c_str(), buffer, sizeof(buffer) - 1);
  if (n <= 0) return false;  // not ours to read: another user's process
  absl::string_view target(buffer, static_cast<size_t>(n));
  absl::ConsumeSuffix(&target, " (deleted)");
  return target == executable;
}

}  // namespace

bool IsAlive(const LocalProcess& process) {
  if (process.pid <= 0) return false;
  // Our own child that exited: reap it (otherwise it stays a zombie and kill(pid, 0) succeeds).
  int status = 0;
  if (waitpid(process.pid, &status, WNOHANG) == process.pid) return false;
  if (kill(process.pid, 0) != 0 && errno == ESRCH) return false;
  if (IsZombie(process.pid)) return false;
  return RunsExecutable(process.pid, process.executable);
}

absl::StatusOr<pid_t> SpawnDaemon(const std::vector<std::string>& argv,
                                  const std::string& log_path) {
  if (argv.empty()) return absl::InvalidArgumentError("SpawnDaemon: empty command");
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot open log file ", log_path, ": ", std::strerror(errno)));
  }
  // The child reports a failed exec through this close-on-exec pipe: EOF means exec happened.
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // Everything the child needs is prepared before fork: between fork and exec only
  // async-signal-safe calls are allowed (the parent may have gRPC threads).
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    close(log_fd);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return absl::InternalError(absl::StrCat("fork: ", std::strerror(err)));
  }
  if (pid == 0) {
    close(pipe_fds[0]);
    setsid();
    const int null_fd = open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(args[0], args.data());
    const int err = errno;
    (void)!write(pipe_fds[1], &err, sizeof(err));
    _exit(127);
  }
  close(log_fd);
  close(pipe_fds[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(pipe_fds[0], &exec_errno, sizeof(exec_errno));
  } while (n < 0 && errno == EINTR);
  close(pipe_fds[0]);
  if (n == static_cast<ssize_t>(sizeof(exec_errno))) {
    waitpid(pid, nullptr, 0);
    return absl::ErrnoToStatus(exec_errno, absl::StrCat("cannot execute ", argv[0]));
  }
  return pid;
}

std::vector<std::string> StopProcesses(const std::vector<LocalProcess>& processes,
                                       absl::Duration grace) {
  // Each process leads its own session and process group (SpawnDaemon), so signalling the group
  // also reaches the runner processes a worker started; the pid alone is the fallback.
  auto signal = [](const LocalProcess& p, int sig) {
    if (kill(-p.pid, sig) != 0) kill(p.pid, sig);
  };
  std::vector<const LocalProcess*> live;
  for (const LocalProcess& p : processes) {
    if (IsAlive(p)) {
      signal(p, SIGTERM);
      live.push_back(&p);
    }
  }
  // Poll with a deadline; processes exit within milliseconds normally.
  const absl::Time deadline = absl::Now() + grace;
  absl::Duration delay = absl::Milliseconds(10);
  while (true) {
    std::vector<const LocalProcess*> still;
    for (const LocalProcess* p : live) {
      if (IsAlive(*p)) still.push_back(p);
    }
    live = std::move(still);
    if (live.empty() || absl::Now() >= deadline) break;
    absl::SleepFor(std::min(delay, deadline - absl::Now()));
    delay = std::min(delay * 2, absl::Milliseconds(200));
  }
  std::vector<std::string> killed;
  for (const LocalProcess* p : live) {
    signal(*p, SIGKILL);
    killed.push_back(p->name);
  }
  // Reap our own children so they do not linger as zombies (no-op for others).
  for (const LocalProcess* p : live) {
    for (int i = 0; i < 100 && IsAlive(*p); ++i) absl::SleepFor(absl::Milliseconds(10));
  }
  return killed;
}

namespace {

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

std::string Absolute(const std::string& path) {
  char resolved[PATH_MAX];
  if (realpath(path.c_str(), resolved) != nullptr) return resolved;
  return path;
}

}  // namespace

absl::StatusOr<std::string> FindBinary(absl::string_view name, absl::string_view override_path,
                                       const std::vector<std::string>& candidates,
                                       absl::string_view build_hint, absl::string_view flag) {
  if (!override_path.empty()) {
    const std::string path(override_path);
    if (!IsExecutableFile(path)) {
      return absl::NotFoundError(
          absl::StrCat(flag, ": ", path, " is not an executable file"));
    }
    return Absolute(path);
  }
  for (const std::string& candidate : candidates) {
    if (IsExecutableFile(candidate)) return Absolute(candidate);
  }
  return absl::NotFoundError(absl::StrCat(
      "cannot find ", name, " (looked at ",
      candidates.empty() ? std::string("nothing") : absl::StrJoin(candidates, ", "),
      "); build it with `", build_hint,
      "` or give its path with ", flag));
}

std::vector<std::string> SiblingCandidates(absl::string_view self_dir, absl::string_view package,
                                           absl::string_view name) {
  if (self_dir.empty()) return {};
  const std::filesystem::path dir{std::string(self_dir)};
  return {(dir / std::string(name)).lexically_normal().string(),
          (dir / ".." / std::string(package) / std::string(name)).lexically_normal().string()};
}

std::string SelfDirectory() {
  char buffer[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  if (n <= 0) return "";
  std::string path(buffer, static_cast<size_t>(n));
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

std::string TailFile(const std::string& path, int max_lines) {
  std::ifstream in(path);
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
  }
  std::string out;
  for (const std::string& l : lines) absl::StrAppend(&out, l, "\n");
  return out;
}

}  // namespace substrax::ctl
