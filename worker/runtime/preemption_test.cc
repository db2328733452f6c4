#include "worker/runtime/preemption.h"

#include <signal.h>

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
