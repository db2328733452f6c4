// Command jobs (spec.command) on a real local cluster: a coordinator and 2 agents x 2 CPU
// devices (the chaos harness's), real processes, substraxctl.
//   - refused at submit, naming the field: a reserved variable in spec.command.env, a command
//     outside the programs dirs, an unknown python_env;
//   - a shell script per_worker (rendezvous ports from the agents' --command-ports): the job fails naming rank 1, its host and its last lines; rank
//     0 is stopped; with max_restarts: 1 the second attempt gets TORCHELASTIC_RESTART_COUNT=1 and
//     the resume directory; malformed report lines are skipped with a warning in the job's log;
//     the command's environment holds no credential of the worker and no launch file; an error
//     file with `retry: false` becomes the job's error and fails it without its restarts;
//   - a PyTorch program (Gloo) per_device and the same program under torchrun per_worker: an
//     all-reduce over 4 processes, metrics that `substraxctl metrics` returns reduced as
//     declared, a final metric, every process's lines in `substraxctl logs`;
//   - a JAX program per_worker: a psum over the 4 devices of its 2 processes.
// The Python tests skip themselves when their environment is missing (Debian's python3-torch,
// the venv /opt/substrax/jax: tools/install_deps.sh), except under CI=true, where they fail.
// Every test checks afterwards that no process outlived it.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJaxEnv[] = "/opt/substrax/jax";

// Skips the test when `path` is missing, except under CI=true (where it fails).
#define REQUIRE_PATH(path, what)                                                           \
  do {                                                                                     \
    if (access((path), X_OK) != 0) {                                                       \
      if (InCi()) FAIL() << (what) << " missing (" << (path) << "): tools/install_deps.sh"; \
      GTEST_SKIP() << (what) << " missing (" << (path) << "): tools/install_deps.sh";       \
    }                                                                                      \
  } while (0)

struct CommandCluster {
  std::string files;     // the test's own files
  std::string programs;  // the agents' --programs-dir
  std::string checkpoints;
  std::unique_ptr<ChaosCluster> cluster;
};

CommandCluster StartCluster(const std::string& name,
                            const std::vector<std::string>& extra_flags = {}) {
  CommandCluster c;
  c.files = TempDir(name + "_files");
  c.programs = c.files + "/programs";
  c.checkpoints = c.files + "/checkpoints";
  std::filesystem::create_directories(c.programs);
  std::filesystem::create_directories(c.checkpoints);
  for (const char* program :
       {"fail_in_rank1.sh", "error_file.sh", "checkpoint_on_sigterm.sh", "torch_allreduce.py",
        "jax_psum.py"}) {
    const std::string to = absl::StrCat(c.programs, "/", program);
    std::filesystem::copy_file(Runfile(absl::StrCat("tests/commands/", program)), to);
    chmod(to.c_str(), 0755);
  }
  ChaosClusterOptions options;
  options.workers = 2;
  options.cpu_devices_per_worker = 2;
  options.collective_timeout = "60s";
  options.worker_flags = {"--programs-dir", c.programs, "--checkpoint-root", c.checkpoints,
                          "--allow-command-jobs", "--python-env", "system=/usr"};
  if (access(absl::StrCat(kJaxEnv, "/bin").c_str(), F_OK) == 0) {
    options.worker_flags.push_back("--python-env");
    options.worker_flags.push_back(absl::StrCat("jax=", kJaxEnv));
  }
  options.worker_flags.insert(options.worker_flags.end(), extra_flags.begin(), extra_flags.end());
  c.cluster = std::make_unique<ChaosCluster>(name, options);
  return c;
}

std::string CommandJob(const std::string& name, const std::string& command,
                       const std::string& rest = "") {
  return absl::StrCat("apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: ", name,
                      "}\nspec:\n  command: ", command, "\n  mesh: {data_parallel_size: 4}\n",
                      rest);
}

// name=value lines of a file written by `env`.
std::map<std::string, std::string> EnvOf(const std::string& path) {
  std::map<std::string, std::string> env;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n')) {
    const size_t eq = line.find('=');
    if (eq != absl::string_view::npos) {
      env[std::string(line.substr(0, eq))] = std::string(line.substr(eq + 1));
    }
  }
  return env;
}

bool ProcessGone(pid_t pid) { return ReadFile(absl::StrCat("/proc/", pid, "/stat")).empty(); }

TEST(CommandJobTest, TheFirstFailureStopsTheOthersNamesTheRankAndTheRestartGetsItsCount) {
  // Rendezvous ports from a range (for firewalls), below the ephemeral ports.
  CommandCluster c = StartCluster("command_fail", {"--command-ports", "20000-20999"});
  ChaosCluster& cluster = *c.cluster;
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  // Refused at submit, naming the field: a reserved variable, a command outside the programs
  // dirs, an environment no worker has.
  EXPECT_THAT(cluster.Submit(CommandJob("reserved", absl::StrCat("{argv: [", c.programs,
                                                                 "/fail_in_rank1.sh], env: "
                                                                 "{MASTER_PORT: \"1\"}}"))),
              HasSubstr("spec.command.env.MASTER_PORT"));
  EXPECT_THAT(cluster.Submit(CommandJob("outside", "{argv: [/bin/true]}")),
              HasSubstr("spec.command.argv[0]: '/bin/true' is not under a programs dir"));
  EXPECT_THAT(cluster.Submit(CommandJob("unknown-env", "{python_env: conda, argv: [python]}")),
              HasSubstr("spec.command.python_env: no worker has a Python environment named "
                        "'conda'"));

  const std::string out = c.files + "/out";
  std::filesystem::create_directories(out);
  const std::string id = cluster.Submit(CommandJob(
      "fails", absl::StrCat("{argv: [", c.programs, "/fail_in_rank1.sh, ", out, "]}"),
      absl::StrCat("  max_restarts: 1\n  checkpoint: {directory: ", c.checkpoints,
                   "/anonymous/fails}\n")));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(120));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  ASSERT_EQ(job->state(), v1::JOB_STATE_FAILED) << cluster.Logs();
  EXPECT_EQ(job->attempt(), 2) << job->DebugString();
  // Rank 1 named, with its host and its last lines (its stderr).
  EXPECT_THAT(job->error(), ::testing::ContainsRegex("rank 1 on host host-[ab] exited with status 3"));
  EXPECT_THAT(job->error(), HasSubstr("rank 1: the data shard is corrupt"));

  for (int attempt : {1, 2}) {
    const std::string pid_file = absl::StrCat(out, "/pid-", attempt, "-0");
    ASSERT_TRUE(PollUntil([&] { return !ReadFile(pid_file).empty(); }, absl::Seconds(10)))
        << pid_file;
    int pid = 0;
    ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(pid_file)), &pid));
    EXPECT_TRUE(PollUntil([&] { return ProcessGone(pid); }, absl::Seconds(20)))
        << "rank 0 of attempt " << attempt << " (pid " << pid << ") was not stopped";
  }

  // The contract: ranks, the restart count, the resume directory on the restart.
  std::map<std::string, std::string> first = EnvOf(absl::StrCat(out, "/env-1-0"));
  std::map<std::string, std::string> second = EnvOf(absl::StrCat(out, "/env-2-1"));
  EXPECT_EQ(first["WORLD_SIZE"], "2");
  EXPECT_EQ(first["TORCHELASTIC_RESTART_COUNT"], "0");
  EXPECT_FALSE(first.count("SUBSTRAX_RESUME_FROM"));
  EXPECT_EQ(second["RANK"], "1");
  EXPECT_EQ(second["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(second["TORCHELASTIC_MAX_RESTARTS"], "1");
  EXPECT_EQ(second["SUBSTRAX_RESUME_FROM"], absl::StrCat(c.checkpoints, "/anonymous/fails"));
  EXPECT_EQ(second["SUBSTRAX_LOCAL_DEVICE_IDS"].size(), 3u) << second["SUBSTRAX_LOCAL_DEVICE_IDS"];
  EXPECT_EQ(first["JAX_NUM_CPU_DEVICES"], "2");
  int master_port = 0, jax_port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(first["MASTER_PORT"], &master_port)) << first["MASTER_PORT"];
  const std::string jax = first["JAX_COORDINATOR_ADDRESS"];
  ASSERT_TRUE(absl::SimpleAtoi(jax.substr(jax.rfind(':') + 1), &jax_port)) << jax;
  for (int port : {master_port, jax_port}) {
    EXPECT_GE(port, 20000);
    EXPECT_LE(port, 20999);
  }
  EXPECT_NE(master_port, jax_port);
  EXPECT_EQ(second["MASTER_ADDR"], "127.0.0.1");
  // No credential of the worker, no launch file, nothing of the agent's own environment.
  for (const auto& [name, value] : first) {
    EXPECT_NE(name, "SUBSTRAX_LAUNCH");
    EXPECT_THAT(value, Not(HasSubstr("sxa1."))) << name;
    EXPECT_THAT(value, Not(HasSubstr(".key"))) << name;
  }

  // Every process's lines in the job's log, and the malformed report line warned about there.
  CommandResult logs = cluster.Ctl({"logs", id, "--attempt", "1"});
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  EXPECT_THAT(logs.out, HasSubstr("rank 0 attempt 1 restart 0 resume none"));
  EXPECT_THAT(logs.out, HasSubstr("rank 1 attempt 1 restart 0 resume none"));
  EXPECT_THAT(logs.out, HasSubstr("line 1: skipped"));
  EXPECT_THAT(logs.out, HasSubstr("stopping the command's processes"));

  // An error file becomes the job's error; `retry: false` fails the job without its restarts.
  const std::string no_retry = cluster.Submit(CommandJob(
      "no-retry", absl::StrCat("{argv: [", c.programs, "/error_file.sh]}"), "  max_restarts: 2\n"));
  ASSERT_FALSE(absl::StartsWith(no_retry, "error: ")) << no_retry;
  job = cluster.WaitForEnd(no_retry, absl::Seconds(120));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  ASSERT_EQ(job->state(), v1::JOB_STATE_FAILED) << cluster.Logs();
  EXPECT_EQ(job->attempt(), 1) << job->DebugString();
  EXPECT_THAT(job->error(), ::testing::ContainsRegex(
                                "rank 0 on host host-[ab] exited with status 2: ValueError: "
                                "learning rate -1 is negative\nTraceback \\(most recent call "
                                "last\\):\n  File \"train.py\", line 7"));

  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

// `substraxctl metrics JOB --name NAME -o json`: the value of NAME at `step`, reduced as the
// spec declares (the CLI's default); nothing when the series or the point is missing.
std::optional<double> ReducedMetric(ChaosCluster& cluster, const std::string& id,
                                    const std::string& name, int64_t step) {
  CommandResult r = cluster.Ctl({"metrics", id, "--name", name, "-o", "json"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  v1::QueryMetricsResponse response;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  if (!google::protobuf::util::JsonStringToMessage(r.out, &response, options).ok()) {
    ADD_FAILURE() << "not a QueryMetricsResponse: " << r.out;
    return std::nullopt;
  }
  for (const v1::MetricSeries& series : response.series()) {
    if (series.name() != name) continue;
    for (const v1::MetricPoint& point : series.points()) {
      if (point.step() == step) return point.value();
    }
  }
  ADD_FAILURE() << name << " at step " << step << " missing: " << r.out;
  return std::nullopt;
}

void ExpectTorchJob(ChaosCluster& cluster, const std::string& id) {
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(180));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error() << cluster.Logs();
  EXPECT_EQ(job->progress().step(), 1);
  EXPECT_EQ(job->progress().final_metrics().at("world_size"), 4);
  // Reduced as declared: 1 + 2 + 3 + 4 summed, the all-reduced 10 at most 10.
  EXPECT_EQ(job->progress().metrics().at("contribution"), 10);
  EXPECT_EQ(job->progress().metrics().at("allreduced"), 10);
  // What `substraxctl metrics` returns: the same reductions over the four devices' reports.
  EXPECT_EQ(ReducedMetric(cluster, id, "contribution", 1), 10);
  EXPECT_EQ(ReducedMetric(cluster, id, "allreduced", 1), 10);
  CommandResult logs = cluster.Ctl({"logs", id});
  ASSERT_EQ(logs.exit_code, 0) << logs.err;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_THAT(logs.out, HasSubstr(absl::StrCat("OK rank ", rank, " of 4: all_reduce = 10")));
  }
}

// A cancel's SIGTERM reaches every process of the command (their process group) and each
// launcher waits for them, so that a process's checkpoint after SIGTERM completes.
TEST(CommandJobTest, TheAgentsSigtermReachesTheProcessesAndTheLauncherWaitsForThem) {
  CommandCluster c = StartCluster("command_sigterm");
  ChaosCluster& cluster = *c.cluster;
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(
      CommandJob("stops", absl::StrCat("{argv: [", c.programs, "/checkpoint_on_sigterm.sh]}")));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  auto logged = [&](const std::vector<std::string>& lines) {
    const CommandResult logs = cluster.Ctl({"logs", id});
    for (const std::string& line : lines) {
      if (!absl::StrContains(logs.out, line)) return false;
    }
    return true;
  };
  ASSERT_TRUE(PollUntil([&] { return logged({"rank 0: training", "rank 1: training"}); },
                        absl::Seconds(60)))
      << cluster.Logs();
  grpc::ClientContext context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cancelled;
  ASSERT_TRUE(cluster.jobs()->CancelJob(&context, cancel, &cancelled).ok());
  EXPECT_TRUE(PollUntil(
      [&] {
        return logged({"rank 0: checkpoint written after SIGTERM",
                       "rank 1: checkpoint written after SIGTERM",
                       "the command's processes got it too (their process group)"});
      },
      absl::Seconds(30)))
      << cluster.Ctl({"logs", id}).out << cluster.Logs();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(CommandJobTest, PytorchPerDeviceAndUnderTorchrunAllReduceOverFourProcesses) {
  REQUIRE_PATH("/usr/bin/torchrun", "Debian's python3-torch");
  CommandCluster c = StartCluster("command_torch");
  ChaosCluster& cluster = *c.cluster;
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string metrics = "  metrics: {contribution: sum, allreduced: max}\n";
  ExpectTorchJob(cluster, cluster.Submit(CommandJob(
                              "torch-per-device",
                              absl::StrCat("{python_env: system, processes: per_device, argv: "
                                           "[python3, ", c.programs, "/torch_allreduce.py]}"),
                              metrics)));
  if (HasFailure()) return;
  ExpectTorchJob(cluster, cluster.Submit(CommandJob(
                              "torchrun",
                              // Debian 12's torchrun (torch 1.13 on Python 3.11) cannot
                              // start with --tee or --redirects 0, their defaults
                              // (docs/command-jobs.md).
                              absl::StrCat("{python_env: system, argv: [torchrun, "
                                           "--monitor_interval=0.1, --tee=2, --redirects=1, ",
                                           c.programs, "/torch_allreduce.py]}"),
                              metrics)));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(CommandJobTest, JaxPerWorkerPsumsOverTheFourDevicesOfItsTwoProcesses) {
  REQUIRE_PATH(absl::StrCat(kJaxEnv, "/bin/python").c_str(), "the JAX venv");
  CommandCluster c = StartCluster("command_jax");
  ChaosCluster& cluster = *c.cluster;
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(CommandJob(
      "jax", absl::StrCat("{python_env: jax, argv: [python, ", c.programs, "/jax_psum.py]}"),
      "  metrics: {psum: max}\n"));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(180));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error() << cluster.Logs();
  EXPECT_EQ(job->progress().metrics().at("psum"), 10);
  EXPECT_EQ(ReducedMetric(cluster, id, "psum", 1), 10);
  CommandResult logs = cluster.Ctl({"logs", id});
  EXPECT_THAT(logs.out, HasSubstr("OK process 0 of 2: psum over 4 devices = 10"));
  EXPECT_THAT(logs.out, HasSubstr("OK process 1 of 2: psum over 4 devices = 10"));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
