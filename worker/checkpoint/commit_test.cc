#include "worker/checkpoint/commit.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    layout_ = *NamedSharding::Create(mesh_, PartitionSpec::Of({"data"}))->Layout({4});
  }

  // Process p's half of array "w" at `step`: step + its global index.
  std::map<std::string, LocalArray> Half(int p, int64_t step, Tensor* storage) {
    *storage = Tensor({2}, {static_cast<float>(step + 2 * p), static_cast<float>(step + 2 * p + 1)});
    return {{"w", {layout_, {{p, storage}}}}};
  }

  // Both processes write their files; process 0 commits unless `commit` is false.
  absl::Status Save(int64_t step, int processes = 2, bool commit = true,
                    const std::string& job_id = "") {
    std::vector<v1::CheckpointFile> entries;
    Tensor storage[2];
    std::map<std::string, LocalArray> all = {{"w", {layout_, {}}}};
    for (int p = 0; p < processes; ++p) {
      absl::StatusOr<ProcessShards> shards = EncodeProcessShards(p, Half(p, step, &storage[p]));
      if (!shards.ok()) return shards.status();
      if (absl::Status s = WriteShardFile(dir_, step, *shards); !s.ok()) return s;
      entries.push_back(shards->entry);
    }
    if (!commit) return absl::OkStatus();
    if (processes < 2) {
      // The manifest a job would write: process 1's file is expected but never came.
      v1::CheckpointFile missing = entries[0];
      missing.set_name("process-00001.safetensors");
      entries.push_back(missing);
      v1::CheckpointManifest manifest;
      manifest.set_format_version(1);
      manifest.set_step(step);
      for (auto& e : entries) *manifest.add_files() = e;
      return CommitCheckpoint(dir_, manifest, 2);
    }
    absl::StatusOr<v1::CheckpointManifest> manifest = MakeManifest(step, mesh_, all, entries);
    if (!manifest.ok()) return manifest.status();
    manifest->set_job_id(job_id);
    return CommitCheckpoint(dir_, *manifest, /*keep_last=*/2);
  }

  std::vector<int64_t> Steps() {
    std::vector<int64_t> steps;
    for (const CommittedCheckpoint& c : ListCheckpoints(dir_)) steps.push_back(c.step);
    return steps;
  }

  std::string dir_;
  const Mesh mesh_ = *Mesh::Create({"data"}, {2}, MakeUniformCluster(2, 1));
  ShardLayout layout_;
};

TEST_F(CommitTest, CommitsKeepTheLastKAndTheNewestIsRead) {
  EXPECT_TRUE(ListCheckpoints(dir_).empty());
  for (int64_t step : {100, 200, 300}) ASSERT_TRUE(Save(step).ok());
  EXPECT_THAT(Steps(), ElementsAre(300, 200));  // 100 dropped: keep_last 2
  std::vector<std::string> skipped;
  absl::StatusOr<CheckpointReader> reader = OpenLatestValid(dir_, &skipped);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_TRUE(skipped.empty());
  EXPECT_EQ(reader->manifest().step(), 300);
  absl::StatusOr<Tensor> w = reader->ReadBlock("w", {{0, 4}});
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_THAT(std::vector<float>(w->data(), w->data() + 4), ElementsAre(300, 301, 302, 303));
}

TEST_F(CommitTest, KeepLastNeverRemovesAnotherJobsCheckpoints) {
  // Job a-1 wrote 100 and 200; job b-2 resumed from them in the same directory.
  ASSERT_TRUE(Save(100, 2, true, "a-1").ok());
  ASSERT_TRUE(Save(200, 2, true, "a-1").ok());
  for (int64_t step : {300, 400, 500}) ASSERT_TRUE(Save(step, 2, true, "b-2").ok());
  // b-2 keeps its last 2; a-1's are neither counted nor removed.
  EXPECT_THAT(Steps(), ElementsAre(500, 400, 200, 100));
  // Nor is another job's checkpoint of the same step replaced.
  absl::Status clash = Save(200, 2, true, "b-2");
  EXPECT_EQ(clash.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(clash.message(), HasSubstr("holds job a-1's checkpoint of that step"));
  EXPECT_THAT(clash.message(), HasSubstr("which job b-2 does not replace"));
  EXPECT_FALSE(std::filesystem::exists(StagingCheckpointDir(dir_, 200)));
  absl::StatusOr<CheckpointReader> kept = CheckpointReader::Open(CommittedCheckpointDir(dir_, 200));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->manifest().job_id(), "a-1");
  // The same job's own checkpoint of a step (an earlier attempt's) is replaced.
  EXPECT_TRUE(Save(500, 2, true, "b-2").ok());
}

TEST_F(CommitTest, ACorruptedShardFallsBackToThePreviousCheckpointSayingWhy) {
  ASSERT_TRUE(Save(100).ok());
  ASSERT_TRUE(Save(200).ok());
  const std::string shard = CommittedCheckpointDir(dir_, 200) + "/process-00001.safetensors";
  std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(-1, std::ios::end);
  f.put('\x55');
  f.close();
  std::vector<std::string> skipped;
  absl::StatusOr<CheckpointReader> reader = OpenLatestValid(dir_, &skipped);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->manifest().step(), 100);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("step 200: checkpoint shard file"));
  EXPECT_THAT(skipped[0], HasSubstr("is damaged"));
}

TEST_F(CommitTest, AHalfWrittenCheckpointIsNeverSeen) {
  ASSERT_TRUE(Save(100).ok());
  // A save cut short before the commit: files in staging, nothing committed.
  ASSERT_TRUE(Save(200, 2, /*commit=*/false).ok());
  EXPECT_THAT(Steps(), ElementsAre(100));
  // A commit whose manifest names a file that never came is refused, and commits nothing.
  absl::Status incomplete = Save(300, /*processes=*/1);
  EXPECT_EQ(incomplete.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(incomplete.message(), HasSubstr("process-00001.safetensors is missing"));
  EXPECT_THAT(Steps(), ElementsAre(100));
  EXPECT_EQ(OpenLatestValid(dir_, nullptr)->manifest().step(), 100);
}

TEST_F(CommitTest, NothingWholeIsNotFoundWithTheReasons) {
  std::vector<std::string> skipped;
  EXPECT_EQ(OpenLatestValid(dir_, &skipped).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(Save(100).ok());
  std::filesystem::remove(CommittedCheckpointDir(dir_, 100) + "/process-00000.safetensors");
  absl::StatusOr<CheckpointReader> none = OpenLatestValid(dir_, &skipped);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("step 100: checkpoint shard file"));
  EXPECT_EQ(skipped.size(), 1u);
}

TEST_F(CommitTest, AWriteThatCannotHappenSaysWhere) {
  std::filesystem::create_directories(dir_);
  std::ofstream(dir_ + "/blocked") << "a file where a directory should go";
  Tensor storage;
  absl::StatusOr<ProcessShards> shards = EncodeProcessShards(0, Half(0, 1, &storage));
  ASSERT_TRUE(shards.ok());
  absl::Status s = WriteShardFile(dir_ + "/blocked", 1, *shards);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("blocked"));
}

}  // namespace
}  // namespace substrax
