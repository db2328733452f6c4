// Tests of `substraxctl plan`: on --workers (the hybrid example reads the real Fashion-MNIST
// header; skipped where Debian's dataset-fashion-mnist is not installed) and on the workers of
// the fake coordinator of commands_test_util.h.
#include "client/commands.h"

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/commands_test_util.h"
#include "client/plan_env.h"
#include "core/job_spec_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kHybridExample[] = "examples/fashion_mnist_mlp_hybrid.yaml";

constexpr char kFashionMnist[] = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz";

// A synthetic-data mlp job on `mesh` (no data files needed).
testing::JobSpecBuilder SyntheticJobSpec(const std::string& mesh,
                                         const std::string& hidden = "[64, 32]") {
  testing::JobSpecBuilder job("demo");
  job.Model(absl::StrCat("{type: mlp, hidden_sizes: ", hidden, ", num_classes: 10}"))
      .SyntheticData("{task: classification, num_train_examples: 100, num_features: 20}")
      .Mesh(mesh)
      .Batch("{global_batch_size: 32}");
  return job;
}

std::string SyntheticJob(const std::string& mesh, const std::string& hidden = "[64, 32]") {
  return SyntheticJobSpec(mesh, hidden).Yaml();
}

TEST_F(CommandsTest, PlanWithoutWorkersUsesTheCoordinatorsAliveWorkers) {
  // The fake has one worker, w-0, with one device.
  const std::string two = WriteFile("two.yaml", GoodSpecYaml());
  EXPECT_EQ(PlanCommand(ctx_, two, ""), kExitUsage);
  EXPECT_EQ(err_.str().rfind("substraxctl: spec.mesh: data-parallel mesh of 2 devices, but only 1 "
                             "are available",
                             0),
            0u)
      << err_.str();
  EXPECT_NE(err_.str().find("the alive workers at " + ctx_.coordinator), std::string::npos);

  err_.str("");
  std::string one = GoodSpecYaml();
  one.replace(one.find("data_parallel_size: 2"), 21, "data_parallel_size: 1");
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("one.yaml", one), ""), kExitOk) << err_.str();
  EXPECT_NE(out_.str().find("mesh (data=1): 1 device on 1 host (w-0)\n"), std::string::npos)
      << out_.str();
  EXPECT_EQ(jobs_.submits(), 0);
}

TEST_F(CommandsTest, PlanOfAProgramJobIsItsMeshAndBatch) {
  const std::string path = WriteFile("program.yaml", R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: prog}
spec:
  program: {path: /opt/p/train, args: [--fast]}
  mesh: {data_parallel_size: 4}
  batch: {global_batch_size: 64}
)");
  ASSERT_EQ(PlanCommand(ctx_, path, "2x2"), kExitOk) << err_.str();
  EXPECT_EQ(err_.str(), "");
  EXPECT_THAT(out_.str(), HasSubstr("plan of job prog on 4 devices of --workers 2x2\n"
                                    "program: /opt/p/train --fast; 16 examples per device per "
                                    "step\n"));
  EXPECT_THAT(out_.str(), HasSubstr("mesh (data=4)"));
  EXPECT_THAT(out_.str(), HasSubstr("the program's own (not planned)"));
}

// A command job on `processes` with its settings.
std::string CommandJob(const std::string& processes) {
  return testing::JobSpecBuilder("cmd")
      .Command(absl::StrCat("{argv: [python, train.py], python_env: jax, processes: ", processes,
                            "}"))
      .DataParallel(4)
      .Set("steps", "100")
      .Set("metrics", "{loss: mean, tokens: sum}")
      .Yaml();
}

TEST_F(CommandsTest, PlanEnvShowsEachProcessOfAPerWorkerCommand) {
  const std::string path = WriteFile("cmd.yaml", CommandJob("per_worker"));
  ASSERT_EQ(PlanCommand(ctx_, path, "2x2", /*env=*/true), kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, StartsWith("environment of job cmd on 4 devices of --workers 2x2\n"
                              "command: python train.py (python_env jax, per_worker); 2 "
                              "processes (ports and the attempt dir are picked at launch)\n"
                              "\nrank 0: worker worker-0, devices 0, 1\n"
                              "  MASTER_ADDR=worker-0\n"
                              "  MASTER_PORT=<port picked at launch>\n"
                              "  RANK=0\n"
                              "  WORLD_SIZE=2\n"))
      << out;
  const std::string rank1 = out.substr(out.find("rank 1: worker worker-1, devices 2, 3\n"));
  for (const char* line :
       {"  MASTER_ADDR=worker-0\n", "  RANK=1\n", "  LOCAL_RANK=0\n", "  PET_NNODES=2\n",
        "  PET_MASTER_PORT=<port picked at launch>\n",
        "  JAX_COORDINATOR_ADDRESS=worker-0:<port picked at launch>\n",
        "  JAX_PROCESS_ID=1\n", "  JAX_NUM_CPU_DEVICES=2\n", "  SUBSTRAX_JOB_ID=cmd-<n>\n",
        "  SUBSTRAX_STEPS=100\n", "  SUBSTRAX_METRICS=loss=mean,tokens=sum\n",
        "  SUBSTRAX_MESH_FILE=<attempt dir>/mesh.json\n",
        "  SUBSTRAX_REPORT_FILE=<attempt dir>/report-0.jsonl\n",
        "  SUBSTRAX_ERROR_FILE=<attempt dir>/error-0.json\n"}) {
    EXPECT_THAT(rank1, HasSubstr(line));
  }
  EXPECT_EQ(jobs_.submits(), 0);

  // The same as data.
  out_.str("");
  ctx_.format = OutputFormat::kJson;
  ASSERT_EQ(PlanCommand(ctx_, path, "2x2", /*env=*/true), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("\"worker_id\": \"worker-1\""));
  EXPECT_THAT(out_.str(), HasSubstr("\"MASTER_ADDR=worker-0\",\n"));
}

TEST_F(CommandsTest, PlanEnvOfAPerDeviceCommandHasARankPerDevice) {
  const std::string path = WriteFile("cmd.yaml", CommandJob("per_device"));
  ASSERT_EQ(PlanCommand(ctx_, path, "2x2", /*env=*/true), kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_THAT(out, HasSubstr("per_device); 4 processes"));
  const std::string rank3 = out.substr(out.find("rank 3: worker worker-1, device 3\n"));
  for (const char* line : {"  RANK=3\n", "  WORLD_SIZE=4\n", "  LOCAL_RANK=1\n",
                           "  LOCAL_WORLD_SIZE=2\n", "  GROUP_RANK=1\n",
                           "  SUBSTRAX_REPORT_FILE=<attempt dir>/report-1.jsonl\n"}) {
    EXPECT_THAT(rank3, HasSubstr(line));
  }
}

TEST_F(CommandsTest, PlanEnvOnTheCoordinatorsWorkersUsesTheirAddresses) {
  // The fake's one worker, w-0 (one device), registered no address: its host stands in.
  std::string one = CommandJob("per_worker");
  one.replace(one.find("data_parallel_size: 4"), 21, "data_parallel_size: 1");
  ASSERT_EQ(PlanCommand(ctx_, WriteFile("one.yaml", one), "", /*env=*/true), kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("rank 0: worker w-0, device 0\n  MASTER_ADDR=w-0\n"));
  EXPECT_EQ(AddressHost("10.0.0.7:7000"), "10.0.0.7");
  EXPECT_EQ(AddressHost("[fd00::7]:7000"), "fd00::7");
  EXPECT_EQ(AddressHost("fd00::7"), "fd00::7");
  EXPECT_EQ(AddressHost("gpu-3"), "gpu-3");
}

TEST_F(CommandsTest, PlanEnvRefusesAJobWithoutACommand) {
  const std::string path = WriteFile("two.yaml", GoodSpecYaml());
  EXPECT_EQ(PlanCommand(ctx_, path, "2x2", /*env=*/true), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--env: job demo has no spec.command; --env shows the "
                                    "environment of a command job's processes"));
  EXPECT_EQ(out_.str(), "");
}

TEST_F(CommandsTest, PlanHybridExampleOnTwoWorkersOfTwo) {
  if (!std::ifstream(kFashionMnist).good()) {
    GTEST_SKIP() << kFashionMnist << " is not installed (Debian's dataset-fashion-mnist)";
  }
  ASSERT_EQ(PlanCommand(ctx_, kHybridExample, "2x2"), kExitOk) << err_.str();
  EXPECT_EQ(err_.str(), "");
  EXPECT_EQ(out_.str(),
            R"(plan of job fashion-mnist-mlp-hybrid on 4 devices of --workers 2x2
model: mlp 784 -> 512 -> 256 -> 10 (535818 parameters, 2.04 MiB), adam; 64 examples per device per step

mesh (data=2, model=2): 4 devices on 2 hosts (worker-0, worker-1)
          model=0            model=1
  data=0  d0 worker-0/cpu:0  d1 worker-0/cpu:1
  data=1  d2 worker-1/cpu:0  d3 worker-1/cpu:1

  PARAMETER        GLOBAL SHAPE   SPEC              SHARD SHAPE   SHARD BYTES   REPLICAS   GRADIENT REDUCED OVER
  dense_0/kernel   (784, 512)     (None, 'model')   (784, 256)    784 KiB       2          data
  dense_0/bias     (512,)         ('model',)        (256,)        1.00 KiB      2          data
  dense_1/kernel   (512, 256)     ('model', None)   (256, 256)    256 KiB       2          data
  dense_1/bias     (256,)         ()                (256,)        1.00 KiB      4          data, model
  dense_2/kernel   (256, 10)      ()                (256, 10)     10.0 KiB      4          data, model
  dense_2/bias     (10,)          ()                (10,)         40 B          4          data, model

  MEMORY PER DEVICE   BYTES      HOW
  parameters          1.03 MiB   this device's blocks, float32
  gradients           1.03 MiB   as parameters
  optimizer state     2.05 MiB   adam: 2 x parameters
  activations         261 KiB    2 x batch 64 x (256 + 256 + 10) x 4 B, forward and backward
  total               4.36 MiB

  AXIS    GROUP   ALL-REDUCE PER STEP          COUNT   BYTES PER DEVICE
  data    2       gradients (mean)             6       1.03 MiB
  model   2       gradients (mean)             3       11.0 KiB
  model   2       activations, forward (sum)   1       64.0 KiB
)");
}

TEST_F(CommandsTest, PlanHybridExampleAsJsonAndYaml) {
  if (!std::ifstream(kFashionMnist).good()) {
    GTEST_SKIP() << kFashionMnist << " is not installed (Debian's dataset-fashion-mnist)";
  }
  ctx_.format = OutputFormat::kJson;
  ASSERT_EQ(PlanCommand(ctx_, kHybridExample, "2x2"), kExitOk) << err_.str();
  const std::string json = out_.str();
  EXPECT_THAT(json, StartsWith("{\n  \"job\": \"fashion-mnist-mlp-hybrid\",\n  \"mesh\": {\n"));
  EXPECT_THAT(json, HasSubstr(R"j("name": "dense_0/kernel",
      "global_shape": [784, 512],
      "partition_spec": "(None, 'model')",
      "shard_shape": [784, 256],
      "shard_bytes": 802816,
      "replicas": 2,
      "gradient_axes": ["data"])j"));
  EXPECT_THAT(json, HasSubstr("\"model_param_bytes\": 2143272,"));
  EXPECT_THAT(json, HasSubstr("\"activations\": 267264,"));

  out_.str("");
  ctx_.format = OutputFormat::kYaml;
  ASSERT_EQ(PlanCommand(ctx_, kHybridExample, "2x2"), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), StartsWith("job: fashion-mnist-mlp-hybrid\nmesh:\n"));
  EXPECT_THAT(out_.str(), HasSubstr("    partition_spec: (None, 'model')\n"));
}

TEST_F(CommandsTest, PlanMeshesTheDevicesCannotHoldFailAsSubmitWouldWithExitTwo) {
  struct Case {
    std::string mesh;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"{data_parallel_size: 8}",
            "substraxctl: spec.mesh: data-parallel mesh of 8 devices, but only 4 are available"},
           {"{num_devices: 4}",
            "substraxctl: spec.mesh: model-parallel mesh of 4 devices must lie on one host"},
       }) {
    out_.str("");
    err_.str("");
    EXPECT_EQ(PlanCommand(ctx_, WriteFile("mesh.yaml", SyntheticJob(c.mesh)), "2x2"), kExitUsage)
        << c.mesh;
    EXPECT_THAT(err_.str(), StartsWith(c.message));
    EXPECT_THAT(err_.str(), HasSubstr("job demo cannot run on the 4 devices of --workers 2x2"));
    EXPECT_EQ(out_.str(), "");
  }
  // Cross-host placement when the spec asks for it.
  EXPECT_EQ(PlanCommand(ctx_,
                        WriteFile("cross.yaml", SyntheticJob("{num_devices: 4, "
                                                             "allow_cross_host_model_axis: true}")),
                        "2x2"),
            kExitOk)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("mesh (model=4): 4 devices on 2 hosts (worker-0, worker-1)"));

  // A width the model axis does not divide: the spec itself is invalid, with its field path.
  err_.str("");
  const std::string path = WriteFile(
      "odd.yaml",
      SyntheticJob("{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}", "[63, 32]"));
  EXPECT_EQ(PlanCommand(ctx_, path, "2x2"), kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("substraxctl: invalid job spec:\n" + path + ":"));
  EXPECT_THAT(err_.str(),
              HasSubstr("spec.model.hidden_sizes[0]: 63 does not divide over the model axis"));
}

TEST_F(CommandsTest, PlanUnreadableDataNamesTheFileAndWhereToRun) {
  const std::string spec =
      SyntheticJobSpec("{data_parallel_size: 2}")
          .Data("idx",
                {{"train",
                  "{images: /nonexistent/train-images.gz, labels: /nonexistent/train-labels.gz}"}})
          .Yaml();
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("idx.yaml", spec), "2x2"), kExitError) << err_.str();
  EXPECT_THAT(err_.str(), StartsWith("substraxctl: spec.data.train.images: cannot read "
                                     "/nonexistent/train-images.gz ("));
  EXPECT_THAT(err_.str(), HasSubstr("run this where the data is"));
}

TEST_F(CommandsTest, PlanBadWorkersFlagIsUsage) {
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("ok.yaml", SyntheticJob("{data_parallel_size: 2}")), "2"),
            kExitUsage);
  EXPECT_THAT(err_.str(), StartsWith("substraxctl: --workers: '2' is not WORKERSxDEVICES"));
}

TEST_F(CommandsTest, PlanWithoutWorkersAndAnUnreachableCoordinatorSuggestsTheFlag) {
  server_->Shutdown();
  EXPECT_EQ(PlanCommand(ctx_, WriteFile("ok.yaml", SyntheticJob("{data_parallel_size: 2}")), ""),
            kExitUnreachable);
  EXPECT_THAT(err_.str(), HasSubstr("cannot reach the coordinator at " + ctx_.coordinator));
  EXPECT_THAT(err_.str(), HasSubstr("--workers 2x2"));
}

}  // namespace
}  // namespace substrax::ctl
