#include "worker/checkpoint/export.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/device.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/checkpoint/commit.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/simulated_job.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

// Element i of a global array of the state after `step` steps; `salt` tells the arrays apart.
Tensor Values(const std::vector<int64_t>& shape, int salt, int64_t step) {
  Tensor t(shape);
  for (int64_t i = 0; i < t.size(); ++i) {
    t.data()[i] = static_cast<float>(std::sin(0.7 * i + 13.0 * salt + step));
  }
  return t;
}

// What a training job on a (2, 2) mesh of 2 hosts holds after `step` steps: parameters (a
// kernel split over both axes, a bias over "model" and replicated over "data", a replicated
// scalar) and one optimizer slot per parameter, partitioned as its parameter.
std::map<std::string, GlobalArray> State(int64_t step) {
  const PartitionSpec both = PartitionSpec::Of({"data", "model"});
  const PartitionSpec model = PartitionSpec::Of({"model"});
  return {
      {"params/dense_0/kernel", {Values({8, 6}, 0, step), both}},
      {"params/dense_0/bias", {Values({6}, 1, step), model}},
      {"params/scale", {Values({}, 2, step), PartitionSpec()}},
      {"optimizer/dense_0/kernel/mu", {Values({8, 6}, 3, step), both}},
      {"optimizer/dense_0/bias/mu", {Values({6}, 4, step), model}},
      {"optimizer/scale/mu", {Values({}, 5, step), PartitionSpec()}},
  };
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The names in `dir`.
std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

class ExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    jobs_ = dir_ + "/checkpoints";
    out_ = dir_ + "/params.safetensors";
  }

  // Saves State(step) as the 2 processes of the job would.
  void Save(int64_t step, std::map<std::string, GlobalArray> state) {
    const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 2}, MakeUniformCluster(2, 2));
    absl::StatusOr<SimulatedJob> job = SimulatedJob::Create(mesh, state);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_EQ(job->processes(), 2);
    absl::Status saved = job->Save(jobs_, step);
    ASSERT_TRUE(saved.ok()) << saved;
  }
  void Save(int64_t step) { Save(step, State(step)); }

  // Flips one data byte of a shard file of `step`: same size, another checksum.
  void Damage(int64_t step, const std::string& file) {
    std::fstream f(CommittedCheckpointDir(jobs_, step) + "/" + file,
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put('\x7e');
  }

  // The exported file holds exactly `want`'s arrays under `names` (in the same order), each
  // F32, of its global shape, bit for bit.
  void ExpectExported(const std::map<std::string, GlobalArray>& want,
                      const std::map<std::string, std::string>& names) {
    absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(out_);
    ASSERT_TRUE(file.ok()) << file.status();
    std::vector<std::string> expected_names;
    for (const auto& [array, tensor] : names) expected_names.push_back(tensor);
    std::sort(expected_names.begin(), expected_names.end());
    EXPECT_EQ(file->names(), expected_names);
    for (const auto& [array, tensor] : names) {
      absl::StatusOr<SafetensorsTensor> t = file->Tensor(tensor);
      ASSERT_TRUE(t.ok()) << t.status();
      const Tensor& value = want.at(array).value;
      EXPECT_EQ(t->dtype, SafetensorsDtype::kF32) << tensor;
      EXPECT_EQ(t->shape, value.shape()) << tensor;
      ASSERT_EQ(t->bytes.size(), value.size() * sizeof(float)) << tensor;
      EXPECT_EQ(std::memcmp(t->bytes.data(), value.data(), t->bytes.size()), 0)
          << tensor << " differs from " << array;
    }
  }

  std::string dir_;
  std::string jobs_;
  std::string out_;
};

const std::map<std::string, std::string> kParams = {
    {"params/dense_0/kernel", "dense_0/kernel"},
    {"params/dense_0/bias", "dense_0/bias"},
    {"params/scale", "scale"}};

TEST_F(ExportTest, TheParametersAreWrittenWholeUnderTheirOwnNames) {
  Save(100);
  absl::StatusOr<ExportResult> result =
      ExportCheckpoint(CommittedCheckpointDir(jobs_, 100), out_, ExportOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 100);
  EXPECT_EQ(result->checkpoint_dir, CommittedCheckpointDir(jobs_, 100));
  EXPECT_THAT(result->tensors, ElementsAre("dense_0/bias", "dense_0/kernel", "scale"));
  EXPECT_THAT(result->left_out,
              UnorderedElementsAre("optimizer/dense_0/kernel/mu", "optimizer/dense_0/bias/mu",
                                   "optimizer/scale/mu"));
  EXPECT_THAT(result->skipped, IsEmpty());
  EXPECT_EQ(result->bytes, static_cast<int64_t>(fs::file_size(out_)));
  ExpectExported(State(100), kParams);
  EXPECT_THAT(SafetensorsFile::Read(out_)->metadata(),
              ElementsAre(Pair("format", "substrax-export"), Pair("mesh_axes", "data,model"),
                          Pair("mesh_shape", "2,2"), Pair("step", "100")));
}

TEST_F(ExportTest, TheOptimizerStateOnlyWhenAskedUnderItsCheckpointName) {
  Save(100);
  ExportOptions options;
  options.include_optimizer = true;
  absl::StatusOr<ExportResult> result =
      ExportCheckpoint(CommittedCheckpointDir(jobs_, 100), out_, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_THAT(result->left_out, IsEmpty());
  std::map<std::string, std::string> names = kParams;
  for (const char* slot :
       {"optimizer/dense_0/kernel/mu", "optimizer/dense_0/bias/mu", "optimizer/scale/mu"}) {
    names[slot] = slot;
  }
  ExpectExported(State(100), names);
}

TEST_F(ExportTest, AJobDirectoryGivesTheNewestWholeCheckpointSayingWhatWasSkipped) {
  for (int64_t step : {100, 200, 300}) Save(step);
  Damage(300, "process-00001.safetensors");
  absl::StatusOr<ExportResult> result = ExportCheckpoint(jobs_, out_, ExportOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 200);
  EXPECT_EQ(result->checkpoint_dir, CommittedCheckpointDir(jobs_, 200));
  ASSERT_EQ(result->skipped.size(), 1u);
  EXPECT_THAT(result->skipped[0], HasSubstr("step 300: checkpoint shard file"));
  EXPECT_THAT(result->skipped[0], HasSubstr("process-00001.safetensors is damaged"));
  ExpectExported(State(200), kParams);

  // A step named: that one, whatever is newer.
  ExportOptions options;
  options.step = 100;
  result = ExportCheckpoint(jobs_, out_, options);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->step, 100);
  EXPECT_THAT(result->skipped, IsEmpty());
  ExpectExported(State(100), kParams);

  options.step = 300;
  absl::StatusOr<ExportResult> damaged = ExportCheckpoint(jobs_, out_, options);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(), HasSubstr("process-00001.safetensors is damaged"));
  options.step = 400;
  absl::StatusOr<ExportResult> absent = ExportCheckpoint(jobs_, out_, options);
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(),
              HasSubstr("no committed checkpoint of step 400 in " + jobs_ +
                        " (it has steps 300, 200, 100)"));
  // The file written before is untouched by the failed exports.
  ExpectExported(State(100), kParams);
}

TEST_F(ExportTest, ADamagedCheckpointIsDataLossAndWritesNothing) {
  Save(100);
  std::ofstream(out_) << "an earlier export";
  fs::remove(CommittedCheckpointDir(jobs_, 100) + "/process-00000.safetensors");
  absl::StatusOr<ExportResult> missing =
      ExportCheckpoint(CommittedCheckpointDir(jobs_, 100), out_, ExportOptions());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(missing.status().message(), HasSubstr("process-00000.safetensors is missing"));
  // In a job's directory with no whole checkpoint left: DATA_LOSS, saying why for each.
  absl::StatusOr<ExportResult> none = ExportCheckpoint(jobs_, out_, ExportOptions());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(none.status().message(), HasSubstr("step 100: checkpoint shard file"));
  EXPECT_EQ(Read(out_), "an earlier export");
}

TEST_F(ExportTest, NoCheckpointIsNotFound) {
  absl::StatusOr<ExportResult> absent =
      ExportCheckpoint(dir_ + "/nowhere", out_, ExportOptions());
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(absent.status().message(), HasSubstr(dir_ + "/nowhere: no such directory"));
  fs::create_directories(jobs_ + "/.staging-step-000000000100");  // a save cut short
  absl::StatusOr<ExportResult> empty = ExportCheckpoint(jobs_, out_, ExportOptions());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(empty.status().message(),
              HasSubstr("neither a manifest.json nor a committed step-NNNNNNNNNNNN directory"));
  EXPECT_FALSE(fs::exists(out_));
}

TEST_F(ExportTest, AStepDirectoryOfAnotherStepThanAskedIsRefused) {
  Save(100);
  ExportOptions options;
  options.step = 200;
  absl::StatusOr<ExportResult> result =
      ExportCheckpoint(CommittedCheckpointDir(jobs_, 100), out_, options);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("holds the checkpoint of step 100, not of "
                                                   "step 200"));
}

TEST_F(ExportTest, ACheckpointWithoutParametersIsRefusedNamingItsArrays) {
  std::map<std::string, GlobalArray> state = State(100);
  state.erase("params/dense_0/kernel");
  state.erase("params/dense_0/bias");
  state.erase("params/scale");
  Save(100, state);
  absl::StatusOr<ExportResult> result = ExportCheckpoint(jobs_, out_, ExportOptions());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(),
              HasSubstr("has no params/ array to export (it has optimizer/dense_0/bias/mu, "
                        "optimizer/dense_0/kernel/mu, optimizer/scale/mu)"));
}

TEST_F(ExportTest, AnOutputThatCannotBeWrittenNamesThePathAndWhy) {
  Save(100);
  const std::string no_dir = dir_ + "/no/such/dir/params.safetensors";
  absl::StatusOr<ExportResult> result = ExportCheckpoint(jobs_, no_dir, ExportOptions());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("cannot write " + no_dir));
  EXPECT_THAT(result.status().message(), HasSubstr("No such file or directory"));
  // A directory in the way: the rename fails and the temporary file is removed.
  fs::create_directories(out_);
  result = ExportCheckpoint(jobs_, out_, ExportOptions());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(result.status().message(), HasSubstr("cannot write " + out_));
  EXPECT_THAT(result.status().message(), HasSubstr("Is a directory"));
  EXPECT_THAT(Entries(dir_), UnorderedElementsAre("checkpoints", "params.safetensors"));
}

TEST_F(ExportTest, AnExistingFileIsReplacedWholeAndNoTemporaryFileStays) {
  Save(100);
  std::ofstream(out_) << "an earlier export, longer than nothing";
  absl::StatusOr<ExportResult> result = ExportCheckpoint(jobs_, out_, ExportOptions());
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectExported(State(100), kParams);
  EXPECT_THAT(Entries(dir_), UnorderedElementsAre("checkpoints", "params.safetensors"));
}

}  // namespace
}  // namespace substrax
