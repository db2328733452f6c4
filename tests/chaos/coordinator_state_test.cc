// The coordinator's state across restarts, with real processes: a deleted job's id is never
// handed out again (the daemons would take the new job's assignment for a replay of the old
// one and ignore it), and --state-dir is one coordinator's, private to its user.
#include <signal.h>
#include <sys/stat.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

// Submits `yaml`, waits for the job to end and expects it SUCCEEDED; its id.
std::string RunToSuccess(ChaosCluster& cluster, const std::string& yaml) {
  const std::string id = cluster.Submit(yaml);
  EXPECT_EQ(id.rfind("error", 0), std::string::npos) << id;
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(120));
  EXPECT_TRUE(job.has_value()) << cluster.Logs();
  if (job.has_value()) {
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString() << cluster.Logs();
  }
  return id;
}

TEST(CoordinatorStateTest, ADeletedJobsIdIsNotReusedAfterARestart) {
  ChaosCluster cluster("ids_after_delete", ChaosClusterOptions{});
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  const std::string spec = SyntheticJob("again", 4, 60);
  const std::string first = RunToSuccess(cluster, spec);
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::DeleteJobRequest request;
    request.set_job_id(first);
    v1::DeleteJobResponse response;
    const grpc::Status deleted = cluster.jobs()->DeleteJob(&context, request, &response);
    ASSERT_TRUE(deleted.ok()) << deleted.error_message();
  }
  cluster.coordinator().Signal(SIGTERM);
  ASSERT_EQ(cluster.coordinator().Wait(absl::Seconds(30)), 0) << cluster.Logs();
  cluster.StartCoordinator();
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();

  // The same spec again: a new id, and the daemons run it (a reused id stalled at step 0).
  const std::string second = RunToSuccess(cluster, spec);
  EXPECT_NE(second, first);
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) return 07777;  // missing: never a mode expected below
  return st.st_mode & 07777;
}

TEST(CoordinatorStateTest, TheStateDirIsOneCoordinatorsAndPrivate) {
  ChaosCluster cluster("state_dir_lock", ChaosClusterOptions{});
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  RunToSuccess(cluster, SyntheticJob("private", 2, 20));

  // A second coordinator on the same directory stops at start, naming it and the holder.
  const std::string state_dir = cluster.dir() + "/state";
  Process second({Runfile("coordinator/substrax-coordinator"), "--listen", "127.0.0.1:0",
                  "--metrics-listen", "", "--state-dir", state_dir, "--insecure"},
                 cluster.dir() + "/second-coordinator.log");
  EXPECT_EQ(second.Wait(absl::Seconds(30)), 1) << second.Log();
  EXPECT_THAT(second.Log(), HasSubstr(absl::StrCat("--state-dir ", state_dir,
                                                   " is in use by another coordinator (pid ",
                                                   cluster.coordinator().pid())));
  // The first goes on serving.
  RunToSuccess(cluster, SyntheticJob("still", 2, 20));

  // Everything in the directory is its user's alone: the database with its WAL and shared
  // memory, the rendezvous key, the lock.
  EXPECT_EQ(ModeOf(state_dir), 0700u);
  for (const char* file : {"substrax.db", "substrax.db-wal", "substrax.db-shm", "rendezvous.key",
                           "coordinator.lock"}) {
    EXPECT_EQ(ModeOf(absl::StrCat(state_dir, "/", file)), 0600u) << file;
  }
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
