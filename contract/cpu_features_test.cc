#include "contract/cpu_features.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

// The machines this project builds and tests on (and CI) are x86-64-v3.
TEST(CpuFeaturesTest, ThisHostRunsTheKernels) {
  EXPECT_TRUE(CheckCpuKernels().ok()) << CheckCpuKernels();
  EXPECT_TRUE(absl::StrContains(CpuKernelsTarget(), "avx2")) << CpuKernelsTarget();
}

TEST(CpuFeaturesTest, AnOlderCpuIsToldWhatItLacks) {
  const absl::Status status = CheckCpuKernels(
      {{"avx2", true}, {"fma", false}, {"f16c", false}}, "Old CPU @ 2.0GHz");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(status.message(), "Old CPU @ 2.0GHz")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "lacks fma, f16c")) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "x86-64-v3")) << status;
}

}  // namespace
}  // namespace substrax
