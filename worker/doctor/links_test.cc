#include "worker/doctor/links.h"

#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace substrax::doctor {
namespace {

TEST(DoctorLinksTest, TheScheduleMeetsEveryPairOnceWithOnePartnerPerRound) {
  for (int n = 2; n <= 9; ++n) {
    std::set<std::pair<int, int>> met;
    for (int round = 0; round < Rounds(n); ++round) {
      for (int p = 0; p < n; ++p) {
        const int q = PartnerInRound(p, n, round);
        if (q < 0) continue;
        ASSERT_NE(q, p) << n << " " << round;
        ASSERT_EQ(PartnerInRound(q, n, round), p) << "n " << n << " round " << round;
        met.insert({std::min(p, q), std::max(p, q)});
      }
    }
    EXPECT_EQ(met.size(), static_cast<size_t>(n * (n - 1) / 2)) << n;
  }
}

TEST(DoctorLinksTest, BeyondAllPairsTheRingIsMeasuredWithOnePartnerPerRound) {
  for (int n : {2, 3, 8, 9, 10, 11, 256}) {
    std::set<std::pair<int, int>> met;
    for (const auto& round : LinkRounds(n)) {
      std::set<int> busy;
      for (const auto& [a, b] : round) {
        ASSERT_LT(a, b);
        ASSERT_TRUE(busy.insert(a).second) << n;
        ASSERT_TRUE(busy.insert(b).second) << n;
        met.insert({a, b});
      }
    }
    if (n <= kAllPairsUpTo) {
      EXPECT_EQ(met.size(), static_cast<size_t>(n * (n - 1) / 2)) << n;
    } else {
      EXPECT_LE(LinkRounds(n).size(), 3u);
      EXPECT_EQ(met.size(), static_cast<size_t>(n)) << n;
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(met.count({std::min(i, (i + 1) % n), std::max(i, (i + 1) % n)}), 1u) << i;
      }
    }
  }
}

TEST(DoctorLinksTest, ThreeProcessesMeasureEveryLink) {
  InMemoryStore store;
  LinkOptions options;
  options.latency_rounds = 5;
  options.bandwidth_floats = 1 << 16;
  options.bandwidth_rounds = 2;
  std::vector<std::vector<Link>> links(3);
  std::vector<std::thread> threads;
  for (int p = 0; p < 3; ++p) {
    threads.emplace_back([&, p] { links[p] = MeasureLinks(p, 3, &store, options); });
  }
  for (std::thread& t : threads) t.join();
  for (int p = 0; p < 3; ++p) {
    ASSERT_EQ(links[p].size(), 2u) << p;
    for (const Link& l : links[p]) {
      EXPECT_EQ(l.error, "") << p << " -> " << l.peer;
      EXPECT_GT(l.latency, absl::ZeroDuration());
      EXPECT_GT(l.bytes_per_second, 0);
    }
  }
}

}  // namespace
}  // namespace substrax::doctor
