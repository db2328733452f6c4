#include "contract/devices.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifdef SUBSTRAX_CUDA
#include <cuda_runtime.h>
#endif

namespace substrax {
namespace {

using ::testing::HasSubstr;

TEST(DevicesTest, CpuN) {
  absl::StatusOr<std::vector<v1::Device>> devices = DiscoverDevices("cpu:3", "host-a");
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 3u);
  for (int i = 0; i < 3; ++i) {
    const v1::Device& d = (*devices)[i];
    EXPECT_EQ(d.host(), "host-a");
    EXPECT_EQ(d.local_index(), i);
    EXPECT_EQ(d.kind(), v1::DEVICE_KIND_CPU);
    EXPECT_EQ(d.name(), "cpu");
    EXPECT_EQ(d.pci_bus_id(), "");
  }
  EXPECT_EQ(DiscoverDevices("cpu:1", "h")->size(), 1u);
  EXPECT_EQ(DiscoverDevices("cpu:256", "h")->size(), 256u);
}

TEST(DevicesTest, BadSpecsAreInvalidArgument) {
  for (const char* spec : {"", "cpu", "cpu:", "cpu:0", "cpu:257", "cpu:-1", "cpu:2x", "gpu",
                           "CUDA", "cuda:0", "tpu:4"}) {
    SCOPED_TRACE(spec);
    absl::StatusOr<std::vector<v1::Device>> devices = DiscoverDevices(spec, "h");
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(devices.status().message()), HasSubstr("'cuda'"));
    EXPECT_THAT(std::string(devices.status().message()), HasSubstr("'cpu:N'"));
  }
}

TEST(DevicesTest, Cuda) {
  absl::StatusOr<std::vector<v1::Device>> devices = DiscoverDevices("cuda", "host-a");
#ifndef SUBSTRAX_CUDA
  EXPECT_EQ(devices.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(devices.status().message()), HasSubstr("--config=cuda"));
#else
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    EXPECT_EQ(devices.status().code(), absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "no CUDA device: "
                 << (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount returned 0")
                 << " (checked: discovery fails with FAILED_PRECONDITION: "
                 << devices.status().message() << ")";
  }
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(static_cast<int>(devices->size()), count);
  for (int i = 0; i < count; ++i) {
    const v1::Device& d = (*devices)[i];
    EXPECT_EQ(d.kind(), v1::DEVICE_KIND_CUDA);
    EXPECT_EQ(d.local_index(), i);
    EXPECT_EQ(d.host(), "host-a");
    EXPECT_FALSE(d.name().empty());
    EXPECT_GT(d.memory_bytes(), 0);
    EXPECT_FALSE(d.pci_bus_id().empty());
  }
#endif
}

}  // namespace
}  // namespace substrax
