// A one-shot flag that threads wait on with a timeout measured on the monotonic clock. Unlike
// absl::Notification, whose timeouts become deadlines on the wall clock, a wall clock stepped
// back (by NTP, or an operator) or faked ahead (libfaketime, as `substraxctl doctor`'s test does
// to an agent) does not stretch the wait: a daemon's heartbeat keeps its interval whatever the
// host's time says. Thread-safe.
#ifndef SUBSTRAX_BASE_STOP_FLAG_H_
#define SUBSTRAX_BASE_STOP_FLAG_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"

namespace substrax {

class StopFlag {
 public:
  // Sets the flag and wakes every waiter. Idempotent.
  void Notify() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      notified_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }
  bool HasBeenNotified() const { return notified_.load(std::memory_order_acquire); }
  // True once notified; false when `timeout` passed first (on std::chrono::steady_clock).
  bool WaitForNotificationWithTimeout(absl::Duration timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, absl::ToChronoNanoseconds(std::max(timeout, absl::ZeroDuration())),
                        [this] { return HasBeenNotified(); });
  }
  void WaitForNotification() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return HasBeenNotified(); });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::atomic<bool> notified_{false};
};

}  // namespace substrax

#endif  // SUBSTRAX_BASE_STOP_FLAG_H_
