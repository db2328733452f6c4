#include "worker/compute/init.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::Each;
using ::testing::Eq;
using ::testing::HasSubstr;

ParamSpec Kernel(std::string name, int64_t in, int64_t out) {
  return {std::move(name), {in, out}, PartitionSpec(), in, out};
}

ParamSpec Bias(std::string name, int64_t in, int64_t out) {
  return {std::move(name), {out}, PartitionSpec(), in, out};
}

TEST(InitTest, DeterministicForASeed) {
  const std::vector<ParamSpec> specs = {Kernel("dense_0/kernel", 6, 4), Bias("dense_0/bias", 6, 4)};
  EXPECT_EQ(InitParams(7, specs), InitParams(7, specs));
  EXPECT_EQ(InitParams(7, specs).size(), 2u);
}

TEST(InitTest, DifferentSeedsAndNamesGiveDifferentValues) {
  const ParamSpec k0 = Kernel("dense_0/kernel", 6, 4);
  const ParamSpec k1 = Kernel("dense_1/kernel", 6, 4);
  const Tensor a = InitParam(7, k0);
  const Tensor b = InitParam(8, k0);
  const Tensor c = InitParam(7, k1);
  int same_seed = 0, same_name = 0;
  for (int64_t i = 0; i < a.size(); ++i) {
    same_seed += a.data()[i] == b.data()[i];
    same_name += a.data()[i] == c.data()[i];
  }
  EXPECT_EQ(same_seed, 0);
  EXPECT_EQ(same_name, 0);
}

// The values are part of the contract: a checkpoint-free restart on another host, or a shard
// initialised on its own, must reproduce them bit for bit. A change here changes every job's
// initial parameters. The expected values come from a separate Python transcription of the
// scheme (SplitMix64 over seed, FNV-1a of the name and the index; 24 bits to [-limit, limit)).
TEST(InitTest, ValuesArePinned) {
  const ParamSpec k = Kernel("dense_0/kernel", 784, 512);
  EXPECT_EQ(InitValue(0, k, 0), 0x1.6a20ecp-6f);
  EXPECT_EQ(InitValue(0, k, 1), -0x1.12af9ep-4f);
  EXPECT_EQ(InitValue(42, k, 784 * 512 - 1), -0x1.2e7602p-9f);
}

TEST(InitTest, InitValueIsTheElementOfInitParam) {
  const ParamSpec k = Kernel("dense_2/kernel", 5, 3);
  const Tensor t = InitParam(11, k);
  for (int64_t i = 0; i < t.size(); ++i) EXPECT_EQ(InitValue(11, k, i), t.data()[i]) << i;
}

TEST(InitTest, SliceEqualsTheSliceOfTheWholeParameter) {
  const ParamSpec k = Kernel("dense_0/kernel", 7, 5);
  const Tensor whole = InitParam(3, k);
  const std::vector<std::vector<std::pair<int64_t, int64_t>>> blocks = {
      {{0, 7}, {0, 5}}, {{2, 6}, {1, 4}}, {{0, 7}, {3, 5}}, {{4, 5}, {0, 5}}, {{3, 3}, {0, 5}}};
  for (const auto& ranges : blocks) {
    auto slice = InitParamSlice(3, k, ranges);
    ASSERT_TRUE(slice.ok()) << slice.status();
    EXPECT_EQ(*slice, *whole.Slice(ranges));
  }
  // Rank 3 (sharding cuts any dimension), and a rank-1 bias.
  const ParamSpec cube{"conv/kernel", {3, 4, 5}, PartitionSpec(), 12, 5};
  const std::vector<std::pair<int64_t, int64_t>> ranges = {{1, 3}, {0, 4}, {2, 5}};
  EXPECT_EQ(*InitParamSlice(5, cube, ranges), *InitParam(5, cube).Slice(ranges));
  const ParamSpec b = Bias("dense_0/bias", 7, 5);
  EXPECT_EQ(*InitParamSlice(5, b, {{1, 4}}), *InitParam(5, b).Slice({{1, 4}}));
}

TEST(InitTest, SliceErrorsNameTheParameter) {
  const ParamSpec k = Kernel("dense_0/kernel", 7, 5);
  auto wrong_rank = InitParamSlice(1, k, {{0, 7}});
  EXPECT_EQ(wrong_rank.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_rank.status().message(), HasSubstr("dense_0/kernel"));
  auto out_of_range = InitParamSlice(1, k, {{0, 7}, {2, 6}});
  EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(out_of_range.status().message(), HasSubstr("dense_0/kernel"));
  EXPECT_FALSE(InitParamSlice(1, k, {{3, 2}, {0, 5}}).ok());
  EXPECT_FALSE(InitParamSlice(1, k, {{-1, 2}, {0, 5}}).ok());
}

TEST(InitTest, KernelsAreGlorotUniform) {
  const ParamSpec k = Kernel("dense_0/kernel", 300, 100);
  const Tensor t = InitParam(1, k);
  const double limit = std::sqrt(6.0 / 400.0);
  double sum = 0, sum_sq = 0, max_abs = 0;
  for (float v : t.span()) {
    EXPECT_LE(std::abs(v), static_cast<float>(limit));
    sum += v;
    sum_sq += static_cast<double>(v) * v;
    max_abs = std::max(max_abs, static_cast<double>(std::abs(v)));
  }
  const double n = static_cast<double>(t.size());
  // 30000 draws of U(-limit, limit): mean 0 (standard error limit/300), variance limit^2/3
  // (standard error about 0.5%); the bounds are many standard errors wide.
  EXPECT_LT(std::abs(sum / n), 0.02 * limit);
  EXPECT_NEAR(sum_sq / n, limit * limit / 3, 0.05 * limit * limit / 3);
  EXPECT_GT(max_abs, 0.99 * limit);
}

TEST(InitTest, FansComeFromTheShapeWhenUnset) {
  const ParamSpec k{"dense_0/kernel", {10, 14}, PartitionSpec(), 0, 0};
  const float limit = static_cast<float>(std::sqrt(6.0 / 24.0));
  const Tensor t = InitParam(2, k);
  float max_abs = 0;
  for (float v : t.span()) max_abs = std::max(max_abs, std::abs(v));
  EXPECT_LE(max_abs, limit);
  EXPECT_GT(max_abs, 0.8f * limit);
}

TEST(InitTest, BiasesAreZero) {
  const Tensor b = InitParam(9, Bias("dense_3/bias", 20, 64));
  EXPECT_EQ(b.shape(), (std::vector<int64_t>{64}));
  EXPECT_THAT(b.span(), Each(Eq(0.0f)));
}

}  // namespace
}  // namespace substrax
