// Waiting in tests: for a condition or a child process, until a deadline (never forever, never a
// fixed sleep that hopes).
#ifndef SUBSTRAX_TESTS_TESTING_POLL_H_
#define SUBSTRAX_TESTS_TESTING_POLL_H_

#include <sys/types.h>

#include <optional>
#include <string_view>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace substrax::testing {

// Polls `condition` every 10 ms until it holds (success) or `deadline` passes (a failure saying
// "timed out waiting for <what>"), e.g.
//   ASSERT_TRUE(PollUntil([&] { return !IsAlive(p); }, absl::Now() + absl::Seconds(5),
//                         "the coordinator to exit"));
template <typename Condition>
::testing::AssertionResult PollUntil(Condition condition, absl::Time deadline,
                                     std::string_view what) {
  while (true) {
    if (condition()) return ::testing::AssertionSuccess();
    if (absl::Now() >= deadline) {
      return ::testing::AssertionFailure() << "timed out waiting for " << what;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
}

// Waits for child `pid` until `deadline`: its exit status (0-255, or 128 + the signal that
// ended it); nothing if it still ran at the deadline (it is then SIGKILLed and reaped).
std::optional<int> WaitOrKill(pid_t pid, absl::Time deadline);

}  // namespace substrax::testing

#endif  // SUBSTRAX_TESTS_TESTING_POLL_H_
