#include "worker/data/prefetch.h"

#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

// Bounds every wait: a hang fails the test instead of running into Bazel's timeout. Nothing
// sleeps; a correct prefetcher ends each wait at once.
constexpr absl::Duration kDeadline = absl::Seconds(30);

// Counts producer calls, and lets the test wait for a count.
class CallCounter {
 public:
  // Records a call; returns how many calls came before it.
  int Enter() {
    absl::MutexLock lock(&mu_);
    return calls_++;
  }
  int calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // Waits until at least `n` calls were made; false at the deadline.
  bool AwaitCalls(int n) {
    absl::MutexLock lock(&mu_);
    auto reached = [this, n]() {
      mu_.AssertReaderHeld();
      return calls_ >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&reached), kDeadline);
  }

 private:
  absl::Mutex mu_;
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

// 0, 1, ..., count - 1, then the end.
Producer<int> CountTo(int count, CallCounter* counter) {
  return [count, counter]() -> absl::StatusOr<std::optional<int>> {
    const int i = counter->Enter();
    if (i < count) return i;
    return std::nullopt;
  };
}

// Next() reports the end of the stream, and does so again when asked again.
template <typename T>
void ExpectEnded(Prefetcher<T>& prefetcher) {
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::optional<T>> end = prefetcher.Next();
    ASSERT_TRUE(end.ok()) << end.status();
    EXPECT_FALSE(end->has_value());
  }
}

// Destroys `prefetcher` on another thread and runs `meanwhile` while it does; false if the
// destruction took longer than the deadline.
template <typename T>
bool DestroyWithinDeadline(
    std::unique_ptr<Prefetcher<T>> prefetcher,
    const std::function<void(const absl::Notification& done)>& meanwhile = {}) {
  auto done = std::make_shared<absl::Notification>();
  std::thread destroyer([p = std::move(prefetcher), done]() mutable {
    p.reset();
    done->Notify();
  });
  if (meanwhile) meanwhile(*done);
  if (done->WaitForNotificationWithTimeout(kDeadline)) {
    destroyer.join();
    return true;
  }
  destroyer.detach();  // hung: report it rather than hang the test binary
  return false;
}

TEST(PrefetchTest, PreservesOrderThenEnds) {
  CallCounter counter;
  absl::StatusOr<std::unique_ptr<Prefetcher<int>>> prefetcher =
      PrefetchToDevice(CountTo(100, &counter), 3);
  ASSERT_TRUE(prefetcher.ok()) << prefetcher.status();
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::optional<int>> item = (*prefetcher)->Next();
    ASSERT_TRUE(item.ok()) << item.status();
    ASSERT_EQ(item->value_or(-1), i);
  }
  ExpectEnded(**prefetcher);
  EXPECT_EQ(counter.calls(), 101);  // never called after the end
}

TEST(PrefetchTest, PassesTheErrorOnOnceAfterTheItemsBeforeIt) {
  CallCounter counter;
  auto prefetcher = PrefetchToDevice<int>([&counter]() -> absl::StatusOr<std::optional<int>> {
    const int i = counter.Enter();
    if (i < 2) return i;
    return absl::DataLossError("shard 3: checksum mismatch");
  });
  ASSERT_TRUE(prefetcher.ok()) << prefetcher.status();
  EXPECT_EQ(*(*prefetcher)->Next(), std::optional<int>(0));
  EXPECT_EQ(*(*prefetcher)->Next(), std::optional<int>(1));
  absl::StatusOr<std::optional<int>> error = (*prefetcher)->Next();
  EXPECT_EQ(error.status(), absl::DataLossError("shard 3: checksum mismatch"));
  ExpectEnded(**prefetcher);
  EXPECT_EQ(counter.calls(), 3);
}

TEST(PrefetchTest, RejectsSizesBelowOneAndAMissingProducer) {
  CallCounter counter;
  for (int size : {0, -1}) {
    absl::StatusOr<std::unique_ptr<Prefetcher<int>>> prefetcher =
        PrefetchToDevice(CountTo(1, &counter), size);
    EXPECT_EQ(prefetcher.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(prefetcher.status().message(), ::testing::HasSubstr(">= 1"));
  }
  EXPECT_EQ(Prefetcher<int>::Create(Producer<int>(), 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(counter.calls(), 0);
}

TEST(PrefetchTest, MoveOnlyItems) {
  int next = 0;
  auto prefetcher = PrefetchToDevice<std::unique_ptr<int>>(
      [&next]() -> absl::StatusOr<std::optional<std::unique_ptr<int>>> {
        if (next == 3) return std::nullopt;
        return std::make_unique<int>(next++);
      },
      1);
  ASSERT_TRUE(prefetcher.ok()) << prefetcher.status();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::optional<std::unique_ptr<int>>> item = (*prefetcher)->Next();
    ASSERT_TRUE(item.ok() && item->has_value());
    EXPECT_EQ(***item, i);
  }
  ExpectEnded(**prefetcher);
}

// A slow consumer: before each Next() it waits until the prefetcher has filled up, so a
// prefetcher that ran further ahead than `size` would be caught by the producer's check.
TEST(PrefetchTest, SlowConsumerKeepsAtMostSizeItemsAhead) {
  constexpr int kSize = 3;
  struct State {
    absl::Mutex mu;
    int started ABSL_GUARDED_BY(mu) = 0;  // Next() calls begun (counted before each call)
    int produced ABSL_GUARDED_BY(mu) = 0;
    int too_far_ahead ABSL_GUARDED_BY(mu) = 0;
  } s;
  auto prefetcher = PrefetchToDevice<int>(
      [&s]() -> absl::StatusOr<std::optional<int>> {
        absl::MutexLock lock(&s.mu);
        // Items produced but not yet taken, counting this one, may not exceed kSize.
        if (s.produced + 1 - s.started > kSize) ++s.too_far_ahead;
        return s.produced++;
      },
      kSize);
  ASSERT_TRUE(prefetcher.ok()) << prefetcher.status();
  for (int i = 0; i < 20; ++i) {
    {
      absl::MutexLock lock(&s.mu);
      auto full = [&s]() {
        s.mu.AssertReaderHeld();
        return s.produced >= s.started + kSize;
      };
      ASSERT_TRUE(s.mu.AwaitWithTimeout(absl::Condition(&full), kDeadline))
          << "the prefetcher did not fill up to " << kSize << " items";
      EXPECT_EQ(s.produced, s.started + kSize);
      ++s.started;
    }
    EXPECT_EQ(*(*prefetcher)->Next(), std::optional<int>(i));
  }
  prefetcher->reset();
  absl::MutexLock lock(&s.mu);
  EXPECT_EQ(s.too_far_ahead, 0);
  EXPECT_LE(s.produced, s.started + kSize);
}

TEST(PrefetchTest, DestroyingItWhileTheQueueIsFullReturnsPromptly) {
  CallCounter counter;
  auto prefetcher = PrefetchToDevice(CountTo(1000000, &counter), 2);
  ASSERT_TRUE(prefetcher.ok()) << prefetcher.status();
  ASSERT_TRUE(counter.AwaitCalls(2));  // the queue is full; the thread waits for room
  EXPECT_TRUE(DestroyWithinDeadline(std::move(*prefetcher)));
  EXPECT_LE(counter.calls(), 3);
}

TEST(PrefetchTest, DestroyingItDuringAProducerCallWaitsForThatCallOnly) {
  CallCounter counter;
  absl::Notification second_call_entered, release;
  auto prefetcher = PrefetchToDevice<int>([&]() -> absl::StatusOr<std::optional<int>> {
    const int i = counter.Enter();
    if (i == 1) {
      second_call_entered.Notify();
      release.WaitForNotificationWithTimeout(kDeadline);
    }
    return i;
  });
  ASSERT_TRUE(prefetcher.ok()) << prefetcher.status();
  ASSERT_TRUE(second_call_entered.WaitForNotificationWithTimeout(kDeadline));
  // The consumer stops early, with the producer busy: the destructor waits for that call.
  EXPECT_TRUE(DestroyWithinDeadline(std::move(*prefetcher), [&](const absl::Notification& done) {
    EXPECT_FALSE(done.HasBeenNotified());
    release.Notify();
  }));
  EXPECT_EQ(counter.calls(), 2);  // not called again after it stopped
}

}  // namespace
}  // namespace substrax
