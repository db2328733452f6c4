// Data-parallel equivalence (the acceptance test of the CPU runtime): an MLP trained 20 steps on
// 4 devices in 2 forked processes (2 devices each, Gloo over loopback) must end with the same
// parameters, within 1e-5 relative, as the same job on 1 device with the same global batch and
// seed (normwise per tensor); for every optimizer. Also: the explicit collective path equals the SPMD path, and the
// runner reports progress and evaluates.
#include "worker/runtime/trainer.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "core/job_spec_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

// The job of these tests: an mlp on synthetic data, with `optimizer` on `mesh`.
testing::JobSpecBuilder Job(const std::string& optimizer, const std::string& mesh) {
  testing::JobSpecBuilder job("equivalence");
  job.Model("{type: mlp, hidden_sizes: [32, 16], num_classes: 5}")
      .SyntheticData(
          "{task: classification, num_train_examples: 2048, num_test_examples: 256, "
          "num_features: 20, noise: 0.5}")
      .Optimizer(optimizer)
      .Mesh(mesh)
      .Batch("{global_batch_size: 64}")
      .Steps(20)
      .Set("seed", "42")
      .Set("report_every_steps", "10");
  return job;
}

v1::JobSpec Spec(const std::string& optimizer, const std::string& mesh) {
  return Job(optimizer, mesh).Proto();
}

v1::JobSpec Spec(const std::string& optimizer, int dp) {
  return Spec(optimizer, absl::StrCat("{data_parallel_size: ", dp, "}"));
}

std::string TempPath(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

// Params as "name shape... values..." in a binary file (only for this test).
void WriteTree(const TensorTree& tree, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& [name, t] : tree) {
    const uint64_t name_size = name.size(), rank = t.shape().size();
    out.write(reinterpret_cast<const char*>(&name_size), sizeof(name_size));
    out.write(name.data(), name.size());
    out.write(reinterpret_cast<const char*>(&rank), sizeof(rank));
    out.write(reinterpret_cast<const char*>(t.shape().data()), rank * sizeof(int64_t));
    out.write(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float));
  }
}

TensorTree ReadTree(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TensorTree tree;
  uint64_t name_size = 0;
  while (in.read(reinterpret_cast<char*>(&name_size), sizeof(name_size))) {
    std::string name(name_size, '\0');
    uint64_t rank = 0;
    in.read(name.data(), name_size);
    in.read(reinterpret_cast<char*>(&rank), sizeof(rank));
    std::vector<int64_t> shape(rank);
    in.read(reinterpret_cast<char*>(shape.data()), rank * sizeof(int64_t));
    Tensor t(shape);
    in.read(reinterpret_cast<char*>(t.data()), t.size() * sizeof(float));
    tree[name] = std::move(t);
  }
  return tree;
}

absl::StatusOr<TrainResult> TrainInProcess(const v1::JobSpec& spec, int devices,
                                           bool explicit_collectives = false,
                                           std::vector<ProgressReport>* reports = nullptr) {
  auto mesh = CreateMeshForJob(spec.mesh(), MakeUniformCluster(1, devices));
  if (!mesh.ok()) return mesh.status();
  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = spec;
  options.process_of_position.assign(mesh->size(), 0);
  options.store = &store;
  options.explicit_collectives = explicit_collectives;
  if (reports != nullptr) {
    options.on_progress = [reports](const ProgressReport& r) { reports->push_back(r); };
  }
  return Train(options);
}

// Child: process `p` of 2, devices 2p and 2p+1 of a 4-device data-parallel mesh.
[[noreturn]] void RunChild(const v1::JobSpec& spec, int p, const std::string& dir) {
  std::vector<Device> devices;
  for (int i = 0; i < 4; ++i) {
    devices.push_back({i, absl::StrCat("host-", i / 2), i % 2, DeviceKind::kCpu, absl::StrCat("w", i / 2)});
  }
  auto mesh = CreateMeshForJob(spec.mesh(), devices);
  auto store = FileStore::Create(dir + "/store");
  if (!mesh.ok() || !store.ok()) _exit(2);
  TrainerOptions options(*mesh);
  options.spec = spec;
  options.process_of_position.clear();
  for (const Device& d : mesh->devices()) options.process_of_position.push_back(d.id / 2);
  options.process_index = p;
  options.store = store->get();
  options.collective_timeout = absl::Seconds(60);
  absl::StatusOr<TrainResult> result = Train(options);
  if (!result.ok()) {
    std::ofstream(absl::StrCat(dir, "/error", p)) << result.status();
    _exit(1);
  }
  WriteTree(result->params, absl::StrCat(dir, "/params", p));
  _exit(0);
}

struct EquivalenceCase {
  const char* name;
  const char* optimizer;
  const char* mesh;
};

class EquivalenceTest : public ::testing::TestWithParam<EquivalenceCase> {};

TEST_P(EquivalenceTest, FourDevicesInTwoProcessesEqualOneDevice) {
  const EquivalenceCase& c = GetParam();
  const std::string dir = TempPath(absl::StrCat("equivalence_", c.name));
  const v1::JobSpec distributed = Spec(c.optimizer, c.mesh);
  std::vector<pid_t> children;
  for (int p = 0; p < 2; ++p) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) RunChild(distributed, p, dir);
    children.push_back(pid);
  }
  absl::StatusOr<TrainResult> single = TrainInProcess(Spec(c.optimizer, 1), 1);
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->steps, 20);

  const absl::Time deadline = absl::Now() + absl::Minutes(3);
  for (int p = 0; p < 2; ++p) {
    const std::optional<int> status = testing::WaitOrKill(children[p], deadline);
    if (!status.has_value()) {
      for (pid_t child : children) kill(child, SIGKILL);
      FAIL() << "process " << p << " did not finish in time";
    }
    std::ifstream error(absl::StrCat(dir, "/error", p));
    std::string message((std::istreambuf_iterator<char>(error)), std::istreambuf_iterator<char>());
    ASSERT_EQ(*status, 0) << "process " << p << " failed: " << message;
  }
  // Parameters gathered to full shape on every process.
  const TensorTree p0 = ReadTree(dir + "/params0");
  const TensorTree p1 = ReadTree(dir + "/params1");
  auto replicas = CompareTrees(p0, p1);
  ASSERT_TRUE(replicas.ok()) << replicas.status();
  EXPECT_EQ(replicas->max_relative, 0) << replicas->where;
  // Summation orders differ (per-device means averaged, partial products summed over the model
  // axis, vs one device), so the results agree to float32 rounding, not bit for bit: within
  // 1e-5 relative in each tensor's max norm, and elementwise within 1e-4 of
  // max(|value|, 1e-3).
  auto diff = CompareTrees(p0, single->params);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_LE(diff->max_normwise, 1e-5) << "in " << diff->normwise_where;
  EXPECT_LE(diff->max_relative, 1e-4) << "at " << diff->where;
  // And training moved the parameters: the comparison is not between two initialisations.
  v1::JobSpec untrained = Spec(c.optimizer, 1);
  untrained.set_steps(1);
  auto moved = CompareTrees(single->params, TrainInProcess(untrained, 1)->params);
  ASSERT_TRUE(moved.ok());
  EXPECT_GT(moved->max_relative, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(
    OptimizersAndMeshes, EquivalenceTest,
    ::testing::Values(
        EquivalenceCase{"sgd_dp4", "{type: sgd, learning_rate: 0.1}", "{data_parallel_size: 4}"},
        EquivalenceCase{"momentum_dp4", "{type: momentum, learning_rate: 0.05, nesterov: true}",
                        "{data_parallel_size: 4}"},
        EquivalenceCase{"adam_dp4", "{type: adam, learning_rate: 0.003}",
                        "{data_parallel_size: 4}"},
        EquivalenceCase{"adam_dp2_mp2", "{type: adam, learning_rate: 0.003}",
                        "{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}"},
        EquivalenceCase{"adam_mp4_cross_host", "{type: adam, learning_rate: 0.003}",
                        "{type: model_parallel, num_devices: 4, allow_cross_host_model_axis: true}"},
        EquivalenceCase{"sgd_dp2_mp2", "{type: sgd, learning_rate: 0.1}",
                        "{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}"}),
    [](const ::testing::TestParamInfo<EquivalenceCase>& info) { return std::string(info.param.name); });

TEST(TrainerTest, ExplicitCollectivePathEqualsSpmdPath) {
  const v1::JobSpec spec = Spec("{type: adam, learning_rate: 0.003}", 2);
  auto spmd = TrainInProcess(spec, 2, false);
  auto pmap = TrainInProcess(spec, 2, true);
  ASSERT_TRUE(spmd.ok()) << spmd.status();
  ASSERT_TRUE(pmap.ok()) << pmap.status();
  auto diff = CompareTrees(pmap->params, spmd->params);
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(diff->max_relative, 0) << diff->where;
}

// The sharded update (spec.gradients.shard_update) computes every value as the unsharded one
// does: the same parameters and evaluation, bit for bit, for 2 devices and for 3 (whose blocks
// split parameters unevenly and end in padding), with Adam and with momentum.
TEST(TrainerTest, ShardedUpdateEqualsTheUnshardedOneBitForBit) {
  for (const char* optimizer :
       {"{type: adam, learning_rate: 0.003}", "{type: momentum, learning_rate: 0.05}"}) {
    for (int devices : {2, 3}) {
      SCOPED_TRACE(absl::StrCat(optimizer, ", ", devices, " devices"));
      // A batch of 96 divides over 2 and 3 devices.
      absl::StatusOr<v1::JobSpec> parsed =
          Job(optimizer, absl::StrCat("{data_parallel_size: ", devices, "}"))
              .Batch("{global_batch_size: 96}")
              .Parse();
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      const v1::JobSpec plain = *parsed;
      v1::JobSpec sharded = plain;
      sharded.mutable_gradients()->set_shard_update(true);
      auto a = TrainInProcess(plain, devices);
      auto b = TrainInProcess(sharded, devices);
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE(b.ok()) << b.status();
      EXPECT_EQ(a->params, b->params);
      EXPECT_EQ(a->evaluation, b->evaluation);
      EXPECT_EQ(a->final_metrics, b->final_metrics);
    }
  }
}

// Where the update cannot be sharded, shard_update: true is refused at start, saying why.
TEST(TrainerTest, ShardedUpdateIsRefusedWhereItCannotBeTaken) {
  v1::JobSpec spec = Spec("{type: adam, learning_rate: 0.003}", 2);
  spec.mutable_gradients()->set_shard_update(true);
  auto pmap = TrainInProcess(spec, 2, /*explicit_collectives=*/true);
  EXPECT_EQ(pmap.status().code(), absl::StatusCode::kFailedPrecondition) << pmap.status();
  EXPECT_THAT(pmap.status().message(), HasSubstr("explicit collectives"));
  // The devices of two processes.
  auto mesh = CreateMeshForJob(spec.mesh(), MakeUniformCluster(1, 2));
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = spec;
  options.process_of_position = {0, 1};
  options.store = &store;
  auto split = Train(options);
  EXPECT_EQ(split.status().code(), absl::StatusCode::kFailedPrecondition) << split.status();
  EXPECT_THAT(split.status().message(), HasSubstr("1 of the mesh's 2 devices"));
}

TEST(TrainerTest, ReportsProgressAndEvaluates) {
  v1::JobSpec spec = Spec("{type: adam, learning_rate: 0.01}", 2);
  spec.set_steps(25);
  std::vector<ProgressReport> reports;
  auto result = TrainInProcess(spec, 2, false, &reports);
  ASSERT_TRUE(result.ok()) << result.status();
  // Every 10 steps, and after the last.
  ASSERT_EQ(reports.size(), 3u);
  EXPECT_EQ(reports[0].step, 10);
  EXPECT_EQ(reports[2].step, 25);
  EXPECT_EQ(reports[2].total_steps, 25);
  EXPECT_EQ(reports[2].metrics.at("step"), 25);
  EXPECT_GT(reports[2].samples_per_second, 0);
  EXPECT_LT(reports[2].metrics.at("loss"), reports[0].metrics.at("loss"));
  EXPECT_TRUE(result->evaluation.count("test_accuracy"));
  EXPECT_GT(result->evaluation.at("test_accuracy"), 0.5);  // 5 classes: chance is 0.2
}

TEST(TrainerTest, ExplicitCollectivePathEqualsSpmdPathWithTensorParallelism) {
  const v1::JobSpec spec = Spec("{type: adam, learning_rate: 0.003}",
                                "{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}");
  auto spmd = TrainInProcess(spec, 4, false);
  auto pmap = TrainInProcess(spec, 4, true);
  ASSERT_TRUE(spmd.ok()) << spmd.status();
  ASSERT_TRUE(pmap.ok()) << pmap.status();
  auto diff = CompareTrees(pmap->params, spmd->params);
  ASSERT_TRUE(diff.ok());
  EXPECT_EQ(diff->max_relative, 0) << diff->where;
}

TEST(TrainerTest, BackendMustMatchTheDevices) {
  v1::JobSpec spec = Spec("{type: sgd, learning_rate: 0.1}", 2);
  spec.set_backend(v1::BACKEND_CUDA);
  auto cpu_devices = TrainInProcess(spec, 2);
  EXPECT_EQ(cpu_devices.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(cpu_devices.status().message()), HasSubstr("spec.backend is cuda"));
}

TEST(TrainerTest, ReducedPrecisionNeedsCudaDevices) {
  v1::JobSpec spec = Spec("{type: sgd, learning_rate: 0.1}", 2);
  spec.set_backend(v1::BACKEND_AUTO);
  spec.set_precision(v1::PRECISION_BF16);
  auto cpu_devices = TrainInProcess(spec, 2);
  EXPECT_EQ(cpu_devices.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(cpu_devices.status().message()), HasSubstr("spec.precision is bf16"));
}

TEST(TrainerTest, BadOptionsAreRejected) {
  const v1::JobSpec spec = Spec("{type: sgd, learning_rate: 0.1}", 2);
  auto mesh = CreateMeshForJob(spec.mesh(), MakeUniformCluster(1, 2));
  ASSERT_TRUE(mesh.ok());
  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = spec;
  options.process_of_position = {0};
  options.store = &store;
  EXPECT_THAT(std::string(Train(options).status().message()), HasSubstr("process table"));
  options.process_of_position = {1, 1};
  EXPECT_THAT(std::string(Train(options).status().message()), HasSubstr("drives no device"));
  options.process_of_position = {0, 0};
  options.spec.mutable_data()->mutable_synthetic()->set_num_train_examples(10);
  EXPECT_THAT(std::string(Train(options).status().message()), HasSubstr("10"));
}

}  // namespace
}  // namespace substrax
