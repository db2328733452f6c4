#include "worker/checkpoint/export_command.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
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

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ExportCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    // A parameter and its optimizer slot, split over the 2 processes of a (2,) mesh.
    const Mesh mesh = *Mesh::Create({"data"}, {2}, MakeUniformCluster(2, 1));
    const PartitionSpec data = PartitionSpec::Of({"data"});
    for (int64_t step : {10, 20}) {
      const float s = static_cast<float>(step);
      absl::StatusOr<SimulatedJob> job =
          SimulatedJob::Create(mesh, {{"params/w", {Tensor({4}, {s, s + 1, s + 2, s + 3}), data}},
                                      {"optimizer/w/mu", {Tensor({4}, {-s, -s, -s, -s}), data}}});
      ASSERT_TRUE(job.ok()) << job.status();
      ASSERT_TRUE(job->Save(dir_ + "/ckpt", step).ok());
    }
  }

  // Parses `args` as substrax-job's command line and runs the command; returns its exit
  // status (2: refused by the parser).
  int Run(std::vector<std::string> args) {
    CLI::App app;
    ExportCommandFlags flags;
    AddExportCheckpointCommand(&app, &flags);
    args.insert(args.begin(), "export-checkpoint");
    std::reverse(args.begin(), args.end());  // CLI11 takes a reversed vector
    try {
      app.parse(args);
    } catch (const CLI::ParseError& e) {
      err_ << e.what();
      return 2;
    }
    return RunExportCheckpoint(flags, out_, err_);
  }

  std::string dir_;
  std::ostringstream out_;
  std::ostringstream err_;
};

TEST_F(ExportCommandTest, PrintsWhatItWroteAndWhatItLeftOut) {
  const std::string file = dir_ + "/w.safetensors";
  ASSERT_EQ(Run({dir_ + "/ckpt", "--out", file}), 0) << err_.str();
  EXPECT_EQ(out_.str(),
            absl::StrCat("wrote ", file, ": step 20 of ", CommittedCheckpointDir(dir_ + "/ckpt", 20),
                         ", 1 array, ", std::filesystem::file_size(file),
                         " bytes\n  w\nleft out 1 array (only params/ is exported; "
                         "--include-optimizer adds optimizer/)\n"));
  EXPECT_EQ(err_.str(), "");
  EXPECT_THAT(SafetensorsFile::Read(file)->names(), ElementsAre("w"));
}

TEST_F(ExportCommandTest, StepAndOptimizerFlags) {
  const std::string file = dir_ + "/w.safetensors";
  ASSERT_EQ(Run({dir_ + "/ckpt", "--out", file, "--step", "10", "--include-optimizer"}), 0)
      << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr(": step 10 of "));
  EXPECT_THAT(out_.str(), HasSubstr(", 2 arrays, "));
  EXPECT_THAT(out_.str(), HasSubstr("\n  optimizer/w/mu\n  w\n"));
  absl::StatusOr<SafetensorsTensor> w = SafetensorsFile::Read(file)->Tensor("w");
  ASSERT_TRUE(w.ok()) << w.status();
  std::vector<float> values(4);
  std::memcpy(values.data(), w->bytes.data(), 16);
  EXPECT_THAT(values, ElementsAre(10, 11, 12, 13));
}

TEST_F(ExportCommandTest, PassedOverCheckpointsAreReported) {
  std::filesystem::remove(CommittedCheckpointDir(dir_ + "/ckpt", 20) +
                          "/process-00001.safetensors");
  ASSERT_EQ(Run({dir_ + "/ckpt", "--out", dir_ + "/w.safetensors"}), 0) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr(": step 10 of "));
  EXPECT_THAT(err_.str(), HasSubstr("substrax-job export-checkpoint: passed over step 20: "
                                    "checkpoint shard file"));
  EXPECT_THAT(err_.str(), HasSubstr("process-00001.safetensors is missing"));
}

TEST_F(ExportCommandTest, FailuresAndBadFlags) {
  EXPECT_EQ(Run({dir_ + "/nowhere", "--out", dir_ + "/w.safetensors"}), 1);
  EXPECT_THAT(err_.str(), HasSubstr("substrax-job export-checkpoint: no checkpoint at " +
                                    dir_ + "/nowhere"));
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(Run({dir_ + "/ckpt"}), 2);  // no --out
  EXPECT_THAT(err_.str(), HasSubstr("--out is required"));
  EXPECT_EQ(Run({dir_ + "/ckpt", "--out", dir_ + "/w.safetensors", "--step", "-1"}), 2);
  EXPECT_THAT(err_.str(), HasSubstr("--step: Value -1 not in range 0 to "));
}

}  // namespace
}  // namespace substrax
