#include "core/mesh.h"

#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

Mesh Make(std::vector<std::string> names, std::vector<int64_t> shape, int hosts, int per_host) {
  absl::StatusOr<Mesh> mesh =
      Mesh::Create(std::move(names), std::move(shape), MakeUniformCluster(hosts, per_host));
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *std::move(mesh);
}

TEST(MeshTest, CreateRejectsInconsistentShapes) {
  auto devices = MakeUniformCluster(1, 4);
  EXPECT_THAT(Mesh::Create({}, {}, devices).status().message(), HasSubstr("at least one axis"));
  EXPECT_THAT(Mesh::Create({"data"}, {2, 2}, devices).status().message(),
              HasSubstr("shape of rank 2"));
  EXPECT_THAT(Mesh::Create({"data", "data"}, {2, 2}, devices).status().message(),
              HasSubstr("appears twice"));
  EXPECT_THAT(Mesh::Create({"data", ""}, {2, 2}, devices).status().message(),
              HasSubstr("empty name"));
  EXPECT_THAT(Mesh::Create({"data"}, {0}, devices).status().message(),
              HasSubstr("must have size >= 1"));
  EXPECT_THAT(Mesh::Create({"data"}, {3}, devices).status().message(),
              HasSubstr("holds 3 devices but 4 were given"));
}

TEST(MeshTest, RavelAndUnravelAreInverse) {
  Mesh mesh = Make({"a", "b", "c"}, {2, 3, 4}, 4, 6);
  for (int64_t i = 0; i < mesh.size(); ++i) {
    EXPECT_EQ(mesh.Ravel(mesh.Unravel(i)), i);
    EXPECT_EQ(*mesh.CoordinatesOf(mesh.devices()[i].id), mesh.Unravel(i));
  }
  EXPECT_EQ(mesh.Unravel(23), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(mesh.DeviceAt({1, 0, 2}).id, 14);
}

TEST(MeshTest, AxisLookupNamesTheAxesOnError) {
  Mesh mesh = Make({"data", "model"}, {2, 2}, 2, 2);
  EXPECT_EQ(*mesh.AxisIndex("model"), 1);
  EXPECT_EQ(*mesh.AxisSize("data"), 2);
  absl::Status s = mesh.AxisIndex("batch").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "mesh (data=2, model=2) has no axis 'batch'; its axes are data, model");
  EXPECT_FALSE(mesh.HasAxis("batch"));
  EXPECT_EQ(mesh.CoordinatesOf(99).status().code(), absl::StatusCode::kNotFound);
}

TEST(MeshTest, DevicesAlongAxisShareTheOtherCoordinates) {
  Mesh mesh = Make({"data", "model"}, {2, 4}, 2, 4);
  // Row-major: device 6 is at (1, 2).
  auto model_group = mesh.DevicesAlongAxis("model", 6);
  ASSERT_TRUE(model_group.ok());
  std::vector<int> ids;
  for (const Device& d : *model_group) ids.push_back(d.id);
  EXPECT_EQ(ids, (std::vector<int>{4, 5, 6, 7}));
  auto data_group = mesh.DevicesAlongAxis("data", 6);
  ids.clear();
  for (const Device& d : *data_group) ids.push_back(d.id);
  EXPECT_EQ(ids, (std::vector<int>{2, 6}));
}

TEST(MeshTest, AxisGroupsPartitionTheMesh) {
  Mesh mesh = Make({"a", "b", "c"}, {2, 3, 2}, 3, 4);
  for (const std::string& axis : mesh.axis_names()) {
    auto groups = mesh.AxisGroups(axis);
    ASSERT_TRUE(groups.ok());
    const int64_t axis_size = *mesh.AxisSize(axis);
    EXPECT_EQ(static_cast<int64_t>(groups->size()), mesh.size() / axis_size);
    std::set<int> seen;
    for (const auto& group : *groups) {
      EXPECT_EQ(static_cast<int64_t>(group.size()), axis_size);
      for (const Device& d : group) EXPECT_TRUE(seen.insert(d.id).second) << d;
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), mesh.size());
  }
}

TEST(MeshTest, ProtoRoundTripAndHosts) {
  Mesh mesh = Make({"data", "model"}, {3, 2}, 3, 2);
  auto back = Mesh::FromProto(mesh.ToProto());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->axis_names(), mesh.axis_names());
  EXPECT_EQ(back->shape(), mesh.shape());
  EXPECT_EQ(back->devices(), mesh.devices());
  EXPECT_EQ(mesh.Hosts(), (std::vector<std::string>{"host-0", "host-1", "host-2"}));
  EXPECT_EQ(mesh.ShapeString(), "(data=3, model=2)");
}

}  // namespace
}  // namespace substrax
