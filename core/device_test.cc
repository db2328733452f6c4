#include "core/device.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, NamesSayKindIndexAndHost) {
  Device d{5, "host-a", 1, DeviceKind::kCuda, "w-a"};
  EXPECT_EQ(d.LocalName(), "cuda:1");
  EXPECT_EQ(d.ToString(), "device 5 (cuda:1 on host-a)");
}

TEST(DeviceTest, ProtoRoundTrip) {
  for (DeviceKind kind : {DeviceKind::kCpu, DeviceKind::kCuda}) {
    Device d{7, "gpu-7", 3, kind, "w-7"};
    EXPECT_EQ(DeviceFromProto(DeviceToProto(d)), d);
  }
}

TEST(DeviceTest, UniformClusterHasUniqueIdsAndHosts) {
  std::vector<Device> devices = MakeUniformCluster(3, 4);
  ASSERT_EQ(devices.size(), 12u);
  EXPECT_TRUE(ValidateDevices(devices).ok());
  EXPECT_EQ(devices[5].host, "host-1");
  EXPECT_EQ(devices[5].local_index, 1);
  EXPECT_EQ(devices[5].id, 5);
}

TEST(DeviceTest, ValidateRejectsBadSets) {
  EXPECT_THAT(ValidateDevices({}).message(), HasSubstr("no devices"));

  std::vector<Device> dup_id = MakeUniformCluster(1, 2);
  dup_id[1].id = 0;
  absl::Status s = ValidateDevices(dup_id);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("device id 0 appears twice"));

  std::vector<Device> dup_place = MakeUniformCluster(1, 2);
  dup_place[1].local_index = 0;
  EXPECT_THAT(ValidateDevices(dup_place).message(), HasSubstr("are the same device of host"));

  std::vector<Device> no_host = MakeUniformCluster(1, 1);
  no_host[0].host.clear();
  EXPECT_THAT(ValidateDevices(no_host).message(), HasSubstr("has no host"));
}

TEST(DeviceTest, GroupByHostKeepsFirstAppearanceAndSortsByLocalIndex) {
  std::vector<Device> devices = {
      {0, "b", 1, DeviceKind::kCpu, ""},
      {1, "a", 1, DeviceKind::kCpu, ""},
      {2, "b", 0, DeviceKind::kCpu, ""},
      {3, "a", 0, DeviceKind::kCpu, ""},
  };
  auto groups = GroupByHost(devices);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].first, "b");
  EXPECT_EQ(groups[0].second[0].id, 2);
  EXPECT_EQ(groups[0].second[1].id, 0);
  EXPECT_EQ(groups[1].first, "a");
  EXPECT_EQ(groups[1].second[0].id, 3);
}

}  // namespace
}  // namespace substrax
