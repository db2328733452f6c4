// Checkpoints with real processes: a coordinator, worker daemons and their runners.
//
//   - A runner killed at ~60% of a job that checkpoints every 100 steps: the next attempt resumes
//     from the last checkpoint (get shows the step) and the job's final parameters equal an
//     uninterrupted run's bit for bit (same mesh, CPU).
//   - A (2, 2) checkpoint resumed on (4, 1) and on 1 device trains on to the uninterrupted run's
//     accuracy (within 0.01); a damaged newest checkpoint and a half-written one are skipped for
//     the previous one, and the transition says so.
//   - Elastic: a job with data_parallel_size {min: 2, max: 4} on two workers loses one for good
//     and the next attempt runs on the remaining two devices from the checkpoint, and succeeds.
//   - A full disk (a small tmpfs, or RLIMIT_FSIZE where no tmpfs can be mounted) fails the job
//     with a clear error instead of reporting SUCCEEDED without its checkpoint.
// Each ends with the /proc check that no process outlived its purpose.
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"
#include "worker/checkpoint/commit.h"
#include "worker/checkpoint/sharded.h"

namespace substrax::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr char kJob[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: NAME}
spec:
  model: {type: mlp, hidden_sizes: [64, 64], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 8192, num_test_examples: 2048,
                num_features: 32, noise: 2.0}
  optimizer: {type: adam, learning_rate: 0.003}
  mesh: MESH
  batch: {global_batch_size: 128}
  steps: STEPS
  seed: 7
  report_every_steps: 50
  max_restarts: 2
  EXTRA
)";

constexpr char kHybrid[] = "{type: hybrid, data_parallel_size: 2, model_parallel_size: 2}";

std::string Job(const std::string& name, const std::string& mesh, int steps,
                const std::string& extra) {
  return absl::StrReplaceAll(kJob, {{"NAME", name},
                                    {"MESH", mesh},
                                    {"STEPS", absl::StrCat(steps)},
                                    {"EXTRA", extra}});
}

std::string Checkpointed(const std::string& dir) {
  return absl::StrCat("checkpoint: {directory: ", dir, ", every_steps: 100}");
}

// The parameters a committed checkpoint holds, whole, by array name.
TensorTree SavedParams(const std::string& dir) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  absl::StatusOr<TensorTree> params =
      reader.ok() ? reader->ReadArrays("params/") : reader.status();
  EXPECT_TRUE(params.ok()) << params.status();
  return params.ok() ? *std::move(params) : TensorTree();
}

bool BitwiseEqual(const TensorTree& a, const TensorTree& b, std::string* where) {
  if (a.size() != b.size() || a.empty()) {
    *where = absl::StrCat(a.size(), " vs ", b.size(), " arrays");
    return false;
  }
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape() != t.shape()) {
      *where = name;
      return false;
    }
    for (int64_t i = 0; i < t.size(); ++i) {
      if (t.data()[i] != it->second.data()[i]) {
        *where = absl::StrCat(name, "[", i, "]: ", t.data()[i], " vs ", it->second.data()[i]);
        return false;
      }
    }
  }
  return true;
}

std::optional<v1::Job> RunToEnd(ChaosCluster& cluster, const std::string& yaml) {
  const std::string id = cluster.Submit(yaml);
  EXPECT_EQ(id.rfind("error", 0), std::string::npos) << id;
  if (id.rfind("error", 0) == 0) return std::nullopt;
  return cluster.WaitForEnd(id, absl::Minutes(3));
}

// Waits for `job` to report at least `step`, then kills one of its runners. False when the job
// ended or no runner was found first.
bool KillARunnerAt(ChaosCluster& cluster, const std::string& job, int64_t step) {
  const bool reached = PollUntil(
      [&] {
        std::optional<v1::Job> now = cluster.Get(job);
        return now.has_value() && (now->progress().step() >= step ||
                                   now->state() != v1::JOB_STATE_RUNNING);
      },
      absl::Minutes(2));
  std::optional<v1::Job> now = cluster.Get(job);
  if (!reached || !now.has_value() || now->state() != v1::JOB_STATE_RUNNING) return false;
  for (const RunnerProcess& r : RunnersUnder(cluster.dir())) {
    if (r.launch.find(job + "-attempt-1-process-1") != std::string::npos) {
      kill(r.pid, SIGKILL);
      return true;
    }
  }
  return false;
}

std::string Reasons(const v1::Job& job) {
  std::string out;
  for (const v1::JobTransition& t : job.transitions()) absl::StrAppend(&out, t.reason(), "\n");
  return out;
}

TEST(CheckpointTest, AKilledRunnerResumesAndEndsBitwiseEqualAndCheckpointsReshard) {
  const std::string root = TempDir("checkpoint_root");
  ChaosClusterOptions options;
  options.coordinator_flags = {"--restart-backoff", "1s"};
  options.worker_flags = {"--checkpoint-root", root};
  ChaosCluster cluster("checkpoint", options);
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();

  // The uninterrupted run. On an --insecure cluster every job's owner is "anonymous": its
  // checkpoints go in <root>/anonymous.
  const std::string clean_dir = root + "/anonymous/clean";
  std::optional<v1::Job> clean =
      RunToEnd(cluster, Job("clean", kHybrid, 1000, Checkpointed(clean_dir)));
  ASSERT_TRUE(clean.has_value() && clean->state() == v1::JOB_STATE_SUCCEEDED)
      << (clean ? clean->DebugString() : "") << cluster.Logs();
  EXPECT_EQ(clean->attempt(), 1);
  ASSERT_EQ(clean->checkpoints_size(), 10);  // 100, ..., 1000: every one kept
  EXPECT_EQ(clean->checkpoints(0).step(), 1000);

  // The same job, one runner killed at ~60%.
  const std::string killed_dir = root + "/anonymous/killed";
  const std::string killed = cluster.Submit(Job("killed", kHybrid, 1000, Checkpointed(killed_dir)));
  ASSERT_TRUE(KillARunnerAt(cluster, killed, 600)) << cluster.Logs();
  std::optional<v1::Job> resumed = cluster.WaitForEnd(killed, absl::Minutes(3));
  ASSERT_TRUE(resumed.has_value() && resumed->state() == v1::JOB_STATE_SUCCEEDED)
      << (resumed ? resumed->DebugString() : "") << cluster.Logs();
  EXPECT_EQ(resumed->attempt(), 2);
  // The save of step 600 may still be in flight when the runner dies: 500 or later.
  EXPECT_GE(resumed->resumed_from_step(), 500);
  EXPECT_LT(resumed->resumed_from_step(), 1000);
  EXPECT_THAT(Reasons(*resumed),
              HasSubstr(absl::StrCat("attempt 2 resumed from the checkpoint of step ",
                                     resumed->resumed_from_step())));
  std::string where;
  EXPECT_TRUE(BitwiseEqual(SavedParams(CommittedCheckpointDir(killed_dir, 1000)),
                           SavedParams(CommittedCheckpointDir(clean_dir, 1000)), &where))
      << where;
  EXPECT_EQ(resumed->progress().final_metrics().at("test_accuracy"),
            clean->progress().final_metrics().at("test_accuracy"));

  // The (2, 2) checkpoint of step 500 on (4, 1) and on one device, trained on to the end.
  const double accuracy = clean->progress().final_metrics().at("test_accuracy");
  for (const char* mesh : {"{data_parallel_size: 4}", "{data_parallel_size: 1}"}) {
    SCOPED_TRACE(mesh);
    std::optional<v1::Job> other = RunToEnd(
        cluster, Job("reshard", mesh, 1000,
                     absl::StrCat("resume_from: ", CommittedCheckpointDir(clean_dir, 500))));
    ASSERT_TRUE(other.has_value() && other->state() == v1::JOB_STATE_SUCCEEDED)
        << (other ? other->DebugString() : "") << cluster.Logs();
    EXPECT_EQ(other->resumed_from_step(), 500);
    EXPECT_NEAR(other->progress().final_metrics().at("test_accuracy"), accuracy, 0.01);
  }

  // The newest checkpoint damaged and a newer save half-written: the previous one is used.
  {
    std::fstream shard(CommittedCheckpointDir(clean_dir, 1000) + "/process-00001.safetensors",
                       std::ios::in | std::ios::out | std::ios::binary);
    shard.seekp(-5, std::ios::end);
    shard.put('\x55');
  }
  fs::create_directories(StagingCheckpointDir(clean_dir, 1100));
  std::ofstream(StagingCheckpointDir(clean_dir, 1100) + "/process-00000.safetensors") << "half";
  std::optional<v1::Job> skipping = RunToEnd(
      cluster, Job("skipping", kHybrid, 1000, absl::StrCat("resume_from: ", clean_dir)));
  ASSERT_TRUE(skipping.has_value() && skipping->state() == v1::JOB_STATE_SUCCEEDED)
      << (skipping ? skipping->DebugString() : "") << cluster.Logs();
  EXPECT_EQ(skipping->resumed_from_step(), 900);
  EXPECT_THAT(Reasons(*skipping), HasSubstr("skipped step 1000: "));
  EXPECT_THAT(Reasons(*skipping), HasSubstr("process-00001.safetensors"));

  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(CheckpointTest, AnElasticJobLosesAWorkerForGoodAndSucceedsOnTheRest) {
  const std::string root = TempDir("elastic_root");
  ChaosClusterOptions options;
  // The restart is due after the lost worker's lease (3 s) has expired: it is planned on what
  // is alive then.
  options.coordinator_flags = {"--restart-backoff", "5s"};
  options.worker_flags = {"--checkpoint-root", root};
  ChaosCluster cluster("elastic", options);
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();

  const std::string job = cluster.Submit(Job("elastic", "{data_parallel_size: {min: 2, max: 4}}",
                                             1000, Checkpointed(root + "/anonymous/elastic")));
  ASSERT_EQ(job.rfind("error", 0), std::string::npos) << job;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> now = cluster.Get(job);
        return now.has_value() && now->checkpoints_size() >= 3;
      },
      absl::Minutes(2)))
      << cluster.Logs();
  ASSERT_EQ(cluster.Get(job)->mesh().devices_size(), 4);
  // Worker 2's daemon dies for good; its runner goes with it (PR_SET_PDEATHSIG).
  cluster.worker(1).Signal(SIGKILL);
  std::optional<v1::Job> done = cluster.WaitForEnd(job, absl::Minutes(3));
  ASSERT_TRUE(done.has_value() && done->state() == v1::JOB_STATE_SUCCEEDED)
      << (done ? done->DebugString() : "") << cluster.Logs();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_EQ(done->mesh().devices_size(), 2);
  EXPECT_GE(done->resumed_from_step(), 300);
  EXPECT_THAT(Reasons(*done), HasSubstr("elastic: data axis 2 of at most 4"));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

// Runs a job whose first checkpoint does not fit: on a 128 KiB tmpfs seen by the daemon and
// its runners only, or (tmpfs false) with the daemon's files limited to 128 KiB (RLIMIT_FSIZE).
void ExpectFullDiskFailsTheJob(bool tmpfs) {
  const std::string root = TempDir(tmpfs ? "tmpfs_root" : "fsize_root");
  ChaosClusterOptions options;
  options.workers = 1;
  options.worker_flags = {"--checkpoint-root", root};
  if (tmpfs) {
    options.worker_wrapper = {"/usr/bin/unshare", "-m", "/bin/sh", "-c",
                              absl::StrCat("mount -t tmpfs -o size=128k tmpfs ", root,
                                           " && exec \"$@\""),
                              "sh"};
  } else {
    options.worker_wrapper = {"/usr/bin/prlimit", absl::StrCat("--fsize=", 128 * 1024), "--"};
  }
  ChaosCluster cluster(tmpfs ? "tmpfs_full" : "fsize_full", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(30))) << cluster.Logs();
  // Adam's state of this model is ~500 KiB per checkpoint: the first save does not fit.
  const std::string yaml =
      absl::StrReplaceAll(Job("full", "{data_parallel_size: 2}", 300,
                              Checkpointed(root + "/anonymous/full")),
                          {{"hidden_sizes: [64, 64]", "hidden_sizes: [256, 128]"},
                           {"max_restarts: 2", "max_restarts: 0"}});
  std::optional<v1::Job> job = RunToEnd(cluster, yaml);
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << job->DebugString();
  EXPECT_THAT(job->error(), HasSubstr("process-00000.safetensors"));
  EXPECT_THAT(job->error(), HasSubstr(tmpfs ? "No space left on device" : "File too large"));
  EXPECT_EQ(job->checkpoints_size(), 0);
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(CheckpointTest, AFullFileSystemFailsTheJobClearly) {
  const std::string probe = TempDir("tmpfs_probe");
  const CommandResult mounted = substrax::testing::Run(
      {"/usr/bin/unshare", "-m", "/bin/sh", "-c",
                                     absl::StrCat("mount -t tmpfs -o size=64k tmpfs ", probe)},
                                    absl::Seconds(10));
  if (mounted.exit_code != 0) {
    // AFileSizeLimitFailsTheJobClearly covers the same path without a mount.
    if (InCi()) FAIL() << "CI must be able to mount a tmpfs in a mount namespace: " << mounted.err;
    GTEST_SKIP() << "cannot mount a tmpfs here: " << mounted.err;
  }
  ExpectFullDiskFailsTheJob(/*tmpfs=*/true);
}

TEST(CheckpointTest, AFileSizeLimitFailsTheJobClearly) { ExpectFullDiskFailsTheJob(false); }

}  // namespace
}  // namespace substrax::testing
