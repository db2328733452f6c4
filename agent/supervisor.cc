#include "agent/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/strip.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "contract/stop_signal.h"

namespace substrax {
namespace {

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

bool WriteMessage(int fd, const SupervisorMessage& message) {
  while (true) {
    const ssize_t n = write(fd, &message, sizeof(message));
    if (n == static_cast<ssize_t>(sizeof(message))) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;  // EAGAIN (full), EPIPE (gone); never partial under PIPE_BUF
  }
}

struct SupervisorArgs {
  int control_fd = -1;
  int status_fd = -1;
  pid_t job = 0;
  int64_t grace_ms = 0;
  int64_t deadline_ns = 0;
  std::string label;
};

bool ParseArgs(int argc, char** argv, SupervisorArgs* args) {
  bool control = false, status = false, job = false, grace = false, deadline = false;
  for (int i = 2; i < argc; ++i) {
    absl::string_view arg = argv[i];
    int64_t n = 0;
    auto number = [&](absl::string_view flag, bool* seen) {
      if (!absl::ConsumePrefix(&arg, flag)) return false;
      *seen = absl::SimpleAtoi(arg, &n);
      return true;
    };
    if (number("--control-fd=", &control)) {
      args->control_fd = static_cast<int>(n);
    } else if (number("--status-fd=", &status)) {
      args->status_fd = static_cast<int>(n);
    } else if (number("--job-pid=", &job)) {
      args->job = static_cast<pid_t>(n);
    } else if (number("--grace-ms=", &grace)) {
      args->grace_ms = n;
    } else if (number("--deadline-ns=", &deadline)) {
      args->deadline_ns = n;
    } else if (absl::ConsumePrefix(&arg, "--job=")) {
      args->label = std::string(arg);
    } else {
      return false;
    }
  }
  return control && status && job && grace && deadline && args->job > 0 &&
         args->control_fd >= 0 && args->status_fd >= 0;
}

// The supervisor's state and loop (single-threaded).
class Supervisor {
 public:
  explicit Supervisor(SupervisorArgs args) : args_(std::move(args)) {}

  int Run() {
    // SIGCHLD (the job exited) and the signals that stop the supervisor come through a
    // signalfd, polled with the control pipe; blocked first so that none is lost in between.
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGTERM, SIGINT, SIGHUP}) sigaddset(&set, s);
    sigprocmask(SIG_BLOCK, &set, nullptr);
    signal(SIGPIPE, SIG_IGN);  // a status write to a gone agent fails with EPIPE instead
    const int signals = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (signals < 0) {
      Log(absl::StrCat("signalfd: ", std::strerror(errno), "; SIGKILL to the job"));
      SignalJob(SIGKILL);
    }
    deadline_ = args_.deadline_ns;
    Reap();  // it may have exited before the signalfd existed
    while (!exited_) {
      const int64_t now = MonotonicNs();
      if (fence_ == FenceCause::kNone && now >= deadline_) Fence(FenceCause::kLeaseExpired);
      if (fence_ != FenceCause::kNone && !killed_ && now >= kill_at_) {
        Log(absl::StrCat("still there after the grace of ", args_.grace_ms,
                         " ms: SIGKILL to its process group"));
        SignalJob(SIGKILL);
        killed_ = true;
      }
      int64_t wake = INT64_MAX;
      if (fence_ == FenceCause::kNone) wake = deadline_;
      if (fence_ != FenceCause::kNone && !killed_) wake = kill_at_;
      int timeout_ms = -1;
      if (wake != INT64_MAX) {
        timeout_ms = static_cast<int>(
            std::clamp<int64_t>((wake - MonotonicNs() + 999999) / 1000000, 0, INT_MAX));
      }
      // Without the signalfd, the job's exit is noticed by polling.
      if (signals < 0 && (timeout_ms < 0 || timeout_ms > 100)) timeout_ms = 100;
      pollfd fds[2] = {{signals, POLLIN, 0}, {control_open_ ? args_.control_fd : -1, POLLIN, 0}};
      if (poll(fds, 2, timeout_ms) < 0 && errno != EINTR) {
        // Cannot wait for anything: poll again after a pause rather than spin.
        usleep(100 * 1000);
      }
      if (fds[0].revents != 0) ReadSignals(signals);
      if (fds[1].revents != 0) ReadControl();
      Reap();
    }
    // Whatever the job left in its group goes with it.
    kill(-args_.job, SIGKILL);
    SupervisorMessage done;
    done.kind = kExitedMessage;
    done.value = wait_status_;
    done.detail = static_cast<int64_t>(fence_);
    WriteMessage(args_.status_fd, done);
    return 0;
  }

 private:
  void Log(const std::string& message) {
    const std::string line =
        absl::StrCat("substrax-agent supervisor ", getpid(), " of ", args_.label,
                     " (process group ", args_.job, "): ", message, "\n");
    // stderr is the agent's; once the agent is gone it may be a closed pipe (EPIPE, ignored).
    if (write(STDERR_FILENO, line.data(), line.size()) < 0) return;
  }

  // Signals the job's process group; its leader alone if the group is not there (it always is
  // as StartSupervised makes it, where both sides call setpgid before the supervisor runs).
  void SignalJob(int signal) {
    if (kill(-args_.job, signal) != 0 && errno == ESRCH) kill(args_.job, signal);
  }

  // SIGTERM to the group, the leader's first and marked as a fence's (contract/stop_signal.h):
  // the attempt may start elsewhere any moment, so the job must end at once, not checkpoint. The
  // group's SIGTERM that follows finds the leader's pending and adds nothing to it.
  void FenceJob() {
    sigval fence{};
    fence.sival_int = kFenceSigtermValue;
    sigqueue(args_.job, SIGTERM, fence);
    SignalJob(SIGTERM);
  }

  void Fence(FenceCause cause) {
    if (fence_ != FenceCause::kNone) return;
    fence_ = cause;
    kill_at_ = MonotonicNs() + args_.grace_ms * 1000000;
    Log(absl::StrCat(FenceReason(cause), ": SIGTERM to its process group, SIGKILL after ",
                     args_.grace_ms, " ms"));
    FenceJob();
  }

  void ReadSignals(int fd) {
    signalfd_siginfo info;
    while (read(fd, &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
      if (info.ssi_signo != SIGCHLD) Fence(FenceCause::kSignalled);
    }
  }

  void ReadControl() {
    char buffer[sizeof(SupervisorMessage) * 64];
    const ssize_t n = read(args_.control_fd, buffer, sizeof(buffer));
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      // EOF: every write end is closed, so the agent is gone (or failed to read: the same).
      control_open_ = false;
      close(args_.control_fd);
      Fence(FenceCause::kAgentGone);
      return;
    }
    pending_.append(buffer, static_cast<size_t>(n));
    while (pending_.size() >= sizeof(SupervisorMessage)) {
      SupervisorMessage message;
      std::memcpy(&message, pending_.data(), sizeof(message));
      pending_.erase(0, sizeof(message));
      if (message.kind == kRenewMessage) {
        // Once fenced the attempt is over: a late renewal changes nothing.
        if (fence_ == FenceCause::kNone) deadline_ = message.value;
      } else if (message.kind == kSignalMessage && message.value == SIGTERM &&
                 message.detail == 1) {
        FenceJob();
      } else if (message.kind == kSignalMessage && message.value > 0 && message.value < NSIG) {
        SignalJob(static_cast<int>(message.value));
      }
    }
  }

  void Reap() {
    int status = 0;
    pid_t r;
    while ((r = waitpid(args_.job, &status, WNOHANG)) < 0 && errno == EINTR) {
    }
    if (r == args_.job) {
      exited_ = true;
      wait_status_ = status;
    } else if (r < 0 && errno == ECHILD) {
      // Not our child (cannot happen as launched): nothing to wait for.
      exited_ = true;
      wait_status_ = 127 << 8;
    }
  }

  const SupervisorArgs args_;
  int64_t deadline_ = 0;
  FenceCause fence_ = FenceCause::kNone;
  int64_t kill_at_ = INT64_MAX;
  bool killed_ = false;
  bool control_open_ = true;
  std::string pending_;
  bool exited_ = false;
  int wait_status_ = 0;
};

}  // namespace

int SupervisorMain(int argc, char** argv) {
  SupervisorArgs args;
  if (!ParseArgs(argc, argv, &args)) {
    std::fprintf(stderr,
                 "substrax-agent %s: an internal mode of the agent, which starts one supervisor "
                 "per job process itself (--control-fd, --status-fd, --job-pid, --grace-ms and "
                 "--deadline-ns are required)\n",
                 kSupervisorMode);
    return 2;
  }
  return Supervisor(std::move(args)).Run();
}

std::string FenceReason(FenceCause cause) {
  switch (cause) {
    case FenceCause::kNone:
      return "";
    case FenceCause::kLeaseExpired:
      return "the agent did not renew the attempt's lease in time (the agent is stopped, hung "
             "or cut off from the coordinator, which may restart the attempt elsewhere)";
    case FenceCause::kAgentGone:
      return "the agent is gone";
    case FenceCause::kSignalled:
      return "the job's supervisor was told to stop (SIGTERM, SIGINT or SIGHUP)";
  }
  return "";
}

bool SendRenewal(int control_fd, absl::Duration deadline) {
  SupervisorMessage message;
  message.kind = kRenewMessage;
  message.value = absl::ToInt64Nanoseconds(deadline);
  return WriteMessage(control_fd, message);
}

bool SendSignal(int control_fd, int signal, bool fence) {
  SupervisorMessage message;
  message.kind = kSignalMessage;
  message.value = signal;
  message.detail = fence ? 1 : 0;
  return WriteMessage(control_fd, message);
}

SupervisedExit AwaitExit(SupervisedChild* child) {
  SupervisedExit exit;
  exit.reported = false;
  std::string pending;
  char buffer[sizeof(SupervisorMessage) * 8];
  while (true) {
    const ssize_t n = read(child->status_fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buffer, static_cast<size_t>(n));
  }
  for (size_t at = 0; at + sizeof(SupervisorMessage) <= pending.size();
       at += sizeof(SupervisorMessage)) {
    SupervisorMessage message;
    std::memcpy(&message, pending.data() + at, sizeof(message));
    if (message.kind != kExitedMessage) continue;
    exit.reported = true;
    exit.wait_status = static_cast<int>(message.value);
    exit.fence = static_cast<FenceCause>(message.detail);
  }
  close(child->status_fd);
  child->status_fd = -1;
  int status = 0;
  while (waitpid(child->supervisor, &status, 0) < 0 && errno == EINTR) {
  }
  if (!exit.reported) {
    // The supervisor died first (SIGKILL): its job's leader died with it (PR_SET_PDEATHSIG);
    // the rest of the group goes now.
    kill(-child->job, SIGKILL);
    exit.wait_status = status;
  }
  return exit;
}

}  // namespace substrax
