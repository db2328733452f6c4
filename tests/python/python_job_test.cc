// The guide's Python example (examples/python/fashion_mnist.py, on the `substrax` package) as a
// command job on a real local cluster: a coordinator and 2 agents x 2 CPU devices (the chaos
// harness's), the pinned JAX venv registered as the Python environment `jax`, substraxctl.
//   - 2 epochs of Fashion-MNIST SUCCEED with test_accuracy >= 0.85 in the final metrics;
//     `substraxctl metrics` returns the loss reduced over both processes; `logs` shows both;
//   - with checkpoints on and max_restarts: 1, a process killed mid-run (SIGKILL) fails attempt
//     1; attempt 2 resumes from the newest checkpoint, and the job says so ("resumed from the
//     checkpoint of step N"), not from step 0.
// Needs the venv /opt/substrax/jax with the package installed (`make python`, which `make test`
// runs first) and Debian's Fashion-MNIST: skipped without them, except under CI=true, where it
// fails. Checks afterwards that no process outlived it.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kVenv[] = "/opt/substrax/jax";
constexpr char kData[] = "/usr/share/datasets/fashion-mnist";

// Why the example cannot run here ("" when it can).
std::string Missing() {
  if (access(absl::StrCat(kVenv, "/bin/python").c_str(), X_OK) != 0) {
    return absl::StrCat("the JAX venv ", kVenv, " (tools/install_deps.sh)");
  }
  CommandResult r = Run({absl::StrCat(kVenv, "/bin/python"), "-c", "import substrax.spmd"},
                        absl::Seconds(60));
  if (r.exit_code != 0) {
    return absl::StrCat("the substrax package in ", kVenv, " (make python): ", r.err);
  }
  if (access(absl::StrCat(kData, "/train-images-idx3-ubyte.gz").c_str(), R_OK) != 0) {
    return absl::StrCat("Fashion-MNIST in ", kData, " (tools/install_deps.sh)");
  }
  return "";
}

#define REQUIRE_EXAMPLE()                                             \
  do {                                                                \
    const std::string missing = Missing();                            \
    if (!missing.empty()) {                                           \
      if (InCi()) FAIL() << "missing: " << missing;                   \
      GTEST_SKIP() << "missing: " << missing;                         \
    }                                                                 \
  } while (0)

struct PythonCluster {
  std::string files;
  std::string checkpoints;
  std::unique_ptr<ChaosCluster> cluster;
};

PythonCluster StartCluster(const std::string& name) {
  PythonCluster c;
  c.files = TempDir(name + "_files");
  c.checkpoints = c.files + "/checkpoints";
  std::filesystem::create_directories(c.checkpoints);
  ChaosClusterOptions options;
  options.workers = 2;
  options.cpu_devices_per_worker = 2;
  options.collective_timeout = "60s";
  options.worker_flags = {"--checkpoint-root", c.checkpoints, "--data-root", "/usr/share/datasets",
                          "--allow-command-jobs", "--python-env", absl::StrCat("jax=", kVenv)};
  c.cluster = std::make_unique<ChaosCluster>(name, options);
  return c;
}

// examples/python/fashion_mnist.yaml with the script from the runfiles, `extra` spec lines
// appended and `replace` applied.
std::string ExampleSpec(const std::string& name, const std::string& extra,
                        const std::vector<std::pair<std::string, std::string>>& replace = {}) {
  std::string spec = ReadFile(Runfile("examples/python/fashion_mnist.yaml"));
  spec = absl::StrReplaceAll(
      spec, {{"/opt/substrax/examples/python/fashion_mnist.py",
              Runfile("examples/python/fashion_mnist.py")},
             {"name: fashion-mnist-jax", absl::StrCat("name: ", name)}});
  for (const auto& [from, to] : replace) spec = absl::StrReplaceAll(spec, {{from, to}});
  return spec + extra;
}

// The pids of the example's processes of job `id` (their environment names the job).
std::vector<pid_t> ExampleProcesses(const std::string& id) {
  std::vector<pid_t> pids;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    pid_t pid = 0;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    const std::string cmdline = ReadFile(absl::StrCat("/proc/", pid, "/cmdline"));
    if (!absl::StrContains(cmdline, "fashion_mnist.py")) continue;
    const std::string environ = ReadFile(absl::StrCat("/proc/", pid, "/environ"));
    if (absl::StrContains(environ, absl::StrCat("SUBSTRAX_JOB_ID=", id, std::string(1, '\0')))) {
      pids.push_back(pid);
    }
  }
  return pids;
}

TEST(PythonJobTest, TheGuidesExampleTrainsFashionMnistAsACommandJob) {
  REQUIRE_EXAMPLE();
  PythonCluster c = StartCluster("python_example");
  ChaosCluster& cluster = *c.cluster;
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(ExampleSpec("fashion", "", {{"--checkpoint-every, \"200\"",
                                                                     "--checkpoint-every, \"0\""}}));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(600));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error() << cluster.Logs();
  EXPECT_EQ(job->attempt(), 1);
  ASSERT_TRUE(job->progress().final_metrics().count("test_accuracy")) << job->DebugString();
  EXPECT_GE(job->progress().final_metrics().at("test_accuracy"), 0.85);
  EXPECT_EQ(job->progress().step(), 2 * (60000 / 128));

  // The loss, reduced over both processes' devices as the spec declares (mean).
  CommandResult metrics = cluster.Ctl({"metrics", id, "--name", "loss", "-o", "json"});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.err;
  v1::QueryMetricsResponse response;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(metrics.out, &response).ok())
      << metrics.out;
  ASSERT_EQ(response.series_size(), 1) << metrics.out;
  EXPECT_EQ(response.series(0).reduction(), v1::REDUCTION_MEAN);
  ASSERT_GT(response.series(0).points_size(), 10);
  for (const v1::MetricPoint& point : response.series(0).points()) {
    EXPECT_EQ(point.num_values(), 4) << "step " << point.step() << ": not every device";
  }

  CommandResult logs = cluster.Ctl({"logs", id});
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("process 0 of 2: trained 936 steps on 4 devices"));
  EXPECT_THAT(logs.out, HasSubstr("process 1 of 2: trained 936 steps on 4 devices"));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(PythonJobTest, AProcessKilledMidRunRestartsFromTheNewestCheckpoint) {
  REQUIRE_EXAMPLE();
  PythonCluster c = StartCluster("python_restart");
  ChaosCluster& cluster = *c.cluster;
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string directory = absl::StrCat(c.checkpoints, "/anonymous/restart");
  const std::string id = cluster.Submit(ExampleSpec(
      "restart", absl::StrCat("  checkpoint: {directory: ", directory, "}\n"),
      {{"epochs: 2", "steps: 600"}, {"--checkpoint-every, \"200\"", "--checkpoint-every, \"50\""}}));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;

  // Once a checkpoint is listed, kill one of the example's processes.
  int64_t listed = 0;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        if (!job.has_value() || job->checkpoints().empty()) return false;
        listed = job->checkpoints(0).step();
        return true;
      },
      absl::Seconds(300)))
      << cluster.Logs();
  std::vector<pid_t> pids = ExampleProcesses(id);
  ASSERT_EQ(pids.size(), 2u) << "the example's processes of " << id;
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);

  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(600));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error() << cluster.Logs();
  EXPECT_EQ(job->attempt(), 2);
  // From the newest checkpoint at the failure: the one listed, or a later one.
  EXPECT_GE(job->resumed_from_step(), listed);
  EXPECT_GT(job->resumed_from_step(), 0);
  bool said = false;
  for (const v1::JobTransition& t : job->transitions()) {
    said = said || absl::StrContains(t.reason(),
                                     absl::StrCat("attempt 2 resumed from the checkpoint of step ",
                                                  job->resumed_from_step()));
  }
  EXPECT_TRUE(said) << job->DebugString();
  EXPECT_EQ(job->progress().step(), 600);
  CommandResult get = cluster.Ctl({"get", id});
  EXPECT_THAT(get.out, HasSubstr(absl::StrCat("resumed from the checkpoint of step ",
                                              job->resumed_from_step())));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
