#include "core/plan.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "core/job_spec_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kFeatures = 784;

// An mlp job on the given mesh (YAML, so defaults and validation are the real ones).
v1::JobSpec MlpJob(const std::string& mesh, const std::string& hidden = "[512, 256]",
                   const std::string& optimizer = "adam") {
  return testing::JobSpecBuilder("plan")
      .Model(absl::StrCat("{type: mlp, hidden_sizes: ", hidden, ", num_classes: 10}"))
      .SyntheticData("{task: classification, num_train_examples: 1000, num_features: 784}")
      .Optimizer(absl::StrCat("{type: ", optimizer, ", learning_rate: 0.01}"))
      .Mesh(mesh)
      .Batch("{global_batch_size: 128}")
      .Proto();
}

// Every device's blocks, each divided by its replication, add up to the model once.
void ExpectShardsCoverTheModelOnce(const JobPlan& plan) {
  double covered = 0;
  for (const Device& device : plan.mesh.devices()) {
    for (const ParamPlan& p : plan.params) {
      absl::StatusOr<ShardSlice> slice = p.layout.ForDevice(device.id);
      ASSERT_TRUE(slice.ok()) << slice.status();
      int64_t values = 1;
      for (int64_t d : slice->shape()) values *= d;
      EXPECT_EQ(values * kBytesPerValue, p.shard_bytes) << p.param.name;
      covered += static_cast<double>(values * kBytesPerValue) / p.replicas;
    }
  }
  EXPECT_DOUBLE_EQ(covered, static_cast<double>(plan.model_param_bytes));
}

int64_t ModelBytes(int64_t in, const std::vector<int64_t>& widths) {
  int64_t values = 0;
  for (int64_t out : widths) {
    values += in * out + out;
    in = out;
  }
  return values * kBytesPerValue;
}

struct MeshCase {
  std::string name;
  std::string mesh;
  int hosts;
  int devices_per_host;
  std::string hidden;
};

class PlanShardsTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(PlanShardsTest, PerDeviceBytesOverReplicasSumToTheModel) {
  const MeshCase& c = GetParam();
  absl::StatusOr<JobPlan> plan = PlanJob(MlpJob(c.mesh, c.hidden),
                                         MakeUniformCluster(c.hosts, c.devices_per_host),
                                         kFeatures);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ExpectShardsCoverTheModelOnce(*plan);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, PlanShardsTest,
    ::testing::Values(
        MeshCase{"data4", "{data_parallel_size: 4}", 2, 2, "[512, 256]"},
        MeshCase{"hybrid2x2", "{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}", 2,
                 2, "[512, 256]"},
        MeshCase{"model4_cross_host",
                 "{num_devices: 4, allow_cross_host_model_axis: true}", 2, 2, "[512, 256, 128]"},
        MeshCase{"hybrid2x4", "{type: hybrid, data_parallel_size: 2, model_parallel_size: 4}", 2,
                 4, "[512, 256, 128, 64]"}),
    [](const ::testing::TestParamInfo<MeshCase>& info) { return info.param.name; });

TEST(PlanTest, HybridMlpShardsMemoryAndCollectives) {
  absl::StatusOr<JobPlan> plan = PlanJob(
      MlpJob("{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}"),
      MakeUniformCluster(2, 2), kFeatures);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->mesh.ShapeString(), "(data=2, model=2)");
  EXPECT_EQ(plan->mesh_info.hosts, (std::vector<std::string>{"host-0", "host-1"}));
  EXPECT_EQ(plan->per_device_batch, 64);
  EXPECT_EQ(plan->model_param_bytes, ModelBytes(784, {512, 256, 10}));

  ASSERT_EQ(plan->params.size(), 6u);
  struct Row {
    const char* name;
    const char* spec;
    std::vector<int64_t> shard;
    int64_t replicas;
    std::vector<std::string> gradient_axes;
  };
  const std::vector<Row> rows = {
      {"dense_0/kernel", "(None, 'model')", {784, 256}, 2, {"data"}},
      {"dense_0/bias", "('model',)", {256}, 2, {"data"}},
      {"dense_1/kernel", "('model', None)", {256, 256}, 2, {"data"}},
      {"dense_1/bias", "()", {256}, 4, {"data", "model"}},
      {"dense_2/kernel", "()", {256, 10}, 4, {"data", "model"}},
      {"dense_2/bias", "()", {10}, 4, {"data", "model"}},
  };
  int64_t local = 0, replicated_over_model = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const ParamPlan& p = plan->params[i];
    EXPECT_EQ(p.param.name, rows[i].name);
    EXPECT_EQ(p.param.partition.ToString(), rows[i].spec) << p.param.name;
    EXPECT_EQ(p.shard_shape, rows[i].shard) << p.param.name;
    EXPECT_EQ(p.replicas, rows[i].replicas) << p.param.name;
    EXPECT_EQ(p.gradient_axes, rows[i].gradient_axes) << p.param.name;
    local += p.shard_bytes;
    if (rows[i].gradient_axes.size() == 2) replicated_over_model += p.shard_bytes;
  }
  EXPECT_EQ(local, (784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10) * 4);

  // adam: two moments per parameter. Activations: 64 x (512/2 + 256 + 10) x 4, twice.
  EXPECT_EQ(plan->memory.parameters, local);
  EXPECT_EQ(plan->memory.gradients, local);
  EXPECT_EQ(plan->memory.optimizer_state, 2 * local);
  EXPECT_EQ(plan->local_layer_widths, (std::vector<int64_t>{256, 256, 10}));
  EXPECT_EQ(plan->memory.activations, 2 * 64 * (256 + 256 + 10) * 4);
  EXPECT_EQ(plan->memory.total(), 4 * local + plan->memory.activations);

  ASSERT_EQ(plan->collectives.size(), 3u);
  const Collective& data = plan->collectives[0];
  EXPECT_EQ(data.axis, "data");
  EXPECT_EQ(data.group_size, 2);
  EXPECT_EQ(data.count, 6);
  EXPECT_EQ(data.bytes, local);
  const Collective& model = plan->collectives[1];
  EXPECT_EQ(model.axis, "model");
  EXPECT_EQ(model.what, "gradients (mean)");
  EXPECT_EQ(model.count, 3);
  EXPECT_EQ(model.bytes, replicated_over_model);
  // One pair: one forward all-reduce of the row-parallel output, none backward.
  const Collective& tp = plan->collectives[2];
  EXPECT_EQ(tp.what, "activations, forward (sum)");
  EXPECT_EQ(tp.count, 1);
  EXPECT_EQ(tp.bytes, 64 * 256 * 4);
}

TEST(PlanTest, SecondPairAllReducesItsInputGradientInTheBackwardPass) {
  absl::StatusOr<JobPlan> plan =
      PlanJob(MlpJob("{num_devices: 2}", "[64, 32, 16, 8]", "sgd"), MakeUniformCluster(1, 2), 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Pairs (0, 1) and (2, 3); dense_4 is replicated. Model-parallel: the whole batch per device.
  EXPECT_EQ(plan->per_device_batch, 128);
  EXPECT_EQ(plan->memory.optimizer_state, 0);
  EXPECT_EQ(plan->memory.activations, 2 * 128 * (32 + 32 + 8 + 8 + 10) * 4);
  ASSERT_EQ(plan->collectives.size(), 3u);
  EXPECT_EQ(plan->collectives[0].axis, "model");
  EXPECT_EQ(plan->collectives[0].what, "gradients (mean)");
  EXPECT_EQ(plan->collectives[1].count, 2);
  EXPECT_EQ(plan->collectives[1].bytes, 128 * (32 + 8) * 4);
  EXPECT_EQ(plan->collectives[2].what, "activation gradients, backward (sum)");
  EXPECT_EQ(plan->collectives[2].count, 1);
  EXPECT_EQ(plan->collectives[2].bytes, 128 * 32 * 4);  // dense_2's input
}

TEST(PlanTest, DataParallelReplicatesEverythingAndReducesOverDataOnly) {
  absl::StatusOr<JobPlan> plan =
      PlanJob(MlpJob("{data_parallel_size: 4}", "[512, 256]", "momentum"),
              MakeUniformCluster(2, 2), kFeatures);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const ParamPlan& p : plan->params) {
    EXPECT_EQ(p.replicas, 4) << p.param.name;
    EXPECT_EQ(p.shard_shape, p.param.shape) << p.param.name;
  }
  EXPECT_EQ(plan->memory.parameters, plan->model_param_bytes);
  EXPECT_EQ(plan->memory.optimizer_state, plan->model_param_bytes);
  ASSERT_EQ(plan->collectives.size(), 1u);
  EXPECT_EQ(plan->collectives[0].axis, "data");
  EXPECT_EQ(plan->collectives[0].bytes, plan->model_param_bytes);
}

TEST(PlanTest, BadMeshesAreRejectedWithTheFieldPath) {
  const std::vector<Device> cluster = MakeUniformCluster(2, 2);
  // More devices than exist.
  absl::StatusOr<JobPlan> plan = PlanJob(MlpJob("{data_parallel_size: 8}"), cluster, kFeatures);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("spec.mesh: data-parallel mesh of 8 devices, but only 4"));
  // A model-axis group that needs two hosts, without allow_cross_host_model_axis.
  plan = PlanJob(MlpJob("{num_devices: 4}"), cluster, kFeatures);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("spec.mesh: model-parallel mesh of 4 devices must lie on one host"));
  EXPECT_THAT(plan.status().message(), HasSubstr("allow cross-host placement"));
  // The same mesh when asked for.
  EXPECT_TRUE(
      PlanJob(MlpJob("{num_devices: 4, allow_cross_host_model_axis: true}"), cluster, kFeatures)
          .ok());
  // A hidden width that does not divide over the model axis (a proto spec that skipped the
  // YAML validation: PlanJob checks it too).
  v1::JobSpec odd = MlpJob("{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}");
  odd.mutable_model()->set_hidden_sizes(0, 511);
  plan = PlanJob(odd, cluster, kFeatures);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(),
              HasSubstr("spec.model.hidden_sizes[0]: 511 does not divide over the model axis"));
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

TEST(PlanTest, AProgramJobIsPlannedAsItsMeshAndBatchOnly) {
  absl::StatusOr<v1::JobSpec> spec = testing::JobSpecBuilder("prog")
                                         .Program("{path: /opt/p/train}")
                                         .DataParallel(4)
                                         .Batch("{global_batch_size: 64}")
                                         .Parse();

  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<JobPlan> plan = PlanJob(*spec, MakeUniformCluster(2, 2), /*num_features=*/0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->mesh.size(), 4);
  EXPECT_EQ(plan->per_device_batch, 16);
  EXPECT_TRUE(plan->params.empty());
  EXPECT_EQ(plan->memory.total(), 0);
  EXPECT_TRUE(plan->collectives.empty());
  // The mesh is still the coordinator's: too few devices fail with its message.
  absl::StatusOr<JobPlan> small = PlanJob(*spec, MakeUniformCluster(1, 2), 0);
  EXPECT_THAT(std::string(small.status().message()), HasSubstr("spec.mesh"));
}

}  // namespace
}  // namespace substrax
