// The SDK's Init and Program, standalone and from a launch file (the daemon's side of the launch
// is tested with real daemons in tests/sdk and tests/).
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "substrax/device.h"
#include "substrax/device_mesh_manager.h"
#include "substrax/substrax.h"
#include "substrax/v1/program.pb.h"
#include "contract/launch.h"
#include "worker/sdk/program_impl.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() { unsetenv(name_); }

 private:
  const char* name_;
};

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

TEST(InitTest, StandaloneHasTheAskedDevicesInOneDataParallelMesh) {
  InitOptions options;
  options.standalone_devices = 3;
  absl::StatusOr<std::unique_ptr<Program>> program = Init(options);
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_TRUE((*program)->standalone());
  EXPECT_EQ((*program)->mesh().size(), 3);
  EXPECT_EQ((*program)->mesh().axis_names(), std::vector<std::string>{"data"});
  EXPECT_EQ((*program)->local_device_ids(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ((*program)->num_processes(), 1);
  EXPECT_EQ((*program)->settings().job_id, "standalone");
}

TEST(InitTest, DevicesEnvironmentVariableOverridesTheOptions) {
  ScopedEnv devices("SUBSTRAX_DEVICES", "2");
  absl::StatusOr<std::unique_ptr<Program>> program = Init();
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_EQ((*program)->mesh().size(), 2);
}

TEST(InitTest, BadDeviceCountsAreRefused) {
  {
    ScopedEnv devices("SUBSTRAX_DEVICES", "two");
    absl::StatusOr<std::unique_ptr<Program>> program = Init();
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(program.status().message(), HasSubstr("SUBSTRAX_DEVICES=two"));
  }
  InitOptions options;
  options.standalone_devices = 0;
  absl::StatusOr<std::unique_ptr<Program>> program = Init(options);
  EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(program.status().message(), HasSubstr("must be >= 1"));
}

TEST(InitTest, ProgramsBuiltAgainstAnotherMajorVersionAreRefused) {
  absl::StatusOr<std::unique_ptr<Program>> program =
      internal::InitForVersion(SUBSTRAX_VERSION_MAJOR + 1, 0, InitOptions());
  EXPECT_EQ(program.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(program.status().message(),
              HasSubstr(absl::StrCat("built against the substrax SDK ", SUBSTRAX_VERSION_MAJOR + 1,
                                     ".0 but runs with the SDK library ",
                                     SUBSTRAX_VERSION_STRING)));
  EXPECT_THAT(program.status().message(), HasSubstr("rebuild it"));
}

TEST(InitTest, LaunchFilesAreCheckedBeforeAnythingConnects) {
  {
    ScopedEnv launch("SUBSTRAX_LAUNCH", TempPath("no-such-launch"));
    absl::StatusOr<std::unique_ptr<Program>> program = Init();
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(program.status().message(), HasSubstr("cannot be read"));
  }
  const std::string garbage = TempPath("garbage-launch");
  std::ofstream(garbage) << "not a launch";
  {
    ScopedEnv launch("SUBSTRAX_LAUNCH", garbage);
    absl::StatusOr<std::unique_ptr<Program>> program = Init();
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(program.status().message(), HasSubstr("holds no launch"));
  }
  v1::ProgramLaunch other;
  other.set_sdk_version_major(SUBSTRAX_VERSION_MAJOR + 1);
  other.mutable_assignment()->set_job_id("j");
  const std::string newer = TempPath("newer-launch");
  std::ofstream(newer) << EncodeLaunch(other);
  ScopedEnv launch("SUBSTRAX_LAUNCH", newer);
  absl::StatusOr<std::unique_ptr<Program>> program = Init();
  EXPECT_EQ(program.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(program.status().message(),
              HasSubstr(absl::StrCat("agent that started this program speaks SDK ",
                                     SUBSTRAX_VERSION_MAJOR + 1)));
}

// A job's process calls the coordinator with its attempt's token only: a launch over TLS that
// carries none (a coordinator older than the agent) is refused before anything connects.
TEST(InitTest, ALaunchOverTlsWithoutAnAttemptTokenIsRefused) {
  std::vector<Device> devices = MakeUniformCluster(1, 1);
  for (Device& d : devices) d.worker_id = d.host;
  absl::StatusOr<Mesh> mesh = DeviceMeshManager::CreateDataParallelMesh(devices);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  v1::ProgramLaunch launch;
  launch.set_sdk_version_major(SUBSTRAX_VERSION_MAJOR);
  launch.mutable_assignment()->set_job_id("j");
  launch.mutable_assignment()->set_attempt(1);
  *launch.mutable_assignment()->mutable_mesh() = mesh->ToProto();
  launch.set_coordinator("127.0.0.1:1");
  launch.mutable_transport()->set_ca_file(TempPath("ca.crt"));
  absl::StatusOr<std::unique_ptr<ProgramImpl>> program =
      ProgramImpl::FromLaunchProto(launch);
  EXPECT_EQ(program.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(program.status().message(), HasSubstr("no attempt token"));
}

// Init makes the first SIGTERM a request to stop, which the program reads, instead of its end.
TEST(InitTest, AfterInitSigtermSetsStopRequested) {
  absl::StatusOr<std::unique_ptr<Program>> program = Init();
  ASSERT_TRUE(program.ok()) << program.status();
  EXPECT_FALSE(StopRequested());
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_TRUE(StopRequested());
}

TEST(ProgramTest, RunOnDevicesReducesAcrossTheLocalDevicesAndRunsOnce) {
  InitOptions options;
  options.standalone_devices = 2;
  std::unique_ptr<Program> program = *Init(options);
  std::vector<double> seen(2);
  absl::Status run = program->RunOnDevices([&](DeviceContext& ctx) -> absl::Status {
    absl::StatusOr<Metrics> mean = ReduceMean(ctx, {{"loss", 1.0 + ctx.device.id}});
    if (!mean.ok()) return mean.status();
    seen[ctx.device.id] = mean->at("loss");
    return program->ReportMetrics(ctx, 1, {{"loss", 1.0}});
  });
  ASSERT_TRUE(run.ok()) << run;
  EXPECT_EQ(seen, (std::vector<double>{1.5, 1.5}));
  EXPECT_EQ(program->RunOnDevices([](DeviceContext&) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(program->Finish(absl::OkStatus()), 0);
}

TEST(ProgramTest, ADeviceErrorNamesTheDeviceAndFinishReturnsOne) {
  std::unique_ptr<Program> program = *Init();
  absl::Status run = program->RunOnDevices(
      [](DeviceContext&) { return absl::NotFoundError("train.idx not found"); });
  EXPECT_EQ(run.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(run.message(), HasSubstr("train.idx not found"));
  EXPECT_THAT(run.message(), HasSubstr("device 0"));
  EXPECT_EQ(program->Finish(run), 1);
}

// Standalone, every printed report says the process's throughput: the devices' own measurements
// where they give them (summed over the devices), else the steps since the previous line times
// the global batch; Finish says it over the whole run.
TEST(ProgramTest, StandaloneReportsAndFinishPrintSamplesPerSecond) {
  InitOptions options;
  options.standalone_devices = 2;
  options.standalone_settings.global_batch_size = 64;
  std::unique_ptr<Program> program = *Init(options);
  ::testing::internal::CaptureStderr();
  absl::Status run = program->RunOnDevices([&](DeviceContext& ctx) -> absl::Status {
    absl::SleepFor(absl::Milliseconds(20));
    // Step 1 without timing; step 2 with 1000 samples/s measured on each device.
    if (absl::Status s = program->ReportMetrics(ctx, 1, {{"loss", 1.0}}); !s.ok()) return s;
    absl::SleepFor(absl::Milliseconds(20));
    ReportTiming timing;
    timing.samples_per_second = 1000;
    return program->ReportMetrics(ctx, 2, {{"loss", 0.5}}, timing);
  });
  const int exit_code = program->Finish(run);
  const std::string printed = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(run.ok()) << run;
  EXPECT_EQ(exit_code, 0);
  EXPECT_THAT(printed, ::testing::ContainsRegex("step 1 loss=1 samples/s=[1-9][0-9]*\n"));
  EXPECT_THAT(printed, HasSubstr("step 2 loss=0.5 samples/s=2000\n"));
  EXPECT_THAT(printed, ::testing::ContainsRegex(
                           "substrax: samples/s=[1-9][0-9]* \\(this process, over its reports "
                           "to step 2\\)"));
}

TEST(ProgramTest, ReportMetricsRefusesDevicesOfOtherProcessesAndBadNames) {
  std::unique_ptr<Program> program = *Init();
  DeviceContext stranger;
  stranger.device.id = 7;
  EXPECT_EQ(program->ReportMetrics(stranger, 1, {{"loss", 1}}).code(),
            absl::StatusCode::kInvalidArgument);
  DeviceContext mine;
  mine.device.id = 0;
  EXPECT_EQ(program->ReportMetrics(mine, 1, {{"", 1}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(program->ReportMetrics(mine, -1, {{"loss", 1}}).code(),
            absl::StatusCode::kInvalidArgument);
}

// A program's own model: y = w x + b, squared error, on fixed data.
absl::StatusOr<LossAndGrads> Linear(const TensorTree& params, const Batch& batch) {
  const float w = params.at("w").data()[0];
  const float b = params.at("b").data()[0];
  LossAndGrads out;
  double gw = 0, gb = 0;
  const int64_t n = batch.size();
  for (int64_t i = 0; i < n; ++i) {
    const double err = w * batch.inputs.data()[i] + b - batch.targets.data()[i];
    out.loss += err * err / n;
    gw += 2 * err * batch.inputs.data()[i] / n;
    gb += 2 * err / n;
  }
  out.grads["w"] = Tensor({1}, {static_cast<float>(gw)});
  out.grads["b"] = Tensor({1}, {static_cast<float>(gb)});
  return out;
}

TensorTree TrainLinear(int devices) {
  InitOptions options;
  options.standalone_devices = devices;
  std::unique_ptr<Program> program = *Init(options);
  Batch global;
  global.inputs = Tensor({8, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
  global.targets = Tensor({8, 1}, {1, 3, 5, 7, 9, 11, 13, 15});
  TensorTree result;
  absl::Status run = program->RunOnDevices([&](DeviceContext& ctx) -> absl::Status {
    TensorTree params = {{"w", Tensor({1}, {0.f})}, {"b", Tensor({1}, {0.f})}};
    absl::StatusOr<std::unique_ptr<Optimizer>> sgd = Optimizer::Create("sgd", 0.01);
    if (!sgd.ok()) return sgd.status();
    absl::StatusOr<NamedSharding> sharding = CreateDataParallelSharding(*ctx.mesh);
    if (!sharding.ok()) return sharding.status();
    absl::StatusOr<Batch> local = PlaceBatchOnShards(global, *sharding, ctx.device.id);
    if (!local.ok()) return local.status();
    for (int step = 0; step < 20; ++step) {
      absl::StatusOr<StepResult> r = SpmdTrainStep(ctx, Linear, **sgd, &params, *local);
      if (!r.ok()) return r.status();
    }
    if (ctx.device.id == 0) result = params;
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << run;
  return result;
}

TEST(ProgramTest, SpmdTrainStepOnAProgramsModelEqualsOneDevice) {
  const TensorTree one = TrainLinear(1);
  const TensorTree four = TrainLinear(4);
  for (const char* name : {"w", "b"}) {
    EXPECT_NEAR(four.at(name).data()[0], one.at(name).data()[0], 1e-6) << name;
  }
}

CheckpointOptions LinearCheckpoints(const std::string& dir) {
  CheckpointOptions options;
  options.directory = dir;
  options.shapes = {{"w", {1}}, {"b", {1}}};
  return options;
}

// Trains the linear model on `devices` devices from whatever `dir` holds, saving every 5 steps up
// to `steps`; returns device 0's parameters and the step it resumed from.
std::pair<TensorTree, int64_t> TrainLinearWithCheckpoints(int devices, const std::string& dir,
                                                          int steps) {
  InitOptions options;
  options.standalone_devices = devices;
  std::unique_ptr<Program> program = *Init(options);
  absl::Status configured = program->ConfigureCheckpoints(LinearCheckpoints(dir));
  EXPECT_TRUE(configured.ok()) << configured;
  Batch global;
  global.inputs = Tensor({8, 1}, {0, 1, 2, 3, 4, 5, 6, 7});
  global.targets = Tensor({8, 1}, {1, 3, 5, 7, 9, 11, 13, 15});
  TensorTree result;
  int64_t resumed = -1;
  absl::Status run = program->RunOnDevices([&](DeviceContext& ctx) -> absl::Status {
    TensorTree params = {{"w", Tensor({1}, {0.f})}, {"b", Tensor({1}, {0.f})}};
    std::unique_ptr<Optimizer> adam = *Optimizer::Create("adam", 0.05);
    absl::StatusOr<int64_t> first = program->RestoreCheckpoint(ctx, &params, *adam);
    if (!first.ok()) return first.status();
    absl::StatusOr<NamedSharding> sharding = CreateDataParallelSharding(*ctx.mesh);
    absl::StatusOr<Batch> local = PlaceBatchOnShards(global, *sharding, ctx.device.id);
    for (int64_t step = *first + 1; step <= steps; ++step) {
      absl::StatusOr<StepResult> r = SpmdTrainStep(ctx, Linear, *adam, &params, *local);
      if (!r.ok()) return r.status();
      if (step % 5 == 0) {
        absl::Status saved = program->SaveCheckpoint(ctx, step, params, *adam);
        if (!saved.ok()) return saved;
      }
    }
    if (ctx.device.id == 0) {
      result = params;
      resumed = *first;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(run.ok()) << run;
  EXPECT_EQ(program->Finish(run), 0);
  return {result, resumed};
}

TEST(CheckpointTest, AResumedRunEqualsAnUninterruptedOneOnAnyMesh) {
  const std::string straight = TempPath("linear-straight");
  const std::string split = TempPath("linear-split");
  const auto [uninterrupted, from_nothing] = TrainLinearWithCheckpoints(2, straight, 20);
  EXPECT_EQ(from_nothing, 0);
  // 10 steps on 2 devices, then the other 10 on 1 device and on 4 devices from the same
  // checkpoint directory (the second run commits step 20 there: a third resumes from 20).
  TrainLinearWithCheckpoints(2, split, 10);
  const auto [resumed, from] = TrainLinearWithCheckpoints(1, split, 20);
  EXPECT_EQ(from, 10);
  for (const char* name : {"w", "b"}) {
    EXPECT_NEAR(resumed.at(name).data()[0], uninterrupted.at(name).data()[0], 1e-6) << name;
  }
  const auto [again, from_end] = TrainLinearWithCheckpoints(4, split, 20);
  EXPECT_EQ(from_end, 20);
  for (const char* name : {"w", "b"}) {
    EXPECT_NEAR(again.at(name).data()[0], uninterrupted.at(name).data()[0], 1e-6) << name;
  }
}

TEST(CheckpointTest, MisuseIsRefusedWithWhatToDo) {
  std::unique_ptr<Program> program = *Init();
  DeviceContext ctx;
  TensorTree params = {{"w", Tensor({1}, {0.f})}};
  std::unique_ptr<Optimizer> sgd = *Optimizer::Create("sgd", 0.1);
  EXPECT_EQ(program->RestoreCheckpoint(ctx, &params, *sgd).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(program->SaveCheckpoint(ctx, 1, params, *sgd).code(),
            absl::StatusCode::kFailedPrecondition);
  absl::Status relative = program->ConfigureCheckpoints(LinearCheckpoints("relative/dir"));
  EXPECT_EQ(relative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(relative.message(), HasSubstr("relative/dir"));
  CheckpointOptions no_shapes;
  no_shapes.directory = TempPath("no-shapes");
  EXPECT_EQ(program->ConfigureCheckpoints(no_shapes).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(program->ConfigureCheckpoints(CheckpointOptions()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace substrax
