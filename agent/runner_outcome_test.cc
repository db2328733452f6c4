#include "agent/runner_outcome.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "agent/work_files.h"
#include "base/files.h"

namespace substrax {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(base ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

RunnerExit Exit(const std::string& dir, int wait_status) {
  RunnerExit e;
  e.wait_status = wait_status;
  e.result_path = dir + "/j-attempt-1-process-0.result";
  e.log_path = dir + "/j-attempt-1-process-0.log";
  std::ofstream(e.log_path) << "step 1/2\nboom\n";
  return e;
}

TEST(RunnerOutcomeTest, SuccessCarriesTheFinalMetrics) {
  const RunnerExit e = Exit(TempDir("ok"), W_EXITCODE(0, 0));
  v1::ReportAttemptStatusRequest written;
  written.set_state(v1::RUNNER_STATE_SUCCEEDED);
  (*written.mutable_final_metrics())["test_accuracy"] = 0.88;
  ASSERT_TRUE(WriteFileAtomically(e.result_path, written.SerializeAsString()).ok());
  std::string warning;
  const v1::ReportAttemptStatusRequest r = RunnerOutcome(e, &warning);
  EXPECT_EQ(r.state(), v1::RUNNER_STATE_SUCCEEDED);
  EXPECT_EQ(r.final_metrics().at("test_accuracy"), 0.88);
  EXPECT_TRUE(warning.empty());
}

// The runner trained but could not write its result (a full disk, an unwritable path): still a
// success, without final metrics.
TEST(RunnerOutcomeTest, UnwritableResultOfASuccessfulRunnerIsStillASuccess) {
  const std::string dir = TempDir("unwritable");
  RunnerExit e = Exit(dir, W_EXITCODE(0, 0));
  e.result_path = dir + "/missing-dir/j-attempt-1-process-0.result";
  v1::ReportAttemptStatusRequest written;
  written.set_state(v1::RUNNER_STATE_SUCCEEDED);
  const absl::Status s = WriteFileAtomically(e.result_path, written.SerializeAsString());
  ASSERT_FALSE(s.ok());  // what the runner sees, and logs
  std::string warning;
  const v1::ReportAttemptStatusRequest r = RunnerOutcome(e, &warning);
  EXPECT_EQ(r.state(), v1::RUNNER_STATE_SUCCEEDED);
  EXPECT_EQ(r.exit_code(), 0);
  EXPECT_TRUE(r.final_metrics().empty());
  EXPECT_TRUE(absl::StrContains(warning, e.result_path)) << warning;
}

TEST(RunnerOutcomeTest, FailureKeepsTheRunnersErrorAndAddsTheLogTail) {
  const RunnerExit e = Exit(TempDir("failed"), W_EXITCODE(1, 0));
  v1::ReportAttemptStatusRequest written;
  written.set_state(v1::RUNNER_STATE_FAILED);
  written.set_error("data file not found");
  written.set_error_code(5);
  ASSERT_TRUE(WriteFileAtomically(e.result_path, written.SerializeAsString()).ok());
  std::string warning;
  const v1::ReportAttemptStatusRequest r = RunnerOutcome(e, &warning);
  EXPECT_EQ(r.state(), v1::RUNNER_STATE_FAILED);
  EXPECT_EQ(r.error(), "data file not found");
  EXPECT_EQ(r.error_code(), 5);
  EXPECT_EQ(r.exit_code(), 1);
  EXPECT_EQ(r.stderr_tail(), "step 1/2\nboom\n");
}

// A command's launcher names the failed process and its own last lines in its error: the tail of
// the whole log would repeat them among every other process's lines. Without a result (the
// launcher itself crashed), the tail is all there is.
TEST(RunnerOutcomeTest, ACommandLaunchersErrorCarriesItsOwnLinesAndNoLogTail) {
  const std::string dir = TempDir("command");
  RunnerExit e = Exit(dir, W_EXITCODE(3, 0));
  e.command = true;
  v1::ReportAttemptStatusRequest written;
  written.set_state(v1::RUNNER_STATE_FAILED);
  written.set_error("rank 1 on host b exited with status 3; its last lines:\nboom");
  ASSERT_TRUE(WriteFileAtomically(e.result_path, written.SerializeAsString()).ok());
  v1::ReportAttemptStatusRequest r = RunnerOutcome(e, nullptr);
  EXPECT_EQ(r.state(), v1::RUNNER_STATE_FAILED);
  EXPECT_EQ(r.exit_code(), 3);
  EXPECT_EQ(r.error(), written.error());
  EXPECT_EQ(r.stderr_tail(), "");
  std::filesystem::remove(e.result_path);
  r = RunnerOutcome(e, nullptr);
  EXPECT_EQ(r.error(), "the runner exited with status 3");
  EXPECT_EQ(r.stderr_tail(), "step 1/2\nboom\n");
}

TEST(RunnerOutcomeTest, KilledRunnerWithoutResultFailsNamingTheSignal) {
  RunnerExit e = Exit(TempDir("killed"), W_EXITCODE(0, SIGKILL));
  e.stop_requested = true;
  e.stop_reason = "cancelled by user";
  std::string warning;
  const v1::ReportAttemptStatusRequest r = RunnerOutcome(e, &warning);
  EXPECT_EQ(r.state(), v1::RUNNER_STATE_FAILED);
  EXPECT_EQ(r.exit_code(), 128 + SIGKILL);
  EXPECT_EQ(r.error(), "the runner was killed by signal 9 (stopped: cancelled by user)");
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

RunnerExit ProgramExit(const std::string& dir, int wait_status) {
  RunnerExit e = Exit(dir, wait_status);
  e.program = "/opt/p/train";
  e.started_path = dir + "/j-attempt-1-process-0.started";
  e.init_timeout = absl::Seconds(60);
  return e;
}

TEST(RunnerOutcomeTest, AProgramThatNeverCalledInitFailsSayingSoWhateverItsExitStatus) {
  for (const int status : {W_EXITCODE(0, 0), W_EXITCODE(3, 0), W_EXITCODE(0, SIGSEGV)}) {
    const RunnerExit e = ProgramExit(TempDir("no_init"), status);
    std::string warning;
    const v1::ReportAttemptStatusRequest r = RunnerOutcome(e, &warning);
    EXPECT_EQ(r.state(), v1::RUNNER_STATE_FAILED) << status;
    EXPECT_TRUE(absl::StrContains(r.error(), "the program /opt/p/train exited (")) << r.error();
    EXPECT_TRUE(absl::StrContains(r.error(), ") without calling substrax::Init; programs must join "
                                             "their job first: substrax::Init (docs/sdk.md)"))
        << r.error();
    EXPECT_TRUE(absl::StrContains(r.stderr_tail(), "boom"));
  }
  const v1::ReportAttemptStatusRequest three =
      RunnerOutcome(ProgramExit(TempDir("no_init_3"), W_EXITCODE(3, 0)), nullptr);
  EXPECT_TRUE(absl::StrContains(three.error(), "(exit status 3)")) << three.error();
  const v1::ReportAttemptStatusRequest segv =
      RunnerOutcome(ProgramExit(TempDir("no_init_segv"), W_EXITCODE(0, SIGSEGV)), nullptr);
  EXPECT_TRUE(absl::StrContains(segv.error(), "(killed by signal 11)")) << segv.error();
}

TEST(RunnerOutcomeTest, AProgramThatStartedIsJudgedLikeTheRunnerNamingTheProgram) {
  const std::string dir = TempDir("started");
  const RunnerExit e = ProgramExit(dir, W_EXITCODE(2, 0));
  std::ofstream(e.started_path) << "";
  const v1::ReportAttemptStatusRequest r = RunnerOutcome(e, nullptr);
  EXPECT_EQ(r.state(), v1::RUNNER_STATE_FAILED);
  EXPECT_EQ(r.error(), "the program /opt/p/train exited with status 2");
  EXPECT_EQ(r.exit_code(), 2);
  EXPECT_TRUE(absl::StrContains(r.stderr_tail(), "boom"));
  std::string warning;
  EXPECT_EQ(RunnerOutcome(ProgramExit(dir, W_EXITCODE(0, 0)), &warning).state(),
            v1::RUNNER_STATE_SUCCEEDED);
}

TEST(RunnerOutcomeTest, AProgramStoppedAtItsInitTimeoutFailsAsStalled) {
  RunnerExit e = ProgramExit(TempDir("init_timeout"), W_EXITCODE(0, SIGTERM));
  e.stop_requested = true;
  e.init_timed_out = true;
  e.init_timeout = absl::Seconds(2);
  const v1::ReportAttemptStatusRequest r = RunnerOutcome(e, nullptr);
  EXPECT_EQ(r.state(), v1::RUNNER_STATE_FAILED);
  EXPECT_EQ(r.error(), "the program /opt/p/train did not call substrax::Init within 2s "
                       "(--program-init-timeout): stalled");
  EXPECT_TRUE(absl::StrContains(r.stderr_tail(), "boom"));
}

}  // namespace
}  // namespace substrax
