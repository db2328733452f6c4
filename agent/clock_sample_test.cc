#include "agent/clock_sample.h"

#include "gtest/gtest.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

TEST(ClockSampleTest, TheOffsetIsTheAgentsMiddleAgainstTheCoordinatorsTime) {
  const absl::Time t0 = absl::FromUnixSeconds(1796579000);
  // Sent at t0, answered 20 ms later; the coordinator's clock said t0 - 3 s + 10 ms: the agent
  // is 3 s ahead.
  const v1::ClockSample s =
      MeasureClock(t0, t0 + absl::Milliseconds(20), t0 - absl::Seconds(3) + absl::Milliseconds(10));
  EXPECT_EQ(FromProtoDuration(s.offset()), absl::Seconds(3));
  EXPECT_EQ(FromProtoDuration(s.round_trip()), absl::Milliseconds(20));
  // Behind: negative.
  EXPECT_EQ(FromProtoDuration(MeasureClock(t0, t0, t0 + absl::Minutes(2)).offset()),
            -absl::Minutes(2));
}

}  // namespace
}  // namespace substrax
