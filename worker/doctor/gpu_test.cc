#include "worker/doctor/gpu.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax::doctor {
namespace {

using ::testing::HasSubstr;

TEST(DoctorGpuTest, ADriverOlderThanTheRuntimeIsAProblemNamingWhatToInstall) {
  GpuFacts facts;
  facts.names = {"NVIDIA H100 80GB HBM3"};
  facts.driver_cuda_version = 12040;
  facts.runtime_cuda_version = 13000;
  facts.nccl_version = 22703;
  const Finding f = JudgeGpu(facts);
  EXPECT_EQ(f.verdict, Verdict::kProblem);
  EXPECT_THAT(f.seen, HasSubstr("1 x NVIDIA H100 80GB HBM3; driver CUDA 12.4, runtime 13.0, "
                                "NCCL 2.27.3"));
  EXPECT_THAT(f.fix, HasSubstr("supports CUDA 13.0 (the 580 series or newer)"));
}

TEST(DoctorGpuTest, ARecentDriverIsOk) {
  GpuFacts facts;
  facts.names = {"NVIDIA H200", "NVIDIA H200"};
  facts.driver_cuda_version = 13010;
  facts.runtime_cuda_version = 13000;
  const Finding f = JudgeGpu(facts);
  EXPECT_EQ(f.verdict, Verdict::kOk);
  EXPECT_THAT(f.seen, HasSubstr("2 x NVIDIA H200; driver CUDA 13.1"));
  EXPECT_EQ(f.fix, "");
}

TEST(DoctorGpuTest, ARuntimeErrorIsAProblem) {
  GpuFacts facts;
  facts.error = "cudaErrorDevicesUnavailable: CUDA-capable device(s) is/are busy or unavailable";
  const Finding f = JudgeGpu(facts);
  EXPECT_EQ(f.verdict, Verdict::kProblem);
  EXPECT_THAT(f.fix, HasSubstr("nvidia-smi"));
}

}  // namespace
}  // namespace substrax::doctor
