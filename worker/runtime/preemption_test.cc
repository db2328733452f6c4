#include "worker/runtime/preemption.h"

#include <signal.h>
#include <unistd.h>

#include "contract/stop_signal.h"
#include "core/status.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

TEST(PreemptionTest, TheFirstSigtermSetsTheFlagInsteadOfEndingTheProcess) {
  SetSigtermReceivedForTest(false);
  InstallSigtermFlag();
  EXPECT_FALSE(SigtermReceived());
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_TRUE(SigtermReceived());
  // The handler gave the default action back: a second SIGTERM would end the process.
  struct sigaction now = {};
  ASSERT_EQ(sigaction(SIGTERM, nullptr, &now), 0);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  SetSigtermReceivedForTest(false);
}

// A fence's SIGTERM (the supervisor's, queued with its value) ends the process at once.
TEST(PreemptionDeathTest, AFencesSigtermEndsTheProcess) {
  EXPECT_EXIT(
      {
        InstallSigtermFlag();
        sigval fence{};
        fence.sival_int = kFenceSigtermValue;
        sigqueue(getpid(), SIGTERM, fence);
        _exit(0);  // reached only when the fence was taken for a stop request
      },
      ::testing::KilledBySignal(SIGTERM), "");
  // A plain one only sets the flag.
  EXPECT_EXIT(
      {
        InstallSigtermFlag();
        raise(SIGTERM);
        _exit(SigtermReceived() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(PreemptionTest, TheStatusSaysTheStepAndSurvivesAnnotation) {
  const absl::Status written = StoppedBySigterm(40, true);
  EXPECT_TRUE(absl::IsAborted(written));
  EXPECT_EQ(written.message(),
            "stopped after step 40 by SIGTERM (preempted); checkpoint of step 40 written");
  EXPECT_TRUE(IsStoppedBySigterm(Annotate(written, "device 1, process 0")));
  EXPECT_EQ(StoppedBySigterm(7, false).message(),
            "stopped after step 7 by SIGTERM (preempted); no checkpoint: the spec has none");
  EXPECT_FALSE(IsStoppedBySigterm(absl::AbortedError("stopped after step 7")));
}

}  // namespace
}  // namespace substrax
