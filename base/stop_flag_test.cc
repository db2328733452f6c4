#include "base/stop_flag.h"

#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

TEST(StopFlagTest, ATimeoutEndsTheWaitAndANotifyWakesIt) {
  StopFlag flag;
  EXPECT_FALSE(flag.HasBeenNotified());
  EXPECT_FALSE(flag.WaitForNotificationWithTimeout(absl::Milliseconds(20)));
  EXPECT_FALSE(flag.WaitForNotificationWithTimeout(-absl::Seconds(1)));
  std::thread notifier([&] { flag.Notify(); });
  // Far longer than the notifier takes: returns as soon as it notifies.
  EXPECT_TRUE(flag.WaitForNotificationWithTimeout(absl::Minutes(5)));
  notifier.join();
  EXPECT_TRUE(flag.HasBeenNotified());
  flag.WaitForNotification();
  flag.Notify();  // idempotent
  EXPECT_TRUE(flag.WaitForNotificationWithTimeout(absl::ZeroDuration()));
}

}  // namespace
}  // namespace substrax
