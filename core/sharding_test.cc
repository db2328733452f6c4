#include "core/sharding.h"

#include <numeric>
#include <random>

#include "core/device_mesh_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

Mesh HybridMesh(int dp, int mp) {
  auto mesh = DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(dp, mp), dp, mp);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *mesh;
}

TEST(PartitionSpecTest, PrintsLikeJax) {
  EXPECT_EQ(PartitionSpec().ToString(), "()");
  EXPECT_EQ(PartitionSpec::Of({"data"}).ToString(), "('data',)");
  EXPECT_EQ(PartitionSpec::Of({"data", ""}).ToString(), "('data', None)");
  EXPECT_EQ(PartitionSpec({{"data", "model"}, {}}).ToString(), "(('data', 'model'), None)");
  PartitionSpec spec({{"data"}, {}, {"model"}});
  EXPECT_EQ(PartitionSpec::FromProto(spec.ToProto()), spec);
}

TEST(NamedShardingTest, DataParallelShardingSplitsTheBatch) {
  auto mesh = DeviceMeshManager::CreateDataParallelMesh(MakeUniformCluster(2, 2));
  ASSERT_TRUE(mesh.ok());
  auto sharding = CreateDataParallelSharding(*mesh);
  ASSERT_TRUE(sharding.ok()) << sharding.status();
  EXPECT_EQ(sharding->ToString(), "NamedSharding(mesh=(data=4), spec=('data',))");
  auto layout = sharding->Layout({256, 784});
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->num_replicas, 1);
  for (int i = 0; i < 4; ++i) {
    const ShardSlice& shard = layout->shards[i];
    EXPECT_EQ(shard.index[0], (IndexRange{64 * i, 64 * (i + 1)}));
    EXPECT_EQ(shard.index[1], (IndexRange{0, 784}));
    EXPECT_EQ(shard.shape(), (std::vector<int64_t>{64, 784}));
    EXPECT_EQ(shard.replica_id, 0);
  }
  EXPECT_EQ(layout->ForDevice(3)->index[0].start, 192);
  EXPECT_EQ(layout->ForDevice(42).status().code(), absl::StatusCode::kNotFound);
}

TEST(NamedShardingTest, DataShardingOnAHybridMeshReplicatesOverModel) {
  auto sharding = CreateDataParallelSharding(HybridMesh(2, 2));
  ASSERT_TRUE(sharding.ok());
  auto layout = sharding->Layout({8, 3});
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->num_replicas, 2);
  // Row-major (data, model): devices 0 and 1 share rows 0..3 as replicas 0 and 1.
  EXPECT_EQ(layout->shards[0].index[0], (IndexRange{0, 4}));
  EXPECT_EQ(layout->shards[1].index[0], (IndexRange{0, 4}));
  EXPECT_EQ(layout->shards[0].replica_id, 0);
  EXPECT_EQ(layout->shards[1].replica_id, 1);
  EXPECT_EQ(layout->shards[2].index[0], (IndexRange{4, 8}));
}

TEST(NamedShardingTest, ErrorsNameTheProblem) {
  Mesh mesh = HybridMesh(2, 2);
  auto bad_axis = NamedSharding::Create(mesh, PartitionSpec::Of({"batch"}));
  EXPECT_EQ(bad_axis.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_axis.status().message(), HasSubstr("has no axis 'batch'"));
  EXPECT_THAT(NamedSharding::Create(mesh, PartitionSpec::Of({"data", "data"})).status().message(),
              HasSubstr("more than once"));

  auto model_only = DeviceMeshManager::CreateModelParallelMesh(MakeUniformCluster(1, 2), 2);
  ASSERT_TRUE(model_only.ok());
  EXPECT_THAT(CreateDataParallelSharding(*model_only).status().message(),
              HasSubstr("has no axis 'data'"));

  auto sharding = NamedSharding::Create(mesh, PartitionSpec::Of({"", "model"}));
  ASSERT_TRUE(sharding.ok());
  EXPECT_EQ(sharding->Layout({10, 5}).status().message(),
            "dimension 1 of shape (10, 5) has size 5, which does not divide evenly over mesh "
            "axes (model) of total size 2");
  EXPECT_THAT(sharding->Layout({4}).status().message(), HasSubstr("has 2 dimensions"));
  EXPECT_THAT(sharding->Layout({-1, 4}).status().message(), HasSubstr("is negative"));
}

// Over many random meshes, specs and shapes: for every replica id, the shards with that id tile
// the global array exactly once, and each device holds the block its coordinates say.
TEST(NamedShardingTest, ShardsCoverEveryElementOncePerReplica) {
  std::mt19937 rng(2026);
  const std::vector<std::string> axis_pool = {"data", "model", "pipe"};
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    // A random mesh of rank 1-3 with sizes 1-4.
    const int mesh_rank = 1 + rng() % 3;
    std::vector<std::string> names(axis_pool.begin(), axis_pool.begin() + mesh_rank);
    std::vector<int64_t> mesh_shape;
    int64_t devices = 1;
    for (int a = 0; a < mesh_rank; ++a) {
      mesh_shape.push_back(1 + rng() % 4);
      devices *= mesh_shape.back();
    }
    auto mesh = Mesh::Create(names, mesh_shape, MakeUniformCluster(1, devices));
    ASSERT_TRUE(mesh.ok()) << mesh.status();

    // A random spec: each mesh axis goes to a random array dimension or stays unused.
    const int rank = 1 + rng() % 3;
    std::vector<std::vector<std::string>> dims(rank);
    for (const std::string& axis : names) {
      const int target = static_cast<int>(rng() % (rank + 1));
      if (target < rank) dims[target].push_back(axis);
    }
    std::shuffle(dims.begin(), dims.end(), rng);
    // Shapes that divide: per-dimension blocks times a random factor.
    std::vector<int64_t> shape(rank);
    for (int d = 0; d < rank; ++d) {
      int64_t blocks = 1;
      for (const std::string& axis : dims[d]) blocks *= *mesh->AxisSize(axis);
      shape[d] = blocks * (1 + rng() % 3);
    }
    // Sometimes drop trailing unsplit dims from the spec (they are implied).
    while (!dims.empty() && dims.back().empty() && rng() % 2) dims.pop_back();

    auto sharding = NamedSharding::Create(*mesh, PartitionSpec(dims));
    ASSERT_TRUE(sharding.ok()) << sharding.status();
    auto layout = sharding->Layout(shape);
    ASSERT_TRUE(layout.ok()) << layout.status();
    ASSERT_EQ(static_cast<int64_t>(layout->shards.size()), mesh->size());

    const int64_t elements =
        std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
    std::vector<std::vector<int>> count(layout->num_replicas, std::vector<int>(elements, 0));
    for (const ShardSlice& shard : layout->shards) {
      ASSERT_GE(shard.replica_id, 0);
      ASSERT_LT(shard.replica_id, layout->num_replicas);
      // Visit every element of the block.
      std::vector<int64_t> idx(rank);
      for (int d = 0; d < rank; ++d) idx[d] = shard.index[d].start;
      bool empty = false;
      for (int d = 0; d < rank; ++d) empty |= shard.index[d].size() == 0;
      while (!empty) {
        int64_t flat = 0;
        for (int d = 0; d < rank; ++d) flat = flat * shape[d] + idx[d];
        ++count[shard.replica_id][flat];
        int d = rank - 1;
        while (d >= 0 && ++idx[d] == shard.index[d].limit) {
          idx[d] = shard.index[d].start;
          --d;
        }
        if (d < 0) break;
      }
    }
    for (int64_t r = 0; r < layout->num_replicas; ++r) {
      for (int64_t e = 0; e < elements; ++e) {
        ASSERT_EQ(count[r][e], 1) << "replica " << r << " element " << e << " spec "
                                  << sharding->spec() << " shape " << ShapeToString(shape)
                                  << " mesh " << mesh->ShapeString();
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 400);
}

TEST(ShardLayoutTest, ProtoCarriesEverySlice) {
  auto sharding = CreateDataParallelSharding(HybridMesh(2, 2));
  ASSERT_TRUE(sharding.ok());
  auto layout = sharding->Layout({4, 2});
  ASSERT_TRUE(layout.ok());
  v1::ShardLayout proto = layout->ToProto();
  EXPECT_EQ(proto.shards_size(), 4);
  EXPECT_EQ(proto.num_replicas(), 2);
  EXPECT_EQ(proto.shards(2).index(0).start(), 2);
  EXPECT_EQ(proto.shards(3).replica_id(), 1);
  EXPECT_EQ(proto.spec().dims(0).axes(0), "data");
}

}  // namespace
}  // namespace substrax
