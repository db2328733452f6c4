#include "base/backoff.h"

#include "gtest/gtest.h"

namespace substrax {
namespace {

TEST(BackoffTest, DoublesUpToTheMaximumWithoutJitter) {
  Backoff backoff({.initial = absl::Milliseconds(10), .max = absl::Milliseconds(35),
                   .jitter = 0});
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(10));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(20));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(35));
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(35));
  backoff.Reset();
  EXPECT_EQ(backoff.Next(), absl::Milliseconds(10));
}

TEST(BackoffTest, JitterStaysWithinItsBand) {
  Backoff backoff({.initial = absl::Seconds(1), .max = absl::Seconds(1), .jitter = 0.5});
  for (int i = 0; i < 1000; ++i) {
    const std::optional<absl::Duration> delay = backoff.Next();
    ASSERT_TRUE(delay.has_value());
    EXPECT_GE(*delay, absl::Milliseconds(500));
    EXPECT_LE(*delay, absl::Milliseconds(1500));
  }
}

TEST(BackoffTest, GivesUpWhenTheNextWaitWouldPassTheDeadline) {
  const absl::Time start = absl::FromUnixSeconds(1000);
  Backoff backoff({.initial = absl::Seconds(1), .max = absl::Seconds(4), .jitter = 0,
                   .give_up_after = absl::Seconds(5)},
                  start);
  EXPECT_EQ(backoff.Next(start), absl::Seconds(1));
  EXPECT_EQ(backoff.Next(start + absl::Seconds(1)), absl::Seconds(2));
  // 3 s in, a wait of 4 s would end at 7 s, past the deadline of 5 s.
  EXPECT_EQ(backoff.Next(start + absl::Seconds(3)), std::nullopt);
}

}  // namespace
}  // namespace substrax
