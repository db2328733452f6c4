#include "client/local_cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"

namespace substrax::ctl {
namespace {

std::string TempDir(const std::string& name) {
  std::string dir = ::testing::TempDir();
  while (!dir.empty() && dir.back() == '/') dir.pop_back();
  dir += "/" + name;
  mkdir(dir.c_str(), 0755);
  return dir;
}

std::string Which(const std::string& path) {
  absl::StatusOr<std::string> found = FindBinary(path, path, {}, "", "");
  EXPECT_TRUE(found.ok()) << found.status();
  return found.ok() ? *found : path;
}

// A process we stopped or that exits on its own dies within 5 s.
::testing::AssertionResult EventuallyDead(const LocalProcess& p) {
  return testing::PollUntil([&] { return !IsAlive(p); }, absl::Now() + absl::Seconds(5),
                            p.name + " to die");
}

TEST(PidFileTest, RoundTripsNamesPidsAndExecutablesWithSpaces) {
  const std::vector<LocalProcess> processes = {
      {"coordinator", 1234, "/opt/sub strax/substrax-coordinator"},
      {"local-0", 1235, "/opt/bin/substrax-worker"},
      {"local-1", 99, ""}};
  const std::string text = FormatPidFile(processes);
  EXPECT_EQ(text.rfind("# ", 0), 0u);
  absl::StatusOr<std::vector<LocalProcess>> parsed = ParsePidFile(text, "pids");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, processes);
}

TEST(PidFileTest, MalformedLinesAreErrorsNamingTheLine) {
  absl::StatusOr<std::vector<LocalProcess>> parsed =
      ParsePidFile("# header\ncoordinator 12 /x\nlocal-0 notapid /y\n", "dir/pids");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(parsed.status().message().find("dir/pids:3: expected 'NAME PID EXECUTABLE'"),
            absl::string_view::npos)
      << parsed.status().message();
  EXPECT_FALSE(ParsePidFile("solo\n", "p").ok());
  EXPECT_FALSE(ParsePidFile("w -5 /x\n", "p").ok());
}

TEST(PidFileTest, WriteReadAndRemove) {
  const std::string dir = TempDir("state");
  EXPECT_EQ(ReadPidFile(dir).status().code(), absl::StatusCode::kNotFound);
  const std::vector<LocalProcess> processes = {{"coordinator", 42, "/bin/x"}};
  ASSERT_TRUE(WritePidFile(dir, processes).ok());
  {
    std::ofstream(AddressFilePath(dir)) << "127.0.0.1:1\n";
  }
  absl::StatusOr<std::vector<LocalProcess>> read = ReadPidFile(dir);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, processes);
  RemoveClusterFiles(dir);
  EXPECT_EQ(ReadPidFile(dir).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::ifstream(AddressFilePath(dir)).good());
  RemoveClusterFiles(dir);  // twice is fine
}

TEST(IsAliveTest, PidReuseByAnotherProgramIsNotOurs) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  ASSERT_GT(n, 0);
  const std::string exe(self, static_cast<size_t>(n));
  EXPECT_TRUE(IsAlive({"me", getpid(), exe}));
  EXPECT_TRUE(IsAlive({"me", getpid(), ""}));
  EXPECT_FALSE(IsAlive({"me", getpid(), "/usr/bin/substrax-something-else"}));
  EXPECT_FALSE(IsAlive({"none", 0, ""}));
}

TEST(SpawnDaemonTest, RunsInItsOwnSessionWithOutputInTheLog) {
  const std::string dir = TempDir("spawn");
  const std::string log = dir + "/echo.log";
  const std::string sh = Which("/bin/sh");
  absl::StatusOr<pid_t> pid = SpawnDaemon({sh, "-c", "echo out; echo err >&2"}, log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(EventuallyDead({"echo", *pid, sh}));
  const std::string tail = TailFile(log, 10);
  EXPECT_NE(tail.find("out\n"), std::string::npos) << tail;
  EXPECT_NE(tail.find("err\n"), std::string::npos) << tail;
  EXPECT_EQ(TailFile(log, 1).find("out"), std::string::npos);  // only the last line
}

TEST(SpawnDaemonTest, FailedExecIsAnErrorNamingTheProgram) {
  const std::string dir = TempDir("spawn-fail");
  absl::StatusOr<pid_t> pid = SpawnDaemon({dir + "/no-such-binary"}, dir + "/x.log");
  ASSERT_FALSE(pid.ok());
  EXPECT_EQ(pid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(pid.status().message().find("cannot execute " + dir + "/no-such-binary"),
            absl::string_view::npos);
  EXPECT_EQ(SpawnDaemon({"/bin/true"}, dir + "/no-such-dir/x.log").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(StopProcessesTest, TermThenKillWithinTheGrace) {
  const std::string dir = TempDir("stop");
  const std::string sleep = Which("/bin/sleep");
  const std::string sh = Which("/bin/sh");
  absl::StatusOr<pid_t> polite = SpawnDaemon({sleep, "60"}, dir + "/polite.log");
  // Ignores SIGTERM (and so does the sleep it runs): only SIGKILL to the group ends both.
  absl::StatusOr<pid_t> stubborn =
      SpawnDaemon({sh, "-c", "trap '' TERM; echo ready; sleep 60; sleep 60"}, dir + "/stubborn.log");
  ASSERT_TRUE(polite.ok() && stubborn.ok());
  ASSERT_TRUE(testing::PollUntil([&] { return TailFile(dir + "/stubborn.log", 1) == "ready\n"; },
                                 absl::Now() + absl::Seconds(5), "the stubborn shell to start"));
  const std::vector<LocalProcess> processes = {
      {"polite", *polite, sleep}, {"stubborn", *stubborn, sh}, {"gone", 999999, sleep}};
  EXPECT_TRUE(IsAlive(processes[0]));
  EXPECT_TRUE(IsAlive(processes[1]));
  EXPECT_EQ(getsid(*polite), *polite);  // its own session, so a terminal's ^C never reaches it
  EXPECT_FALSE(IsAlive(processes[2]));
  const absl::Time start = absl::Now();
  const std::vector<std::string> killed = StopProcesses(processes, absl::Milliseconds(300));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(killed, std::vector<std::string>{"stubborn"});
  EXPECT_TRUE(EventuallyDead(processes[0]));
  EXPECT_TRUE(EventuallyDead(processes[1]));
}

TEST(FindBinaryTest, OverrideThenCandidatesElseAnErrorWithTheFix) {
  const std::string dir = TempDir("bin");
  const std::string exe = dir + "/substrax-worker";
  const std::string plain = dir + "/not-executable";
  std::ofstream(exe) << "#!/bin/sh\n";
  std::ofstream(plain) << "x";
  chmod(exe.c_str(), 0755);
  chmod(plain.c_str(), 0644);

  EXPECT_EQ(*FindBinary("substrax-worker", "", {dir + "/missing", exe}, "bazel build //w", "--w"),
            exe);
  EXPECT_EQ(*FindBinary("substrax-worker", exe, {}, "", "--w"), exe);
  absl::StatusOr<std::string> bad_override = FindBinary("substrax-worker", plain, {exe}, "", "--w");
  ASSERT_FALSE(bad_override.ok());
  EXPECT_NE(bad_override.status().message().find("--w: " + plain + " is not an executable file"),
            absl::string_view::npos);
  absl::StatusOr<std::string> missing = FindBinary(
      "substrax-worker", "", {dir + "/a", plain}, "bazel build //worker:substrax-worker",
      "--worker-binary");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(),
            "cannot find substrax-worker (looked at " + dir + "/a, " + plain +
                "); build it with `bazel build //worker:substrax-worker` or give its path with "
                "--worker-binary");
}

TEST(FindBinaryTest, SiblingsNextToTheClientThenInTheBazelLayout) {
  EXPECT_EQ(SiblingCandidates("/r/bazel-bin/client", "worker", "substrax-worker"),
            (std::vector<std::string>{"/r/bazel-bin/client/substrax-worker",
                                      "/r/bazel-bin/worker/substrax-worker"}));
  EXPECT_TRUE(SiblingCandidates("", "worker", "substrax-worker").empty());
  EXPECT_FALSE(SelfDirectory().empty());
}

}  // namespace
}  // namespace substrax::ctl
