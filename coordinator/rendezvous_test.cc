#include "coordinator/rendezvous.h"

#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "coordinator/limits.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

const Rendezvous::Scope kA = {"job-1", 1};
const Rendezvous::Scope kB = {"job-1", 2};

TEST(RendezvousTest, KeysAreScopedPerAttempt) {
  Rendezvous r;
  ASSERT_TRUE(r.Set(kA, "id", "x", false).ok());
  EXPECT_EQ(*r.Get(kA, "id", absl::ZeroDuration()), "x");
  EXPECT_EQ(r.Get(kB, "id", absl::ZeroDuration()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(r.Set(kA, "id", "y", false).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(r.Set(kA, "id", "y", true).ok());
  EXPECT_EQ(*r.Get(kA, "id", absl::ZeroDuration()), "y");
  auto late = r.Get(kA, "never", absl::Milliseconds(10));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("'never' of job job-1 attempt 1"));
}

TEST(RendezvousTest, GetWaitsForSet) {
  Rendezvous r;
  std::thread setter([&] { ASSERT_TRUE(r.Set(kA, "k", "v", false).ok()); });
  auto v = r.Get(kA, "k", absl::Seconds(30));
  setter.join();
  EXPECT_EQ(*v, "v");
}

TEST(RendezvousTest, BarrierReleasesEveryoneAndNamesTheMissing) {
  Rendezvous r;
  std::vector<std::thread> threads;
  for (int p = 0; p < 3; ++p) {
    threads.emplace_back([&, p] { EXPECT_TRUE(r.Barrier(kA, "start", p, 3, absl::Seconds(30)).ok()); });
  }
  for (auto& t : threads) t.join();
  absl::Status s = r.Barrier(kA, "end", 0, 3, absl::Milliseconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("participants 1, 2 did not arrive"));
  EXPECT_EQ(r.Barrier(kA, "end", 1, 4, absl::Milliseconds(10)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Barrier(kA, "x", 5, 3, absl::Milliseconds(10)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(RendezvousTest, ClosingAScopeFailsWaitersAndLaterCalls) {
  Rendezvous r;
  // Whether the close lands before or during the wait, the waiter fails the same way.
  std::thread closer([&] { r.CloseScope(kA); });
  auto waited = r.Get(kA, "k", absl::Seconds(30));
  closer.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.Set(kA, "k", "v", false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(r.Set(kB, "k", "v", false).ok());
}

TEST(RendezvousTest, AWaitEndsWhenTheCallerGoesAway) {
  Rendezvous r;
  std::atomic<bool> gone{false};
  std::thread leaver([&] { gone = true; });
  // A 10-minute wait that returns as soon as the caller is gone (checked every 250 ms).
  auto waited = r.Get(kA, "never", absl::Minutes(10), [&] { return gone.load(); });
  leaver.join();
  EXPECT_EQ(waited.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(r.Barrier(kA, "b", 0, 2, absl::Minutes(10), [&] { return gone.load(); }).code(),
            absl::StatusCode::kCancelled);
}

TEST(RendezvousTest, KeysAndValuesAreBounded) {
  Rendezvous r;
  EXPECT_EQ(r.Set(kA, std::string(limits::kMaxKeyBytes + 1, 'k'), "v", false).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.Set(kA, "k", std::string(limits::kMaxValueBytes + 1, 'v'), false).code(),
            absl::StatusCode::kInvalidArgument);
  for (int i = 0; i < limits::kMaxKeysPerAttempt; ++i) {
    ASSERT_TRUE(r.Set(kA, std::to_string(i), "v", false).ok()) << i;
  }
  absl::Status full = r.Set(kA, "one-more", "v", false);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("the limit per attempt"));
  EXPECT_TRUE(r.Set(kA, "0", "overwritten", true).ok());  // an existing key may still change
  EXPECT_TRUE(r.Set(kB, "k", "v", false).ok());           // other attempts are not affected
}

TEST(RendezvousTest, BytesAreBoundedPerAttemptAndOverall) {
  Rendezvous::Options options;
  options.max_bytes_per_attempt = 200;
  options.max_bytes = 300;
  Rendezvous r(options);
  const Rendezvous::Scope kC = {"job-2", 1};
  // Each key costs its bytes and 64 more.
  ASSERT_TRUE(r.Set(kA, "a", std::string(99, 'v'), false).ok());  // 164
  absl::Status attempt_full = r.Set(kA, "b", std::string(10, 'v'), false);
  EXPECT_EQ(attempt_full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(attempt_full.message()), HasSubstr("limit per attempt of 200"));
  // An overwrite counts what it replaces.
  EXPECT_TRUE(r.Set(kA, "a", std::string(135, 'v'), true).ok());  // 200
  ASSERT_TRUE(r.Set(kB, "a", std::string(35, 'v'), false).ok());  // 300 in all
  // Empty keys and values are not free.
  absl::Status all_full = r.Set(kC, "", "", false);
  EXPECT_EQ(all_full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(all_full.message()), HasSubstr("over all attempts, its limit of 300"));
  // An attempt that ends gives its bytes back.
  r.CloseScope(kA);
  EXPECT_TRUE(r.Set(kC, "a", std::string(99, 'v'), false).ok());
}

TEST(RendezvousTest, AHugeBarrierIsRefusedAndAMissingListStaysShort) {
  Rendezvous r;
  absl::Status huge = r.Barrier(kA, "b", 0, 2000000000, absl::Milliseconds(10));
  EXPECT_EQ(huge.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.message()),
              HasSubstr(absl::StrCat("limit of ", limits::kMaxBarrierParticipants)));
  // At the limit: the timeout names the first missing and their count, not all of them.
  absl::Status late =
      r.Barrier(kA, "b", 0, limits::kMaxBarrierParticipants, absl::Milliseconds(10));
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(late.message()), HasSubstr("(65535 in all)"));
  EXPECT_LT(late.message().size(), 300u);
}

TEST(RendezvousTest, BarriersPerAttemptAreBounded) {
  Rendezvous r;
  for (int i = 0; i < limits::kMaxBarriersPerAttempt; ++i) {
    // Participant 0 of 1: each barrier releases at once.
    ASSERT_TRUE(r.Barrier(kA, std::to_string(i), 0, 1, absl::Seconds(10)).ok()) << i;
  }
  absl::Status full = r.Barrier(kA, "one-more", 0, 1, absl::Seconds(10));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(full.message()), HasSubstr("barriers, the limit per attempt"));
  EXPECT_TRUE(r.Barrier(kB, "one-more", 0, 1, absl::Seconds(10)).ok());
}

}  // namespace
}  // namespace substrax
