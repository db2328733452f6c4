// Backoff: the delays of one retry loop, exponential with jitter and an optional deadline. Every
// retry loop of substrax draws its delays here; the loop itself says which errors it retries and
// why (STYLE.md: "retry on purpose").
//
//   Backoff backoff({.initial = absl::Milliseconds(100), .max = absl::Seconds(5)});
//   while (true) {
//     status = Call();
//     if (status.ok() || !Retryable(status)) break;
//     std::optional<absl::Duration> wait = backoff.Next();
//     if (!wait) break;  // past the deadline
//     stop.WaitForNotificationWithTimeout(*wait);
//   }
//
// Not thread-safe: one Backoff per loop.
#ifndef SUBSTRAX_BASE_BACKOFF_H_
#define SUBSTRAX_BASE_BACKOFF_H_

#include <optional>

#include "absl/random/random.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace substrax {

struct BackoffOptions {
  // The first delay, doubled after every try up to `max`.
  absl::Duration initial = absl::Milliseconds(100);
  absl::Duration max = absl::Seconds(5);
  // Each delay is drawn uniformly from [delay * (1 - jitter), delay * (1 + jitter)], so that many
  // clients that failed together do not retry together. 0: no jitter.
  double jitter = 0.5;
  // How long the loop may go on, from the Backoff's construction; infinite: no deadline.
  absl::Duration give_up_after = absl::InfiniteDuration();
};

class Backoff {
 public:
  explicit Backoff(BackoffOptions options = {}, absl::Time now = absl::Now())
      : options_(options), next_(options.initial), deadline_(now + options.give_up_after) {}

  // The delay before the next try, or nullopt when waiting it would pass the deadline.
  std::optional<absl::Duration> Next(absl::Time now = absl::Now()) {
    absl::Duration delay = next_;
    if (options_.jitter > 0) {
      delay = delay * absl::Uniform(gen_, 1.0 - options_.jitter, 1.0 + options_.jitter);
    }
    if (now + delay > deadline_) return std::nullopt;
    next_ = std::min(next_ * 2, options_.max);
    return delay;
  }

  // Starts over from `initial` (after a success, in a loop that goes on).
  void Reset() { next_ = options_.initial; }

  // The delay Next would draw from, before jitter.
  absl::Duration current() const { return next_; }

 private:
  BackoffOptions options_;
  absl::Duration next_;
  absl::Time deadline_;
  absl::BitGen gen_;
};

}  // namespace substrax

#endif  // SUBSTRAX_BASE_BACKOFF_H_
