// Checkpoints from the step loop, in one process with real device threads and Gloo: a resumed
// run ends bitwise equal to an uninterrupted one; a checkpoint restores onto other meshes; a
// damaged or half-written checkpoint is skipped for the previous one; directories outside the
// checkpoint roots and checkpoints of another model are refused; a failed write fails the job.
#include "worker/runtime/checkpointing.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "core/job_spec_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/commit.h"
#include "worker/collectives/store.h"
#include "worker/runtime/trainer.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The job of these tests: an mlp on synthetic data on `mesh` for `steps` steps.
testing::JobSpecBuilder Job(const std::string& mesh, int steps) {
  testing::JobSpecBuilder job("checkpointed");
  job.Model("{type: mlp, hidden_sizes: [32, 16], num_classes: 5}")
      .SyntheticData(
          "{task: classification, num_train_examples: 2048, num_test_examples: 512, "
          "num_features: 20, noise: 0.5}")
      .Optimizer("{type: adam, learning_rate: 0.003}")
      .Mesh(mesh)
      .Batch("{global_batch_size: 64}")
      .Steps(steps)
      .Set("seed", "42")
      .Set("report_every_steps", "10");
  return job;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

// The job with spec.checkpoint `checkpoint` ("": none).
v1::JobSpec Spec(const std::string& mesh, int steps, const std::string& checkpoint) {
  return Job(mesh, steps).Set("checkpoint", checkpoint).Proto();
}

constexpr char kHybrid[] = "{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}";
constexpr char kFourData[] = "{data_parallel_size: 4}";
constexpr char kOneDevice[] = "{data_parallel_size: 1}";

struct TrainRun {
  absl::StatusOr<TrainResult> result = absl::UnknownError("not run");
  std::vector<v1::CheckpointResume> resumes;
  std::vector<v1::CheckpointListing> listings;
};

TrainRun TrainInProcess(const v1::JobSpec& spec, std::optional<std::vector<std::string>> roots =
                                                std::nullopt) {
  TrainRun run;
  absl::StatusOr<Mesh> mesh =
      CreateMeshForJob(spec.mesh(), MakeUniformCluster(1, static_cast<int>(RequiredDevices(spec))));
  if (!mesh.ok()) {
    run.result = mesh.status();
    return run;
  }
  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = spec;
  options.process_of_position.assign(mesh->size(), 0);
  options.store = &store;
  options.checkpoint_roots = std::move(roots);
  options.on_resume = [&run](const v1::CheckpointResume& r) { run.resumes.push_back(r); };
  options.on_checkpoint = [&run](const v1::CheckpointListing& l) { run.listings.push_back(l); };
  run.result = Train(options);
  return run;
}

// spec.checkpoint: every 10 steps into `dir`.
std::string Every10(const std::string& dir) {
  return absl::StrCat("{directory: ", dir, ", every_steps: 10}");
}

void ExpectBitwiseEqual(const TensorTree& a, const TensorTree& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    ASSERT_EQ(b.count(name), 1u) << name;
    ASSERT_EQ(t.shape(), b.at(name).shape()) << name;
    for (int64_t i = 0; i < t.size(); ++i) {
      ASSERT_EQ(t.data()[i], b.at(name).data()[i]) << name << "[" << i << "]";
    }
  }
}

double MaxAbsDiff(const TensorTree& a, const TensorTree& b) {
  double worst = 0;
  for (const auto& [name, t] : a) {
    for (int64_t i = 0; i < t.size(); ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(t.data()[i]) - b.at(name).data()[i]));
    }
  }
  return worst;
}

// The parameters a checkpoint holds, whole, by parameter name.
TensorTree SavedParams(const std::string& dir) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  absl::StatusOr<TensorTree> arrays =
      reader.ok() ? reader->ReadArrays("params/") : reader.status();
  EXPECT_TRUE(arrays.ok()) << arrays.status();
  TensorTree params;
  if (arrays.ok()) {
    for (auto& [name, t] : *arrays) params[name.substr(7)] = std::move(t);
  }
  return params;
}

TEST(CheckpointingTest, ResumedRunEndsBitwiseEqualToAnUninterruptedOne) {
  const std::string uninterrupted = TempDir("uninterrupted");
  TrainRun full = TrainInProcess(Spec(kHybrid, 40, Every10(uninterrupted)));
  ASSERT_TRUE(full.result.ok()) << full.result.status();
  // Started fresh (an empty directory), committed at 10, 20, 30, 40.
  ASSERT_EQ(full.resumes.size(), 1u);
  EXPECT_EQ(full.resumes[0].step(), 0);
  ASSERT_EQ(full.listings.size(), 4u);
  ASSERT_EQ(full.listings.back().checkpoints_size(), 4);
  EXPECT_EQ(full.listings.back().checkpoints(0).step(), 40);
  EXPECT_EQ(full.listings.back().checkpoints(0).mesh(), "(data=2, model=2)");
  EXPECT_GT(full.listings.back().checkpoints(0).size_bytes(), 0);

  // Interrupted after 25 steps (the last checkpoint is the one at the end), then the same job
  // again: it resumes at 25, mid-interval, and must end exactly where the uninterrupted one did.
  const std::string interrupted = TempDir("interrupted");
  TrainRun first = TrainInProcess(Spec(kHybrid, 25, Every10(interrupted)));
  ASSERT_TRUE(first.result.ok()) << first.result.status();
  EXPECT_EQ(ListCheckpoints(interrupted).front().step, 25);
  TrainRun resumed = TrainInProcess(Spec(kHybrid, 40, Every10(interrupted)));
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  ASSERT_EQ(resumed.resumes.size(), 1u);
  EXPECT_EQ(resumed.resumes[0].step(), 25);
  EXPECT_EQ(resumed.result->resumed_from_step, 25);
  ExpectBitwiseEqual(resumed.result->params, full.result->params);
  EXPECT_EQ(resumed.result->evaluation, full.result->evaluation);
  // And the final checkpoint holds those parameters.
  ExpectBitwiseEqual(SavedParams(CommittedCheckpointDir(interrupted, 40)), full.result->params);
}

// Under the sharded update each device keeps its optimizer state current in its own block only:
// what it saves must still be the whole state, the same as without sharding, and a resumed
// sharded run must end exactly where an uninterrupted unsharded one does. Three devices: the
// blocks split parameters unevenly.
TEST(CheckpointingTest, TheShardedUpdateSavesAndResumesTheWholeState) {
  // The batch of 64 does not divide over 3 devices: 96.
  auto spec = [](int steps, const std::string& dir, bool sharded) {
    return Job("{data_parallel_size: 3}", steps)
        .Batch("{global_batch_size: 96}")
        .Set("checkpoint", Every10(dir))
        .Set("gradients", sharded ? "{shard_update: true}" : "")
        .Proto();
  };
  const std::string plain_dir = TempDir("unsharded");
  TrainRun plain = TrainInProcess(spec(40, plain_dir, false));
  ASSERT_TRUE(plain.result.ok()) << plain.result.status();

  const std::string sharded_dir = TempDir("sharded");
  TrainRun interrupted = TrainInProcess(spec(25, sharded_dir, true));
  ASSERT_TRUE(interrupted.result.ok()) << interrupted.result.status();
  for (const char* prefix : {"params/", "optimizer/"}) {
    SCOPED_TRACE(prefix);
    absl::StatusOr<CheckpointReader> a =
        CheckpointReader::Open(CommittedCheckpointDir(sharded_dir, 20));
    absl::StatusOr<CheckpointReader> b =
        CheckpointReader::Open(CommittedCheckpointDir(plain_dir, 20));
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    absl::StatusOr<TensorTree> sharded_arrays = a->ReadArrays(prefix);
    absl::StatusOr<TensorTree> plain_arrays = b->ReadArrays(prefix);
    ASSERT_TRUE(sharded_arrays.ok()) << sharded_arrays.status();
    ASSERT_TRUE(plain_arrays.ok()) << plain_arrays.status();
    ExpectBitwiseEqual(*sharded_arrays, *plain_arrays);
  }

  TrainRun resumed = TrainInProcess(spec(40, sharded_dir, true));
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  EXPECT_EQ(resumed.result->resumed_from_step, 25);
  ExpectBitwiseEqual(resumed.result->params, plain.result->params);
  EXPECT_EQ(resumed.result->evaluation, plain.result->evaluation);
}

TEST(CheckpointingTest, ACheckpointRestoresOntoOtherMeshes) {
  const std::string source = TempDir("reshard_source");
  TrainRun full = TrainInProcess(Spec(kHybrid, 60, Every10(source)));
  ASSERT_TRUE(full.result.ok()) << full.result.status();
  const std::string step30 = CommittedCheckpointDir(source, 30);
  const TensorTree saved = SavedParams(step30);

  for (const char* mesh : {kFourData, kOneDevice}) {
    SCOPED_TRACE(mesh);
    // Resumed and not trained further: the parameters are the checkpoint's.
    v1::JobSpec at30 = Spec(mesh, 30, "");
    at30.set_resume_from(step30);
    TrainRun loaded = TrainInProcess(at30);
    ASSERT_TRUE(loaded.result.ok()) << loaded.result.status();
    EXPECT_EQ(loaded.result->resumed_from_step, 30);
    EXPECT_LE(MaxAbsDiff(loaded.result->params, saved), 1e-6);
    // Trained on to the end: as good as the uninterrupted run.
    v1::JobSpec on = Spec(mesh, 60, "");
    on.set_resume_from(step30);
    TrainRun continued = TrainInProcess(on);
    ASSERT_TRUE(continued.result.ok()) << continued.result.status();
    EXPECT_NEAR(continued.result->evaluation.at("test_accuracy"),
                full.result->evaluation.at("test_accuracy"), 0.01);
  }
}

TEST(CheckpointingTest, DamagedAndHalfWrittenCheckpointsAreSkippedForThePreviousOne) {
  const std::string dir = TempDir("damaged");
  ASSERT_TRUE(TrainInProcess(Spec(kFourData, 30, Every10(dir))).result.ok());
  // The newest shard file damaged, and a save that never finished.
  const std::string shard = CommittedCheckpointDir(dir, 30) + "/process-00000.safetensors";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  fs::create_directories(StagingCheckpointDir(dir, 40));
  std::ofstream(StagingCheckpointDir(dir, 40) + "/process-00000.safetensors") << "partial";

  TrainRun resumed = TrainInProcess(Spec(kFourData, 40, Every10(dir)));
  ASSERT_TRUE(resumed.result.ok()) << resumed.result.status();
  ASSERT_EQ(resumed.resumes.size(), 1u);
  EXPECT_EQ(resumed.resumes[0].step(), 20);
  ASSERT_EQ(resumed.resumes[0].skipped_size(), 1);
  EXPECT_THAT(resumed.resumes[0].skipped(0), HasSubstr("step 30"));
  EXPECT_THAT(resumed.resumes[0].skipped(0), HasSubstr("process-00000.safetensors"));
  EXPECT_EQ(ListCheckpoints(dir).front().step, 40);
}

TEST(CheckpointingTest, RefusesWhatItCannotUse) {
  const std::string dir = TempDir("refused");
  // Outside the checkpoint roots.
  TrainRun outside = TrainInProcess(Spec(kFourData, 10, Every10(dir)),
                               std::vector<std::string>{"/nonexistent-root"});
  EXPECT_EQ(outside.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.result.status().message(), HasSubstr("not under a checkpoint root"));
  // Through a symbolic link out of the root.
  const std::string root = TempDir("root");
  fs::create_directory_symlink(dir, root + "/escape");
  TrainRun linked = TrainInProcess(Spec(kFourData, 10, Every10(root + "/escape/x")),
                              std::vector<std::string>{root});
  EXPECT_THAT(linked.result.status().message(), HasSubstr("symbolic link"));

  // A checkpoint of another model.
  ASSERT_TRUE(TrainInProcess(Spec(kFourData, 10, Every10(dir))).result.ok());
  v1::JobSpec wider = Spec(kFourData, 20, "");
  wider.mutable_model()->set_hidden_sizes(0, 48);
  wider.set_resume_from(dir);
  TrainRun other = TrainInProcess(wider);
  EXPECT_EQ(other.result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(other.result.status().message()),
              HasSubstr("of shape (32), but this job's model has (48)"));

  // resume_from with nothing in it.
  v1::JobSpec empty = Spec(kFourData, 10, "");
  empty.set_resume_from(TempDir("empty"));
  EXPECT_EQ(TrainInProcess(empty).result.status().code(), absl::StatusCode::kNotFound);
}

TEST(CheckpointingTest, AWriteThatFailsFailsTheJob) {
  // A directory that cannot be created (beneath a regular file): the job must not succeed.
  const std::string dir = TempDir("unwritable");
  std::ofstream(dir + "/file") << "x";
  TrainRun run = TrainInProcess(Spec(kFourData, 20, Every10(dir + "/file/checkpoints")));
  ASSERT_FALSE(run.result.ok());
  EXPECT_THAT(run.result.status().message(), HasSubstr("cannot create"));
}

}  // namespace
}  // namespace substrax
