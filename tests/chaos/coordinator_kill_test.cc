// Chaos 2, coordinator SIGKILL: the coordinator dies at a compiled-in failpoint (armed by
// SUBSTRAX_FAILPOINTS) or mid-job, and is restarted on the same port and state after 0 s or
// after 2 x heartbeat_timeout.
//   before_send_start  the attempt is stored but no daemon heard of it
//   between_successes  one process's SUCCEEDED is acknowledged, the other's arrives
//   before_send_stop   a cancel is stored, its stop not yet sent
//   mid_job            plain SIGKILL while the runners train
// Restarted at once, jobs go on in their attempt; restarted after 2 x heartbeat_timeout, the
// daemons have fenced their runners, so a running attempt ends FAILED ("coordinator
// unreachable") and the job succeeds in a later one. Always: the job reaches the right state,
// never two runners of one job at once, nothing left in /proc, and no acknowledged record lost:
// the job's transitions and every device's metric points that a client polling every 20 ms
// was served before the kill are all still served at the end.
#include <signal.h>

#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/chaos/harness.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kHeartbeatTimeout = absl::Seconds(3);

class CoordinatorKillTest
    : public ::testing::TestWithParam<std::tuple<std::string, bool /*restart late*/>> {};

TEST_P(CoordinatorKillTest, JobsReachTheRightStateAfterARestart) {
  const auto& [failpoint, late] = GetParam();
  ChaosClusterOptions options;
  options.heartbeat_timeout = absl::StrCat(absl::ToInt64Seconds(kHeartbeatTimeout), "s");
  if (failpoint != "mid_job") {
    options.coordinator_env = {absl::StrCat("SUBSTRAX_FAILPOINTS=", failpoint)};
  }
  ChaosCluster cluster(absl::StrCat("kill_", failpoint, late ? "_late" : "_now"), options);
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(30))) << cluster.Logs();
  RunnerWatch watch(cluster.dir());

  // A short job that may restart once. Killed mid-job, it must still run well past the fence
  // (heartbeat_timeout after the kill): ~130 steps/s here, so 2000 steps take ~15 s, and an
  // attempt that ends before its daemons fence it rightly succeeds in attempt 1.
  const bool cancel = failpoint == "before_send_stop";
  std::string id = cluster.Submit(
      SyntheticJob("victim", 4, cancel ? 1000000 : (failpoint == "mid_job" ? 2000 : 150), 1));
  if (failpoint == "before_send_start" && id.rfind("error", 0) == 0) {
    // It died as it scheduled the job, before answering; the job was stored first.
    id = "victim-1";
  }
  ASSERT_EQ(id.rfind("error", 0), std::string::npos) << id;
  // What a client is told until the coordinator dies: none of it may be lost.
  AcknowledgedRecords acknowledged(cluster.address(), id);
  std::optional<v1::Job> before;
  if (failpoint == "mid_job" || cancel) {
    ASSERT_TRUE(PollUntil(
        [&] {
          before = cluster.Get(id);
          // Mid-job: also until the client has seen metric points, so that the kill comes
          // after steps were served (reports now arrive in batches, off the step loop).
          const std::optional<v1::QueryMetricsResponse> seen = acknowledged.metrics();
          return before.has_value() && before->progress().step() > 0 &&
                 (failpoint != "mid_job" ||
                  (acknowledged.job().has_value() && seen.has_value() && seen->series_size() > 0));
        },
        absl::Seconds(60)))
        << cluster.Logs();
  }
  if (failpoint == "mid_job") cluster.coordinator().Signal(SIGKILL);
  if (cancel) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::CancelJobRequest request;
    request.set_job_id(id);
    v1::CancelJobResponse response;
    cluster.jobs()->CancelJob(&context, request, &response);  // may die answering
  }
  std::optional<int> died = cluster.coordinator().Wait(absl::Seconds(60));
  ASSERT_EQ(died, 128 + SIGKILL) << "the coordinator did not die at " << failpoint << "\n"
                                 << cluster.Logs();
  acknowledged.Stop();
  const std::optional<v1::Job> acked_job = acknowledged.job();
  const std::optional<v1::QueryMetricsResponse> acked_points = acknowledged.metrics();
  if (failpoint == "mid_job") {
    // It was killed after it had served steps: the comparison below is not vacuous.
    ASSERT_TRUE(acked_job.has_value() && acked_points.has_value() &&
                acked_points->series_size() > 0);
  }
  if (late) {
    // The outage under test: longer than the lease, so the daemons fence their runners.
    absl::SleepFor(2 * kHeartbeatTimeout);
  }
  cluster.StartCoordinator();
  const absl::Time restarted = absl::Now();

  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(90));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  // No acknowledged record lost: the transitions a client saw are a prefix of the final ones,
  // and every metric point it saw is still served (of its attempt, even after a restart).
  if (acked_job.has_value()) {
    EXPECT_EQ(LostJobRecords(*acked_job, *job), "") << job->DebugString();
  }
  if (acked_points.has_value()) {
    std::optional<v1::QueryMetricsResponse> points =
        cluster.DeviceMetrics(id, acked_points->attempt());
    ASSERT_TRUE(points.has_value()) << "attempt " << acked_points->attempt() << " has no metrics";
    EXPECT_EQ(LostMetricPoints(*acked_points, *points), "");
  }
  if (cancel) {
    EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED) << job->DebugString();
    // The stop that never left is derived again from the stored state (or the runner was
    // fenced): the runner is gone within 2 x heartbeat_timeout of the restart.
    EXPECT_TRUE(PollUntil([&] { return RunnersUnder(cluster.dir()).empty(); },
                          2 * kHeartbeatTimeout - (absl::Now() - restarted)))
        << cluster.Logs();
  } else {
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->DebugString() << cluster.Logs();
    if (!late || failpoint != "mid_job") {
      // Nothing was running that a fence could stop: the job goes on in its attempt.
      EXPECT_EQ(job->attempt(), 1) << job->DebugString() << cluster.Logs();
    } else {
      EXPECT_EQ(job->attempt(), 2) << job->DebugString();
      // The daemons fenced their runners. The attempt's root cause is the first outcome the
      // restarted coordinator hears: a fenced runner ("coordinator unreachable"), or its peer
      // that saw it go first (a collective error, or SIGPIPE).
      EXPECT_THAT(cluster.Logs(), HasSubstr("): fencing, since the coordinator may restart"));
      EXPECT_EQ(job->transitions(job->transitions_size() - 3).to(), v1::JOB_STATE_PENDING);
    }
    EXPECT_GT(job->progress().final_metrics().count("test_accuracy"), 0u);
  }
  // The interrupted attempt ended (or went on) promptly after the restart.
  for (const v1::JobTransition& t : job->transitions()) {
    if (t.from() == v1::JOB_STATE_RUNNING && t.attempt() == 1 && late && failpoint == "mid_job") {
      EXPECT_LT(absl::FromUnixSeconds(t.time().seconds()), restarted + 2 * kHeartbeatTimeout);
    }
  }
  EXPECT_EQ(watch.Overlaps(), 0) << "two runners of one job were alive at once";
  for (const auto& [launch, pids] : watch.Seen()) {
    EXPECT_EQ(pids.size(), 1u) << launch;
  }
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

INSTANTIATE_TEST_SUITE_P(
    Failpoints, CoordinatorKillTest,
    ::testing::Combine(::testing::Values("before_send_start", "between_successes",
                                         "before_send_stop", "mid_job"),
                       ::testing::Bool()),
    [](const auto& info) {
      return absl::StrCat(std::get<0>(info.param), std::get<1>(info.param) ? "_late" : "_now");
    });

}  // namespace
}  // namespace substrax::testing
