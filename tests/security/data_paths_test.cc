// Confined data access, end to end: a real coordinator and one worker daemon with --data-root,
// jobs submitted over the real JobService. Paths outside the root (/proc/self/environ,
// /dev/zero, "../" traversal) are refused at submit by the path string; what only the file
// system can tell (a FIFO, a symlink in the root that leads out of it) the runner refuses when
// it opens the file. No job error ever holds a byte of the file it was refused: the daemon's
// (and so the runners') environment and the file outside the root hold a marker that must never
// appear in SubmitJob's or GetJob's answers.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/job_spec_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kMarker[] = "MARKER-c0ffee-5ecret";

// A CSV job on one CPU device reading NAME's data from PATH.
std::string CsvJob(const std::string& name, const std::string& path) {
  return testing::JobSpecBuilder(name)
      .Model("{type: softmax_regression, num_classes: 2}")
      .Data("csv", {{"csv", "{label_column: y}"}, {"train", absl::StrCat("{path: ", path, "}")}})
      .Batch("{global_batch_size: 4}")
      .Steps(2)
      .Yaml();
}

// Everything the coordinator tells a client about the job, for the marker check.
std::string Everything(const v1::Job& job) { return job.DebugString(); }

class DataPathsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = TempDir("data_paths");
    root_ = base_ + "/root";
    fs::create_directories(root_);
    std::ofstream(base_ + "/outside.csv") << "x," << kMarker << "\n1,0\n";
    std::ofstream(root_ + "/good.csv") << "x,y\n0,0\n1,1\n0,0\n1,1\n0,0\n1,1\n0,0\n1,1\n";
    std::ofstream(root_ + "/bad-cell.csv") << "x,y\n0,0\n" << kMarker << ",1\n";
    fs::create_symlink(base_ + "/outside.csv", root_ + "/out-abs.csv");
    fs::create_symlink("../outside.csv", root_ + "/out-rel.csv");
    fs::create_symlink("/proc/self/environ", root_ + "/environ.csv");
    ASSERT_EQ(mkfifo((root_ + "/fifo.csv").c_str(), 0600), 0);

    ChaosClusterOptions options;
    options.workers = 1;
    options.cpu_devices_per_worker = 1;
    // The runners get it (passed on by name: jobs start from a clean environment), so
    // /proc/self/environ of a runner holds the marker.
    options.worker_flags = {"--data-root", root_, "--job-env-pass", "SUBSTRAX_TEST_MARKER"};
    options.worker_env = {absl::StrCat("SUBSTRAX_TEST_MARKER=", kMarker)};
    options.coordinator_env = options.worker_env;
    cluster_ = std::make_unique<ChaosCluster>("data_paths_cluster", options);
    ASSERT_TRUE(cluster_->WaitForWorkers(1, absl::Seconds(30))) << cluster_->Logs();
  }

  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_EQ(cluster_->StopAndListLeftovers(), "");
    }
  }

  // Submits a job that must be refused at submit; the refusal.
  std::string Refused(const std::string& name, const std::string& path) {
    const std::string answer = cluster_->Submit(CsvJob(name, path));
    EXPECT_THAT(answer, StartsWith("error: ")) << path;
    EXPECT_THAT(answer, HasSubstr("spec.data.train.path: '" + path + "'")) << path;
    EXPECT_THAT(answer, Not(HasSubstr(kMarker))) << path;
    return answer;
  }

  // Submits a job that the runner must fail; the job as it ended.
  v1::Job FailsInTheRunner(const std::string& name, const std::string& path) {
    const std::string id = cluster_->Submit(CsvJob(name, path));
    EXPECT_THAT(id, Not(StartsWith("error"))) << path;
    std::optional<v1::Job> job = cluster_->WaitForEnd(id, absl::Seconds(60));
    EXPECT_TRUE(job.has_value()) << cluster_->Logs();
    if (!job.has_value()) return v1::Job();
    EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << job->DebugString() << cluster_->Logs();
    EXPECT_THAT(job->error(), HasSubstr(path));
    EXPECT_THAT(Everything(*job), Not(HasSubstr(kMarker))) << job->DebugString();
    return *job;
  }

  std::string base_;
  std::string root_;
  std::unique_ptr<ChaosCluster> cluster_;
};

TEST_F(DataPathsTest, PathsOutsideTheRootAreRefusedAtSubmit) {
  EXPECT_THAT(Refused("environ", "/proc/self/environ"),
              HasSubstr("is not under a data root of any worker (" + root_ + ")"));
  EXPECT_THAT(Refused("zero", "/dev/zero"), HasSubstr("is not under a data root"));
  EXPECT_THAT(Refused("dots", root_ + "/../outside.csv"), HasSubstr("has a '..' component"));
  EXPECT_THAT(Refused("relative", "root/good.csv"), HasSubstr("is not an absolute path"));
  EXPECT_THAT(Refused("outside", base_ + "/outside.csv"), HasSubstr("is not under a data root"));
}

TEST_F(DataPathsTest, TheRunnerRefusesWhatOnlyTheFileSystemCanTell) {
  // A FIFO nobody writes: refused without blocking the runner.
  EXPECT_THAT(FailsInTheRunner("fifo", root_ + "/fifo.csv").error(), HasSubstr("is a FIFO"));
  // Symlinks in the root that lead out of it.
  EXPECT_THAT(FailsInTheRunner("out-abs", root_ + "/out-abs.csv").error(),
              HasSubstr("resolves outside its data root"));
  EXPECT_THAT(FailsInTheRunner("out-rel", root_ + "/out-rel.csv").error(),
              HasSubstr("resolves outside its data root"));
  EXPECT_THAT(FailsInTheRunner("environ-link", root_ + "/environ.csv").error(),
              HasSubstr("resolves outside its data root"));
  // A file in the root whose cell holds the marker: the parse error names the line and the
  // column, not the cell.
  EXPECT_THAT(FailsInTheRunner("bad-cell", root_ + "/bad-cell.csv").error(),
              HasSubstr(root_ + "/bad-cell.csv:3: column 1: not a number"));
}

TEST_F(DataPathsTest, DataUnderTheRootTrains) {
  const std::string id = cluster_->Submit(CsvJob("good", root_ + "/good.csv"));
  ASSERT_THAT(id, Not(StartsWith("error"))) << id;
  std::optional<v1::Job> job = cluster_->WaitForEnd(id, absl::Seconds(60));
  ASSERT_TRUE(job.has_value()) << cluster_->Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString() << cluster_->Logs();
}

}  // namespace
}  // namespace substrax::testing
