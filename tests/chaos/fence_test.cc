// Fencing by the job processes' supervisors (agent/supervisor.h), with real processes:
// - an agent stopped with SIGSTOP while its job runs (the built-in trainer, and a plain command
//   that never talks to the coordinator, so that only its supervisor can stop it): the job's
//   process is gone within the lease (the heartbeat timeout), attempt 2 starts on the other
//   worker and never overlaps attempt 1 (RunnerWatch), and the job goes on training or
//   succeeds; once continued, the stopped agent registers again;
// - an agent killed with SIGKILL: its job process gets SIGTERM at once and SIGKILL only after
//   the stop grace.
// Each ends with the /proc check that no process (agent, supervisor, job) outlived the test.
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

// The job processes of `worker` (1-based), by their launch file's directory.
std::vector<RunnerProcess> RunnersOf(ChaosCluster& cluster, int worker) {
  return RunnersUnder(absl::StrCat(cluster.dir(), "/worker-", worker, "/"));
}

// A cluster of two workers (one device each) whose agents run programs from `programs`.
ChaosClusterOptions TwoWorkers(const std::string& programs) {
  ChaosClusterOptions options;
  options.workers = 2;
  options.cpu_devices_per_worker = 1;
  options.heartbeat_interval = "500ms";
  options.heartbeat_timeout = "3s";
  options.stop_grace = "2s";
  options.coordinator_flags = {"--restart-backoff", "200ms"};
  options.worker_flags = {"--programs-dir", programs};
  return options;
}

// Waits until a job process runs on one worker (and `ready` holds); that worker (1 or 2).
template <typename F>
int BusyWorker(ChaosCluster& cluster, F ready) {
  int busy = 0;
  EXPECT_TRUE(PollUntil(
      [&] {
        for (int w : {1, 2}) {
          if (!RunnersOf(cluster, w).empty()) busy = w;
        }
        return busy != 0 && ready();
      },
      absl::Seconds(60)))
      << cluster.Logs();
  return busy;
}

// SIGSTOPs the agent of `busy`, which runs attempt 1 of `id`: its job process must be gone
// within the 3 s lease, and attempt 2 start on the other worker. `watch` must not have seen
// the two overlap.
void StopAgentAndExpectAttemptTwoElsewhere(ChaosCluster& cluster, const std::string& id,
                                           int busy, RunnerWatch& watch) {
  const std::vector<RunnerProcess> first = RunnersOf(cluster, busy);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_TRUE(absl::StrContains(first[0].launch, "-attempt-1-")) << first[0].launch;
  // Only the agent's pid: its supervisors are in groups of their own and keep running.
  cluster.worker(busy - 1).Signal(SIGSTOP);
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(PollUntil([&] { return RunnersOf(cluster, busy).empty(); }, absl::Seconds(20)))
      << cluster.Logs();
  const absl::Duration gone_after = absl::Now() - stopped;
  // The supervisor sends SIGTERM before the 3 s lease ends; the process exits on it at once.
  // The margin is for a machine loaded by other builds.
  EXPECT_LT(gone_after, absl::Seconds(3) + absl::Milliseconds(1500))
      << "attempt 1's process outlived the lease by too much: " << gone_after;
  EXPECT_EQ(ProcessState(cluster.worker(busy - 1).pid()), 'T') << "the agent is still stopped";
  ASSERT_TRUE(PollUntil(
      [&] {
        for (const RunnerProcess& r : RunnersOf(cluster, 3 - busy)) {
          if (absl::StrContains(r.launch, absl::StrCat(id, "-attempt-2-"))) return true;
        }
        return false;
      },
      absl::Seconds(60)))
      << cluster.Logs();
  EXPECT_EQ(watch.Overlaps(), 0) << "attempt 2 ran while attempt 1 was alive\n" << cluster.Logs();
}

// Continues the stopped agent of `busy`: it finds its lease lost and registers again.
void ContinueAgent(ChaosCluster& cluster, int busy) {
  cluster.worker(busy - 1).Signal(SIGCONT);
  EXPECT_TRUE(PollUntil(
      [&] {
        return absl::StrContains(cluster.worker(busy - 1).Log(), "lease lost") &&
               cluster.WaitForWorkers(2, absl::Seconds(1));
      },
      absl::Seconds(30)))
      << cluster.Logs();
}

TEST(FenceTest, AStoppedAgentsTrainerIsFencedWithinTheLeaseAndAttemptTwoNeverOverlapsIt) {
  ChaosCluster cluster("fence_stopped", TwoWorkers(TempDir("fence_stopped_programs")));
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  RunnerWatch watch(cluster.dir());
  const std::string id = cluster.Submit(SyntheticJob("fenced", 1, 10000000, /*max_restarts=*/3));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  const int busy = BusyWorker(cluster, [&] {
    std::optional<v1::Job> job = cluster.Get(id);
    return job.has_value() && job->progress().step() > 0;
  });
  ASSERT_NE(busy, 0);
  StopAgentAndExpectAttemptTwoElsewhere(cluster, id, busy, watch);
  // Attempt 2 trains: its steps go on (attempt 1 is gone and cannot report).
  int64_t step = -1;
  EXPECT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        if (!job.has_value() || job->attempt() != 2) return false;
        if (step < 0) step = job->progress().step();
        return job->progress().step() > step;
      },
      absl::Seconds(60)))
      << "attempt 2 does not train\n"
      << cluster.Logs();
  ContinueAgent(cluster, busy);
  EXPECT_EQ(watch.Overlaps(), 0) << cluster.Logs();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

// The same with a plain command that never talks to the coordinator (no SDK): only its
// supervisor can stop it. It joins its job by creating its started file, runs 8 s and succeeds.
TEST(FenceTest, AStoppedAgentsPlainCommandIsFencedByItsSupervisorAndTheJobSucceeds) {
  const std::string programs = TempDir("fence_plain_programs");
  std::ofstream(programs + "/plain.sh")
      << "#!/bin/sh\ntouch \"${SUBSTRAX_LAUNCH%.launch}.started\"\n"
         "i=0; while [ $i -lt 80 ]; do sleep 0.1; i=$((i+1)); done\nexit 0\n";
  chmod((programs + "/plain.sh").c_str(), 0755);
  ChaosCluster cluster("fence_plain", TwoWorkers(programs));
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  RunnerWatch watch(cluster.dir());
  const std::string id = cluster.Submit(absl::StrCat(
      "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: plain}\nspec:\n  program:\n"
      "    path: ",
      programs, "/plain.sh\n  mesh: {data_parallel_size: 1}\n  max_restarts: 3\n"));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  const int busy = BusyWorker(cluster, [] { return true; });
  ASSERT_NE(busy, 0);
  StopAgentAndExpectAttemptTwoElsewhere(cluster, id, busy, watch);
  EXPECT_TRUE(absl::StrContains(cluster.worker(busy - 1).Log(),
                                "the agent did not renew the attempt's lease in time"))
      << cluster.worker(busy - 1).Log();
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(60));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error() << "\n" << cluster.Logs();
  EXPECT_EQ(job->attempt(), 2);
  ContinueAgent(cluster, busy);
  EXPECT_EQ(watch.Overlaps(), 0) << cluster.Logs();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

TEST(FenceTest, AKilledAgentsJobGetsSigtermAndTheGraceBeforeSigkill) {
  const std::string files = TempDir("fence_killed_files");
  const std::string programs = files + "/programs";
  std::filesystem::create_directories(programs);
  // Notes SIGTERM and goes on: only SIGKILL ends it.
  std::ofstream(programs + "/stubborn.sh")
      << "#!/bin/sh\ntrap 'echo term > \"$2\"' TERM\necho $$ > \"$1\"\n"
         "while :; do sleep 0.05; done\n";
  chmod((programs + "/stubborn.sh").c_str(), 0755);
  const std::string pid_file = files + "/pid";
  const std::string term_file = files + "/term";

  ChaosClusterOptions options;
  options.workers = 1;
  options.cpu_devices_per_worker = 1;
  options.stop_grace = "3s";
  options.worker_flags = {"--programs-dir", programs};
  ChaosCluster cluster("fence_killed", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(30))) << cluster.Logs();
  const std::string id = cluster.Submit(absl::StrCat(
      "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: stubborn}\nspec:\n  program:\n"
      "    path: ",
      programs, "/stubborn.sh\n    args: [", pid_file, ", ", term_file,
      "]\n  mesh: {data_parallel_size: 1}\n"));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  pid_t job = 0;
  ASSERT_TRUE(PollUntil([&] { return bool(std::ifstream(pid_file) >> job) && job > 0; },
                        absl::Seconds(60)))
      << cluster.Logs();

  cluster.worker(0).Signal(SIGKILL);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(PollUntil([&] { return std::ifstream(term_file).good(); }, absl::Seconds(10)))
      << cluster.Logs();
  const absl::Time termed = absl::Now();
  EXPECT_LT(termed - killed, absl::Seconds(2)) << "SIGTERM came late";
  ASSERT_TRUE(PollUntil([&] { return ProcessState(job) == '?' || ProcessState(job) == 'Z'; },
                        absl::Seconds(20)))
      << cluster.Logs();
  const absl::Time gone = absl::Now();
  // SIGKILL only after the 3 s grace (less a polling period), and not much later.
  EXPECT_GE(gone - termed, absl::Milliseconds(2800)) << "SIGKILL came before the grace";
  EXPECT_LT(gone - termed, absl::Seconds(3) + absl::Seconds(3));
  EXPECT_TRUE(absl::StrContains(cluster.worker(0).Log(), "the agent is gone"))
      << cluster.worker(0).Log();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
