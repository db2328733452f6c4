// The guide's functions on live devices: 4 device threads of a (data=2, model=2) mesh or a
// 4-device data-parallel mesh, real Gloo over loopback.
#include "worker/runtime/spmd.h"

#include <functional>

#include "core/device_mesh_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/runtime/test_mesh.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void OnDevices(const Mesh& mesh, const std::function<void(DeviceContext&)>& body) {
  RunOnDevices(mesh, body);
}

Mesh Hybrid() { return *DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(2, 2), 2, 2); }
Mesh DataParallel(int n) {
  return *DeviceMeshManager::CreateDataParallelMesh(MakeUniformCluster(1, n));
}

TEST(SpmdTest, MetricReductionsOverAllDevices) {
  OnDevices(Hybrid(), [](DeviceContext& ctx) {
    const double id = ctx.device.id;
    const Metrics mine = {{"loss", id}, {"step", 10 + id}};
    EXPECT_DOUBLE_EQ(ReduceMean(ctx, mine)->at("loss"), 1.5);
    EXPECT_DOUBLE_EQ(ReduceSum(ctx, mine)->at("step"), 46);
    auto custom =
        ReduceCustom(ctx, mine, std::map<std::string, std::string>{{"loss", "min"}, {"step", "max"}});
    ASSERT_TRUE(custom.ok()) << custom.status();
    EXPECT_DOUBLE_EQ(custom->at("loss"), 0);
    EXPECT_DOUBLE_EQ(custom->at("step"), 13);
    auto per_device = CollectFromDevices(ctx, mine);
    ASSERT_TRUE(per_device.ok());
    ASSERT_EQ(per_device->size(), 4u);
    EXPECT_DOUBLE_EQ((*per_device)[3].at("loss"), 3);
    // An unknown reduction is an error on every device, not a skipped key.
    auto bad = ReduceCustom(ctx, mine, std::map<std::string, std::string>{{"loss", "median"},
                                                                          {"step", "max"}});
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  });
}

TEST(SpmdTest, DifferentMetricNamesAreCaught) {
  OnDevices(DataParallel(2), [](DeviceContext& ctx) {
    const Metrics mine = ctx.device.id == 0 ? Metrics{{"loss", 1}} : Metrics{{"lost", 1}};
    EXPECT_EQ(ReduceMean(ctx, mine).status().code(), absl::StatusCode::kFailedPrecondition);
  });
}

TEST(SpmdTest, CollectivesFollowTheAxisName) {
  OnDevices(Hybrid(), [](DeviceContext& ctx) {
    const float id = ctx.device.id;  // row-major (data, model): ids 0 1 / 2 3
    TensorTree tree = {{"g", Tensor({2}, {id, 2 * id})}};
    ASSERT_TRUE(ReduceSumCollective(ctx, &tree, "model").ok());
    const float row = ctx.coords[0] == 0 ? 1 : 5;
    EXPECT_THAT(tree["g"].span(), ElementsAre(row, 2 * row));
    TensorTree mean = {{"g", Tensor({1}, {id})}};
    ASSERT_TRUE(ReduceMeanCollective(ctx, &mean, "data").ok());
    EXPECT_FLOAT_EQ(mean["g"].data()[0], ctx.coords[1] + 1);  // mean of c and c+2
    auto gathered = AllGather(ctx, Tensor({1, 2}, {id, -id}), "data");
    ASSERT_TRUE(gathered.ok());
    EXPECT_EQ(gathered->shape(), (std::vector<int64_t>{2, 1, 2}));
    EXPECT_FLOAT_EQ(gathered->data()[2], ctx.coords[1] + 2);
    auto metrics = ReduceMeanCollective(ctx, Metrics{{"loss", id}}, "model");
    EXPECT_DOUBLE_EQ(metrics->at("loss"), ctx.coords[0] == 0 ? 0.5 : 2.5);
    // An axis the mesh lacks is an error, never a silent no-op.
    absl::Status missing = ReduceMeanCollective(ctx, &tree, "batch");
    EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(missing.message()), HasSubstr("has no axis 'batch'"));
  });
}

TEST(SpmdTest, BucketedGradientReductionEqualsPerTensorMean) {
  OnDevices(DataParallel(4), [](DeviceContext& ctx) {
    const float id = ctx.device.id;
    TensorTree grads;
    for (int t = 0; t < 5; ++t) {
      Tensor g({3 + t});
      for (int64_t i = 0; i < g.size(); ++i) g.data()[i] = id * 100 + t * 10 + i;
      grads["p" + std::to_string(t)] = g;
    }
    TensorTree expected = grads;
    for (auto& [name, g] : expected) {
      for (int64_t i = 0; i < g.size(); ++i) g.data()[i] += 150 - id * 100;  // mean over ids 0..3
    }
    // 20-byte buckets: several buckets, and tensors larger than a bucket travel alone.
    ASSERT_TRUE(ReduceGradientTree(ctx, &grads, ReduceType::kMean, {20}).ok());
    EXPECT_EQ(CompareTrees(grads, expected)->max_relative, 0);
    ASSERT_TRUE(ReduceGradientTree(ctx, &grads, ReduceType::kSum).ok());
    EXPECT_FLOAT_EQ(grads["p0"].data()[0], 4 * 150);
  });
}

// On (data=2, model=2): a gradient sharded on "model" is averaged over "data" only; a replicated
// one over both axes; nothing twice.
TEST(SpmdTest, GradientReductionFollowsTheShardings) {
  OnDevices(Hybrid(), [](DeviceContext& ctx) {
    const float id = ctx.device.id;  // row-major (data, model): 0 1 / 2 3
    TensorTree grads = {{"sharded", Tensor({1}, {id})}, {"replicated", Tensor({1}, {id})}};
    const std::map<std::string, PartitionSpec> specs = {
        {"sharded", PartitionSpec::Of({"model"})}};
    ASSERT_TRUE(ReduceGradientsBySharding(ctx, &grads, specs).ok());
    // Over data: mean of ids (c, c + 2) for model coordinate c.
    EXPECT_FLOAT_EQ(grads["sharded"].data()[0], ctx.coords[1] + 1);
    EXPECT_FLOAT_EQ(grads["replicated"].data()[0], 1.5);  // mean of 0..3
  });
}

TEST(SpmdTest, AllGatherStateInvertsPlaceStateOnShards) {
  const Mesh mesh = Hybrid();
  TensorTree full = {{"w", Tensor({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7})},
                     {"v", Tensor({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7})},
                     {"b", Tensor({2}, {1, 2})}};
  const std::map<std::string, PartitionSpec> specs = {
      {"w", PartitionSpec::Of({"", "model"})}, {"v", PartitionSpec::Of({"model"})}};
  OnDevices(mesh, [&](DeviceContext& ctx) {
    auto local = PlaceStateOnShards(full, mesh, specs, ctx.device.id);
    ASSERT_TRUE(local.ok()) << local.status();
    EXPECT_EQ((*local)["w"].shape(), (std::vector<int64_t>{2, 2}));
    auto gathered = AllGatherState(ctx, *local, specs);
    ASSERT_TRUE(gathered.ok()) << gathered.status();
    for (const auto& [name, t] : full) EXPECT_EQ((*gathered)[name], t) << name;
  });
}

TEST(SpmdTest, PlacementOnShards) {
  const Mesh mesh = Hybrid();
  auto sharding = CreateDataParallelSharding(mesh);
  ASSERT_TRUE(sharding.ok());
  Batch global{Tensor({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7}), Tensor({4}, {0, 1, 2, 3})};
  auto local = PlaceBatchOnShards(global, *sharding, 3);  // data=1
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_THAT(local->inputs.span(), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(local->targets.span(), ElementsAre(2, 3));
  Batch odd{Tensor({3, 2}), Tensor({3})};
  EXPECT_THAT(std::string(PlaceBatchOnShards(odd, *sharding, 0).status().message()),
              HasSubstr("batch inputs: dimension 0 of shape (3, 2) has size 3"));

  TensorTree state = {{"w", Tensor({2, 4}, {0, 1, 2, 3, 4, 5, 6, 7})}, {"b", Tensor({2}, {1, 2})}};
  auto replicated = PlaceStateOnShards(state, mesh, {}, 2);
  ASSERT_TRUE(replicated.ok());
  EXPECT_EQ((*replicated)["w"], state["w"]);
  auto sharded = PlaceStateOnShards(state, mesh, {{"w", PartitionSpec::Of({"", "model"})}}, 1);
  ASSERT_TRUE(sharded.ok()) << sharded.status();
  EXPECT_THAT((*sharded)["w"].span(), ElementsAre(2, 3, 6, 7));
  EXPECT_THAT(std::string(
                  PlaceStateOnShards(state, mesh, {{"b", PartitionSpec::Of({"pipe"})}}, 0)
                      .status()
                      .message()),
              HasSubstr("state 'b'"));
}

}  // namespace
}  // namespace substrax
