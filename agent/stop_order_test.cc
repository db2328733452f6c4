#include "agent/stop_order.h"

#include "gtest/gtest.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

v1::StopAttempt Stop(const std::string& reason, bool preempt, absl::Duration grace) {
  v1::StopAttempt stop;
  stop.set_job_id("train-1");
  stop.set_attempt(1);
  stop.set_reason(reason);
  stop.set_preempt(preempt);
  if (grace > absl::ZeroDuration()) *stop.mutable_grace() = ToProtoDuration(grace);
  return stop;
}

TEST(StopOrderTest, APreemptionGetsTheLongerGraceAndSaysSo) {
  const StopOrder longer = StopOrderOf(
      Stop("job big-7 of priority high needs its devices", true, absl::Seconds(120)),
      absl::Seconds(10));
  EXPECT_TRUE(longer.preempt);
  EXPECT_EQ(longer.grace, absl::Seconds(120));
  EXPECT_EQ(longer.reason, "preempted: job big-7 of priority high needs its devices");
  EXPECT_EQ(StopLogLine(longer),
            "preempted: job big-7 of priority high needs its devices; SIGTERM, SIGKILL after "
            "2m");

  // The agent's --stop-grace is the floor; a preemption without a grace gets it too.
  EXPECT_EQ(StopOrderOf(Stop("r", true, absl::Seconds(5)), absl::Seconds(30)).grace,
            absl::Seconds(30));
  const StopOrder no_grace =
      StopOrderOf(Stop("r", true, absl::ZeroDuration()), absl::Seconds(30), "the coordinator "
                                                                             "says: ");
  EXPECT_EQ(no_grace.grace, absl::Seconds(30));
  EXPECT_EQ(StopLogLine(no_grace), "preempted: the coordinator says: r; SIGTERM, SIGKILL after 30s");
}

TEST(StopOrderTest, OtherStopsKeepTheAgentsGraceAndAddNoLogLine) {
  // A grace on a stop that is not a preemption is not the agent's to honour.
  const StopOrder cancel =
      StopOrderOf(Stop("cancelled by user", false, absl::Seconds(120)), absl::Seconds(10));
  EXPECT_FALSE(cancel.preempt);
  EXPECT_EQ(cancel.grace, absl::Seconds(10));
  EXPECT_EQ(cancel.reason, "cancelled by user");
  EXPECT_EQ(StopLogLine(cancel), "");
}

}  // namespace
}  // namespace substrax
