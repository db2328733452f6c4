// Chaos 5, restart policy: a job whose data file is missing fails once, without restarts
// (retrying cannot help); a job whose runner is killed (a transient failure) is restarted
// after growing delays until its restarts are used up. Ends with the /proc check.
#include <signal.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/proto_time.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

// Data under the worker's data root (DATA_ROOT), which does not exist there: the submit check
// passes (by the path), the runner fails to open it.
constexpr char kMissingData[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: missing}
spec:
  model: {type: mlp, hidden_sizes: [8], num_classes: 10}
  data:
    format: idx
    train: {images: DATA_ROOT/nonexistent/train-images-idx3-ubyte.gz,
            labels: DATA_ROOT/nonexistent/train-labels-idx1-ubyte.gz}
  optimizer: {type: sgd, learning_rate: 0.1}
  mesh: {data_parallel_size: 1}
  batch: {global_batch_size: 8}
  steps: 10
  max_restarts: 5
)";

TEST(RestartPolicyTest, MissingDataFailsOnceAndATransientFailureBacksOff) {
  ChaosClusterOptions options;
  options.workers = 1;
  options.cpu_devices_per_worker = 1;
  options.coordinator_flags = {"--restart-backoff", "1s", "--max-restart-backoff", "10s"};
  const std::string data_root = TempDir("restart_policy_data");
  options.worker_flags = {"--data-root", data_root};
  ChaosCluster cluster("restart_policy", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(30))) << cluster.Logs();

  const std::string missing =
      cluster.Submit(absl::StrReplaceAll(kMissingData, {{"DATA_ROOT", data_root}}));
  ASSERT_EQ(missing.rfind("error", 0), std::string::npos) << missing;
  std::optional<v1::Job> job = cluster.WaitForEnd(missing, absl::Seconds(30));
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << job->DebugString();
  EXPECT_EQ(job->attempt(), 1) << "restarted although retrying cannot help";
  EXPECT_THAT(job->error(), HasSubstr(data_root + "/nonexistent/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(job->transitions().rbegin()->reason(), HasSubstr("retrying cannot help"));

  // Kill the runner of each attempt as soon as it is up.
  const std::string flaky =
      cluster.Submit(SyntheticJob("flaky", 1, 1000000, /*max_restarts=*/2));
  std::set<pid_t> killed;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    pid_t pid = 0;
    ASSERT_TRUE(PollUntil(
        [&] {
          for (const RunnerProcess& r : RunnersUnder(cluster.dir())) {
            if (r.launch.find(absl::StrCat("flaky-2-attempt-", attempt, "-")) !=
                std::string::npos) {
              pid = r.pid;
            }
          }
          return pid != 0;
        },
        absl::Seconds(30)))
        << cluster.Logs();
    kill(pid, SIGKILL);
    killed.insert(pid);
  }
  job = cluster.WaitForEnd(flaky, absl::Seconds(60));
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_FAILED) << job->DebugString() << cluster.Logs();
  EXPECT_EQ(job->attempt(), 3);
  EXPECT_THAT(job->error(), HasSubstr("signal 9"));
  EXPECT_THAT(job->transitions().rbegin()->reason(), HasSubstr("no restarts left"));
  // The delay from each failure (-> PENDING) to the next start (-> RUNNING) grows: 1 s, 2 s.
  std::vector<absl::Duration> delays;
  for (int i = 1; i < job->transitions_size(); ++i) {
    const v1::JobTransition& t = job->transitions(i);
    if (t.to() == v1::JOB_STATE_RUNNING &&
        job->transitions(i - 1).from() == v1::JOB_STATE_RUNNING) {
      delays.push_back(FromProtoTime(t.time()) - FromProtoTime(job->transitions(i - 1).time()));
    }
  }
  ASSERT_EQ(delays.size(), 2u) << job->DebugString();
  EXPECT_GE(delays[0], absl::Seconds(1));
  EXPECT_GE(delays[1], absl::Seconds(2));
  EXPECT_GT(delays[1], delays[0]);
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
