// What the tests of Cluster share (cluster_*_test.cc): a Cluster on a fake clock over an
// in-memory state store, with helpers that register workers, submit jobs and report for them.
#ifndef SUBSTRAX_COORDINATOR_CLUSTER_TEST_UTIL_H_
#define SUBSTRAX_COORDINATOR_CLUSTER_TEST_UTIL_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/cluster.h"
#include "coordinator/state_store.h"
#include "gtest/gtest.h"

namespace substrax {

// A valid data-parallel job of `dp` devices, or a hybrid one when mp > 1.
v1::JobSpec Spec(const std::string& name, int dp, int mp = 1, int max_restarts = 0);

// A ReportSteps request of `job`'s attempt at `step`: one report per (device id, loss).
v1::ReportStepsRequest Steps(const std::string& job, int attempt, int64_t step,
                             const std::vector<std::pair<int, double>>& losses);

// A Cluster on `now_` over `state_`, remembering which attempts ended (`ended_`).
class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override;

  // A Cluster with `options_` over `state`; null (and a test failure) when it cannot start.
  std::unique_ptr<Cluster> MakeCluster(StateStore& state);

  // Registers a worker of `num_devices` CPU devices (and resets its Poll cursor).
  v1::RegisterWorkerResponse Register(const std::string& worker_id, const std::string& host,
                                      int num_devices, const std::string& incarnation = "inc-1",
                                      const std::vector<std::string>& data_roots = {},
                                      const std::vector<std::string>& checkpoint_roots = {});

  // Register with the other fields of `request` (programs dirs, Python environments, ...).
  v1::RegisterWorkerResponse Register(const std::string& worker_id, const std::string& host,
                                      int num_devices, const std::string& incarnation,
                                      const std::vector<std::string>& data_roots,
                                      const std::vector<std::string>& checkpoint_roots,
                                      v1::RegisterWorkerRequest request);

  // Two workers with two devices each: w-1 on host a (devices 0, 1), w-2 on host b (2, 3).
  void RegisterTwoWorkers();
  // The same two running command jobs (runs_commands) from the programs dir /opt/p.
  void RegisterTwoCommandWorkers();

  // The events of `worker_id` since the last Poll.
  std::vector<v1::WatchAssignmentsResponse> Poll(const std::string& worker_id,
                                                 const std::string& incarnation = "inc-1");

  // Submits `spec`; its job id ("" and a test failure when refused).
  std::string Submit(const v1::JobSpec& spec);

  v1::Job Get(const std::string& job_id);

  // Reports `state` for one process of an attempt; a failure carries an error, a stderr tail
  // and exit code 1, process 0 a final test_accuracy of 0.875.
  absl::Status ReportStatus(const std::string& job_id, int attempt, const std::string& worker,
                            int process, v1::RunnerState state);

  // Heartbeats every worker in `alive` every second for `d` (advancing both clocks), then
  // ticks.
  void RunFor(absl::Duration d, const std::vector<std::string>& alive);

  // The states a job went through, in order.
  std::vector<v1::JobState> States(const v1::Job& job);

  // Most tests see jobs wait for workers that come later, so the submit policy queues jobs the
  // alive workers cannot hold; SubmitRefusesWhatTheAliveWorkersCouldNeverHold turns it back on.
  ClusterOptions options_ = [] {
    ClusterOptions options;
    options.refuse_jobs_that_cannot_fit = false;
    return options;
  }();
  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  // With split_clocks_ (set before MakeCluster), the lease clock (durations) is lease_now_, not
  // now_ (the wall clock); RunFor advances both.
  bool split_clocks_ = false;
  absl::Time lease_now_ = absl::FromUnixSeconds(5000);
  InMemoryStateStore state_;
  std::unique_ptr<Cluster> cluster_;
  std::map<std::string, int64_t> cursors_;
  std::vector<std::pair<std::string, int>> ended_;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_CLUSTER_TEST_UTIL_H_
