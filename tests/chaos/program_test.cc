// Program jobs (spec.program) against real daemons: a program outside every --programs-dir is
// refused at submit; on the worker, a symlink leading out of the programs dir, a missing program,
// a program that exits without calling substrax::Init and one that never calls it (stopped at
// --program-init-timeout, its process gone) each fail their attempt saying why; afterwards the
// same worker runs a built-in job to success. Programs that call substrax::Init need the SDK and
// are tested with it.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

void WriteScript(const std::string& path, const std::string& body) {
  std::ofstream(path) << "#!/bin/sh\n" << body;
  chmod(path.c_str(), 0755);
}

std::string ProgramJob(const std::string& name, const std::string& path,
                       const std::string& args = "[]") {
  return absl::StrCat("apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: ", name,
                      "}\nspec:\n  program:\n    path: ", path, "\n    args: ", args,
                      "\n    env: {JOB_SETTING: mine}\n  mesh: {data_parallel_size: 1}\n");
}

// Submits `yaml` and waits for its end; the job's error ("" unless FAILED).
std::string FailureOf(ChaosCluster& cluster, const std::string& yaml) {
  const std::string id = cluster.Submit(yaml);
  EXPECT_FALSE(absl::StartsWith(id, "error: ")) << id;
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(60));
  EXPECT_TRUE(job.has_value()) << cluster.Logs();
  if (!job.has_value()) return "";
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << cluster.Logs();
  return job->error();
}

bool ProcessGone(pid_t pid) {
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  return stat.empty();
}

TEST(ProgramTest, ProgramsAreConfinedAndMustCallInitAndTheWorkerKeepsServing) {
  const std::string dir = TempDir("program_test_files");
  const std::string programs = dir + "/programs";
  std::filesystem::create_directories(programs);
  WriteScript(dir + "/outside.sh", "exit 0\n");
  std::filesystem::create_symlink(dir + "/outside.sh", programs + "/escape");
  WriteScript(programs + "/quit.sh", "env > \"$1\"\nexit 0\n");
  WriteScript(programs + "/sleeper.sh", "echo $$ > \"$1\"\nexec sleep 1000\n");

  ChaosClusterOptions options;
  options.workers = 1;
  options.cpu_devices_per_worker = 1;
  options.worker_flags = {"--programs-dir", programs, "--program-init-timeout", "2s"};
  ChaosCluster cluster("program", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(30))) << cluster.Logs();

  // Outside every programs dir: refused at submit, naming the directories.
  EXPECT_EQ(cluster.Submit(ProgramJob("outside", "/bin/true")),
            absl::StrCat("error: spec.program.path: '/bin/true' is not under a programs dir of "
                         "any worker (", programs, "); use a directory there or start a worker "
                         "with --programs-dir"));

  // A symlink inside that leads out: refused by the daemon, on its file system.
  std::string error = FailureOf(cluster, ProgramJob("escape", programs + "/escape"));
  EXPECT_THAT(error, HasSubstr(absl::StrCat("program ", programs, "/escape resolves to ", dir,
                                            "/outside.sh on host host-a (worker w-1), outside "
                                            "every programs dir")));

  // Missing on the host.
  error = FailureOf(cluster, ProgramJob("missing", programs + "/absent"));
  EXPECT_THAT(error, HasSubstr(absl::StrCat("program ", programs, "/absent not found on host "
                                            "host-a (worker w-1): No such file or directory; "
                                            "programs run from --programs-dir ", programs)));

  // Exits 0 at once without substrax::Init; it saw its environment and the launch file.
  const std::string env_file = dir + "/quit.env";
  error = FailureOf(cluster, ProgramJob("quit", programs + "/quit.sh", "[" + env_file + "]"));
  EXPECT_THAT(error, HasSubstr(absl::StrCat("the program ", programs, "/quit.sh exited (exit "
                                            "status 0) without calling substrax::Init")));
  const std::string env = ReadFile(env_file);
  EXPECT_THAT(env, HasSubstr("JOB_SETTING=mine\n"));
  EXPECT_THAT(env, HasSubstr(absl::StrCat("SUBSTRAX_LAUNCH=", cluster.dir(),
                                          "/worker-1/quit-")));
  EXPECT_THAT(env, HasSubstr("-attempt-1-process-0.launch\n"));

  // Never calls substrax::Init: stopped at the init timeout, and its process is gone.
  const std::string pid_file = dir + "/sleeper.pid";
  const absl::Time submitted = absl::Now();
  error = FailureOf(cluster, ProgramJob("sleeper", programs + "/sleeper.sh", "[" + pid_file + "]"));
  EXPECT_THAT(error, HasSubstr(absl::StrCat("the program ", programs, "/sleeper.sh did not call "
                                            "substrax::Init within 2s (--program-init-timeout): "
                                            "stalled")));
  EXPECT_LT(absl::Now() - submitted, absl::Seconds(30));
  int sleeper = 0;
  ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(pid_file)), &sleeper))
      << ReadFile(pid_file);
  EXPECT_TRUE(PollUntil([&] { return ProcessGone(sleeper); }, absl::Seconds(10)))
      << "the program " << sleeper << " outlived its attempt";

  // The worker kept serving: a built-in job succeeds on it.
  const std::string id = cluster.Submit(SyntheticJob("after", 1, 20));
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(120));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error() << cluster.Logs();

  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
  EXPECT_TRUE(ProcessGone(sleeper));
}

}  // namespace
}  // namespace substrax::testing
