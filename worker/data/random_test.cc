#include "worker/data/random.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;

// The published reference outputs pin the algorithms, so the data order cannot drift with a
// compiler or platform.
TEST(RandomTest, SplitMix64MatchesTheReference) {
  uint64_t state = 0;
  std::vector<uint64_t> out;
  for (int i = 0; i < 3; ++i) out.push_back(SplitMix64(state));
  EXPECT_THAT(out,
              ElementsAre(0xE220A8397B1DCDAFULL, 0x6E789E6AA1B965F4ULL, 0x06C45D188009454FULL));
}

TEST(RandomTest, Xoshiro256StarStarMatchesTheReference) {
  Rng rng = Rng::FromState(1, 2, 3, 4);
  std::vector<uint64_t> out;
  for (int i = 0; i < 6; ++i) out.push_back(rng.Next());
  EXPECT_THAT(out, ElementsAre(11520ULL, 0ULL, 1509978240ULL, 1215971899390074240ULL,
                               1216172134540287360ULL, 607988272756665600ULL));
}

TEST(RandomTest, StreamsAreDeterministicAndIndependent) {
  auto first = [](Rng rng) { return rng.Next(); };
  EXPECT_EQ(first(Rng(7, RngStream::kShuffle, 3)), first(Rng(7, RngStream::kShuffle, 3)));
  EXPECT_NE(first(Rng(7, RngStream::kShuffle, 3)), first(Rng(7, RngStream::kShuffle, 4)));
  EXPECT_NE(first(Rng(7, RngStream::kShuffle, 0)), first(Rng(7, RngStream::kSyntheticModel, 0)));
  EXPECT_NE(first(Rng(7, RngStream::kSyntheticTrain)), first(Rng(8, RngStream::kSyntheticTrain)));
}

TEST(RandomTest, UniformIntCoversTheRangeEvenly) {
  Rng rng(1, RngStream::kShuffle);
  std::vector<int> counts(7, 0);
  constexpr int kDraws = 70000;
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t x = rng.UniformInt(7);
    ASSERT_LT(x, 7u);
    ++counts[x];
  }
  for (int c : counts) EXPECT_NEAR(c, kDraws / 7, 400);  // about 4 standard deviations
  EXPECT_EQ(rng.UniformInt(1), 0u);
}

TEST(RandomTest, UniformAndNormalHaveTheirMoments) {
  Rng rng(2, RngStream::kSyntheticTrain);
  constexpr int kDraws = 200000;
  double sum = 0, sum_sq = 0, uniform_sum = 0;
  for (int i = 0; i < kDraws; ++i) {
    const double u = rng.Uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    uniform_sum += u;
    const double z = rng.Normal();
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(uniform_sum / kDraws, 0.5, 0.005);
  EXPECT_NEAR(sum / kDraws, 0.0, 0.01);
  EXPECT_NEAR(std::sqrt(sum_sq / kDraws), 1.0, 0.01);
}

}  // namespace
}  // namespace substrax
