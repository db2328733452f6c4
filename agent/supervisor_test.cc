// The supervisor (supervisor.h) with real processes: the agent's own binary in its `supervise`
// mode, started by StartSupervised as the agent does. It reports the job's exit status exactly,
// fences the job's group when its lease lapses or the agent's end of the pipe closes (SIGTERM,
// then SIGKILL only after the grace), keeps it while renewed, and leaves nothing behind.
#include "agent/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "agent/launch.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

absl::Duration Monotonic() {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/", name);
  mkdir(dir.c_str(), 0700);
  return dir;
}

// The state letter of `pid` in /proc ('?' when it is gone).
char State(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

bool Alive(pid_t pid) {
  const char state = State(pid);
  return state != '?' && state != 'Z';
}

// Polls every 20 ms until `condition` holds or `timeout` passes.
template <typename F>
bool PollUntil(F condition, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));  // polling with a deadline
  }
  return true;
}

// "exit 7", "signal 15": how a wait status says the process ended.
std::string Ended(int wait_status) {
  return WIFSIGNALED(wait_status) ? absl::StrCat("signal ", WTERMSIG(wait_status))
                                  : absl::StrCat("exit ", WEXITSTATUS(wait_status));
}
std::string Signal(int signal) { return absl::StrCat("signal ", signal); }

pid_t GroupOf(pid_t pid) { return getpgid(pid); }

// Starts `script` (sh -c) under a supervisor whose lease ends `lease` from now.
SupervisedChild Start(const std::string& name, const std::string& script, absl::Duration lease,
                      absl::Duration grace) {
  const std::string log = TempDir(name) + "/log";
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  EXPECT_GE(fd, 0);
  ChildCommand command;
  command.binary = "/bin/sh";
  command.argv = {"sh", "-c", script};
  command.env = {"PATH=/usr/bin:/bin"};
  Supervision supervision;
  // The agent's own binary (a data dependency; bazel test runs in the runfiles tree).
  supervision.binary = "agent/substrax-agent";
  supervision.deadline = Monotonic() + lease;
  supervision.grace = grace;
  supervision.label = name;
  absl::StatusOr<SupervisedChild> child = StartSupervised(command, fd, supervision);
  close(fd);
  EXPECT_TRUE(child.ok()) << child.status();
  return child.ok() ? *child : SupervisedChild{};
}

// As in the agent (main.cc): a write to a supervisor that has exited fails with EPIPE.
const bool kSigpipeIgnored = signal(SIGPIPE, SIG_IGN) != SIG_ERR;

TEST(SupervisorTest, ReportsTheJobsExitStatusAndSignalExactly) {
  ASSERT_TRUE(kSigpipeIgnored);
  SupervisedChild exits = Start("exit7", "exit 7", absl::Hours(1), absl::Seconds(5));
  ASSERT_GT(exits.job, 0);
  SupervisedExit exit = AwaitExit(&exits);
  EXPECT_TRUE(exit.reported);
  EXPECT_EQ(exit.fence, FenceCause::kNone);
  EXPECT_EQ(Ended(exit.wait_status), "exit 7");
  close(exits.control_fd);

  SupervisedChild killed = Start("segv", "kill -SEGV $$", absl::Hours(1), absl::Seconds(5));
  exit = AwaitExit(&killed);
  EXPECT_TRUE(exit.reported);
  EXPECT_EQ(Ended(exit.wait_status), Signal(SIGSEGV));
  close(killed.control_fd);
}

TEST(SupervisorTest, SupervisorAndJobEachLeadAGroupOfTheirOwn) {
  SupervisedChild child = Start("groups", "exec sleep 1000", absl::Hours(1), absl::Seconds(5));
  ASSERT_GT(child.job, 0);
  EXPECT_EQ(GroupOf(child.supervisor), child.supervisor);
  EXPECT_TRUE(PollUntil([&] { return GroupOf(child.job) == child.job; }, absl::Seconds(5)));
  EXPECT_NE(GroupOf(child.supervisor), getpgrp());
  // The agent's own stop goes through the supervisor.
  ASSERT_TRUE(SendSignal(child.control_fd, SIGTERM));
  const SupervisedExit exit = AwaitExit(&child);
  EXPECT_EQ(exit.fence, FenceCause::kNone);
  EXPECT_EQ(Ended(exit.wait_status), Signal(SIGTERM));
  close(child.control_fd);
}

// A fence's SIGTERM reaches the job's leader queued (SI_QUEUE, with contract/stop_signal.h's
// value, which a job process tells apart); the agent's plain stop does not.
TEST(SupervisorTest, AFencesSigtermIsQueuedToTheLeaderAndAStopsIsNot) {
  for (const bool fence : {true, false}) {
    const std::string dir = TempDir(fence ? "fence_queued" : "stop_plain");
    const std::string code = dir + "/si_code";
    // Waits for SIGTERM (blocked, so that it stays pending) and writes how it was sent.
    const std::string script = absl::StrCat(
        "exec python3 -c 'import signal; signal.pthread_sigmask(signal.SIG_BLOCK, "
        "[signal.SIGTERM]); open(\"", dir, "/ready\", \"w\").close(); "
        "i = signal.sigwaitinfo([signal.SIGTERM]); open(\"", code,
        "\", \"w\").write(str(i.si_code))'");
    SupervisedChild child = Start(fence ? "fence_queued" : "stop_plain", script, absl::Hours(1),
                                  absl::Seconds(5));
    ASSERT_GT(child.job, 0);
    ASSERT_TRUE(PollUntil([&] { return std::ifstream(dir + "/ready").good(); },
                          absl::Seconds(10)));
    ASSERT_TRUE(SendSignal(child.control_fd, SIGTERM, fence));
    const SupervisedExit exit = AwaitExit(&child);
    EXPECT_EQ(Ended(exit.wait_status), "exit 0");
    std::ifstream in(code);
    std::string si_code;
    std::getline(in, si_code);
    EXPECT_EQ(si_code, absl::StrCat(fence ? SI_QUEUE : SI_USER)) << (fence ? "fence" : "stop");
    close(child.control_fd);
  }
}

TEST(SupervisorTest, ALapsedLeaseGetsSigtermThenSigkillOnlyAfterTheGrace) {
  const std::string dir = TempDir("lapsed");
  const std::string term = dir + "/term";
  // Ignores SIGTERM (noting it), so only SIGKILL ends it; its child `sleep` is in its group.
  const absl::Time start = absl::Now();
  SupervisedChild child =
      Start("lapsed", absl::StrCat("trap 'echo term > ", term, "' TERM; while :; do sleep 0.05; done"),
            absl::Milliseconds(300), absl::Seconds(2));
  ASSERT_GT(child.job, 0);
  ASSERT_TRUE(PollUntil([&] { return std::ifstream(term).good(); }, absl::Seconds(10)));
  const absl::Time termed = absl::Now();
  EXPECT_GE(termed - start, absl::Milliseconds(300));
  EXPECT_TRUE(Alive(child.job)) << "SIGKILL came before the grace";
  const SupervisedExit exit = AwaitExit(&child);
  const absl::Time ended = absl::Now();
  EXPECT_EQ(exit.fence, FenceCause::kLeaseExpired);
  EXPECT_EQ(Ended(exit.wait_status), Signal(SIGKILL));
  // The grace is 2 s; the poll above may have seen the file up to a poll period late.
  EXPECT_GE(ended - termed, absl::Milliseconds(1900));
  EXPECT_FALSE(Alive(child.job));
  EXPECT_FALSE(Alive(child.supervisor));
  close(child.control_fd);
}

TEST(SupervisorTest, RenewalsKeepTheJobRunning) {
  // A lease of 1 s renewed every 100 ms for 2.5 s: without the renewals it would have lapsed.
  SupervisedChild child = Start("renewed", "exec sleep 1000", absl::Seconds(1), absl::Seconds(5));
  ASSERT_GT(child.job, 0);
  const absl::Time until = absl::Now() + absl::Milliseconds(2500);
  while (absl::Now() < until) {
    ASSERT_TRUE(SendRenewal(child.control_fd, Monotonic() + absl::Seconds(1)));
    absl::SleepFor(absl::Milliseconds(100));  // the renewal period under test
  }
  EXPECT_TRUE(Alive(child.job)) << "fenced although renewed";
  // No renewal any more: fenced within the lease (SIGTERM ends `sleep`).
  const SupervisedExit exit = AwaitExit(&child);
  EXPECT_EQ(exit.fence, FenceCause::kLeaseExpired);
  EXPECT_EQ(Ended(exit.wait_status), Signal(SIGTERM));
  close(child.control_fd);
}

TEST(SupervisorTest, TheAgentsEndClosingFencesTheJob) {
  SupervisedChild child = Start("eof", "exec sleep 1000", absl::Hours(1), absl::Seconds(5));
  ASSERT_GT(child.job, 0);
  close(child.control_fd);  // what the agent's death does
  const SupervisedExit exit = AwaitExit(&child);
  EXPECT_EQ(exit.fence, FenceCause::kAgentGone);
  EXPECT_EQ(Ended(exit.wait_status), Signal(SIGTERM));
}

TEST(SupervisorTest, AKilledSupervisorTakesItsJobAlong) {
  const std::string pid_file = TempDir("killed") + "/sleep.pid";
  SupervisedChild child = Start(
      "killed", absl::StrCat("sleep 1000 & echo $! > ", pid_file, ".tmp; mv ", pid_file,
                             ".tmp ", pid_file, "; wait"),
      absl::Hours(1), absl::Seconds(5));
  ASSERT_GT(child.job, 0);
  pid_t sleeper = 0;
  ASSERT_TRUE(PollUntil([&] { return bool(std::ifstream(pid_file) >> sleeper); },
                        absl::Seconds(5)));
  kill(child.supervisor, SIGKILL);
  const SupervisedExit exit = AwaitExit(&child);
  EXPECT_FALSE(exit.reported);
  EXPECT_EQ(Ended(exit.wait_status), Signal(SIGKILL));
  // The leader by PR_SET_PDEATHSIG, its child `sleep` by the group SIGKILL of AwaitExit.
  EXPECT_TRUE(PollUntil([&] { return !Alive(child.job) && !Alive(sleeper); }, absl::Seconds(5)));
  close(child.control_fd);
}

TEST(SupervisorTest, TheModeRefusesABadCommandLine) {
  char arg0[] = "substrax-agent";
  char arg1[] = "supervise";
  char* argv[] = {arg0, arg1, nullptr};
  EXPECT_EQ(SupervisorMain(2, argv), 2);
}

}  // namespace
}  // namespace substrax
