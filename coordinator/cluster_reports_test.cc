// Tests of Cluster: what runners report: progress, metric queries and their history, and the
// retention of ended jobs.
#include "coordinator/cluster.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/cluster_test_util.h"
#include "coordinator/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

TEST_F(ClusterTest, ReportsFeedProgressAndQueries) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  const uint64_t before = cluster_->version();
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 5, {{0, 1.0}, {1, 2.0}, {2, 3.0}, {3, 4.0}}))
                  .ok());
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 10, {{0, 0.5}, {2, 1.5}})).ok());
  EXPECT_GT(cluster_->version(), before);

  // Step 10 lacks devices 1 and 3: progress stays at step 5, which all four reported.
  const v1::JobProgress progress = Get(job).progress();
  EXPECT_EQ(progress.step(), 5);
  EXPECT_EQ(progress.total_steps(), 10);
  EXPECT_EQ(progress.metrics().at("loss"), 2.5);
  EXPECT_EQ(progress.metrics().at("step"), 5);
  // Every device's latest rate: devices 0 and 2 at step 10, devices 1 and 3 at step 5.
  EXPECT_EQ(progress.samples_per_second(), 400);

  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  query.set_group_by(v1::GROUP_BY_HOST);
  auto response = cluster_->QueryMetrics(query);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_THAT(response->series(), SizeIs(2));
  EXPECT_EQ(response->series(1).group(), "b");  // host set from the mesh
  EXPECT_EQ(response->series(1).points(1).value(), 1.5);
  EXPECT_EQ(response->series(1).points(1).num_values(), 1);
  EXPECT_EQ(response->series(1).points(1).expected_values(), 2);
  EXPECT_TRUE(response->series(1).points(1).partial());

  absl::Status outside = cluster_->ReportSteps(Steps(job, 1, 15, {{9, 1.0}}));
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(outside.message(), HasSubstr("device 9"));
  EXPECT_EQ(cluster_->ReportSteps(Steps(job, 2, 15, {{0, 1.0}})).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cluster_->ReportSteps(Steps("nope", 1, 15, {{0, 1.0}})).code(),
            absl::StatusCode::kNotFound);
  query.set_job_id("nope");
  EXPECT_EQ(cluster_->QueryMetrics(query).status().code(), absl::StatusCode::kNotFound);
}

// Issue 34's bug: host a's process reported step 20 first, and `watch` showed its mean, 0.3836,
// against the job's 0.3657 over all four devices.
TEST_F(ClusterTest, AStepIsShownOnceEveryDeviceReportedItAndMarkedPartialBefore) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_TRUE(
      cluster_->ReportSteps(Steps(job, 1, 10, {{0, 0.5}, {1, 0.5}, {2, 0.5}, {3, 0.5}})).ok());
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 20, {{0, 0.3900}, {1, 0.3772}})).ok());
  // Process 1 drives devices 2 and 3: one of its reports is not enough either.
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 20, {{2, 0.3500}})).ok());
  EXPECT_EQ(Get(job).progress().step(), 10);
  EXPECT_EQ(Get(job).progress().metrics().at("loss"), 0.5);

  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  auto partial = cluster_->QueryMetrics(query);
  ASSERT_TRUE(partial.ok()) << partial.status();
  ASSERT_EQ(partial->series(0).points_size(), 2);
  const v1::MetricPoint& whole = partial->series(0).points(0);
  EXPECT_EQ(whole.num_values(), 4);
  EXPECT_EQ(whole.expected_values(), 4);
  EXPECT_FALSE(whole.partial());
  const v1::MetricPoint& three = partial->series(0).points(1);
  EXPECT_EQ(three.step(), 20);
  EXPECT_EQ(three.num_values(), 3);
  EXPECT_EQ(three.expected_values(), 4);
  EXPECT_TRUE(three.partial());

  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 20, {{3, 0.3456}})).ok());
  const v1::JobProgress progress = Get(job).progress();
  EXPECT_EQ(progress.step(), 20);
  EXPECT_NEAR(progress.metrics().at("loss"), 0.3657, 1e-9);
  auto all = cluster_->QueryMetrics(query);
  ASSERT_TRUE(all.ok()) << all.status();
  const v1::MetricPoint& four = all->series(0).points(1);
  EXPECT_NEAR(four.value(), 0.3657, 1e-9);
  EXPECT_EQ(four.num_values(), 4);
  EXPECT_FALSE(four.partial());
}

TEST_F(ClusterTest, AnElasticAttemptExpectsTheDevicesOfItsOwnMesh) {
  Register("w-1", "a", 2);  // room for 2 of the 4 devices the data axis may have
  v1::JobSpec spec = Spec("elastic", 4);
  spec.mutable_mesh()->set_min_data_parallel_size(2);
  const std::string job = Submit(spec);
  ASSERT_EQ(Get(job).mesh().devices_size(), 2);
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 10, {{0, 1.0}, {1, 3.0}})).ok());
  EXPECT_EQ(Get(job).progress().step(), 10);
  EXPECT_EQ(Get(job).progress().metrics().at("loss"), 2.0);
  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  auto response = cluster_->QueryMetrics(query);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->series(0).points(0).expected_values(), 2);
  EXPECT_FALSE(response->series(0).points(0).partial());
}

TEST_F(ClusterTest, RunnersSayTheTotalStepsAndInputWidth) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  Register("w-1", "a", 2, "inc-1", {dir});
  Register("w-2", "b", 2);
  v1::JobSpec spec = Spec("files", 4);
  spec.mutable_data()->clear_synthetic();
  spec.mutable_data()->set_format(v1::DATA_FORMAT_IDX);
  // A FIFO nobody writes: opening it would block the coordinator forever, so this test would
  // time out if submit, progress or GetMesh read the data.
  const std::string fifo = dir + "/no-writer.fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  spec.mutable_data()->mutable_train()->set_images(fifo);
  spec.mutable_data()->mutable_train()->set_labels(fifo);
  spec.set_epochs(2);
  absl::StatusOr<v1::Job> submitted = cluster_->SubmitJob(spec);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string job = submitted->id();
  EXPECT_EQ(Get(job).progress().total_steps(), 0);
  v1::ReportStepsRequest steps = Steps(job, 1, 1, {{0, 1.0}});
  steps.mutable_reports(0)->set_total_steps(500);
  steps.mutable_reports(0)->set_input_features(784);
  ASSERT_TRUE(cluster_->ReportSteps(steps).ok());
  EXPECT_EQ(Get(job).progress().total_steps(), 500);
  EXPECT_EQ(Get(job).input_features(), 784);
  auto mesh = cluster_->GetMesh(job);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_GT(mesh->layouts().count("dense_0/kernel"), 0u);
  EXPECT_EQ(state_.Load()->jobs[0].input_features(), 784);  // stored with the job
}

TEST_F(ClusterTest, QueriesReadEarlierAttemptsFromTheStore) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4, 1, /*max_restarts=*/1));
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 5, {{0, 9.0}})).ok());
  ASSERT_TRUE(ReportStatus(job, 1, "w-1", 0, v1::RUNNER_STATE_FAILED).ok());
  RunFor(absl::Seconds(5), {"w-1", "w-2"});  // past the restart backoff
  ASSERT_EQ(Get(job).attempt(), 2);
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 2, 5, {{0, 1.0}})).ok());
  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  EXPECT_EQ(cluster_->QueryMetrics(query)->series(0).points(0).value(), 1.0);
  query.set_attempt(1);
  auto first = cluster_->QueryMetrics(query);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->attempt(), 1);
  EXPECT_EQ(first->series(0).points(0).value(), 9.0);
  query.set_attempt(3);
  EXPECT_THAT(cluster_->QueryMetrics(query).status().message(),
              HasSubstr("attempts with metrics: 1, 2"));
}

TEST_F(ClusterTest, MetricHistoryIsPrunedToAWindowAndAStride) {
  options_.metrics_raw_steps = 100;
  options_.metrics_history_every = 50;
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 1));
  for (int64_t step = 10; step <= 400; step += 10) {
    ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, step, {{0, 1.0}})).ok());
  }
  auto kept = state_.ReadReports(job, 1);
  ASSERT_TRUE(kept.ok());
  std::set<int64_t> steps;
  for (const auto& r : *kept) steps.insert(r.step());
  // Prunes run every quarter window (26 steps of growth), the last at step 380: from 280 on
  // every point stays; well before, only the multiples of 50.
  for (int64_t step = 10; step < 250; step += 10) {
    EXPECT_EQ(steps.count(step), step % 50 == 0 ? 1u : 0u) << step;
  }
  for (int64_t step = 280; step <= 400; step += 10) EXPECT_EQ(steps.count(step), 1u) << step;
  // The query reads the same history.
  v1::QueryMetricsRequest query;
  query.set_job_id(job);
  query.add_names("loss");
  auto series = cluster_->QueryMetrics(query);
  ASSERT_TRUE(series.ok()) << series.status();
  EXPECT_EQ(series->series(0).points_size(), static_cast<int>(steps.size()));
}

TEST_F(ClusterTest, DeleteJobRemovesAnEndedJobAndItsPoints) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_TRUE(cluster_->ReportSteps(Steps(job, 1, 5, {{0, 1.0}})).ok());
  absl::Status running = cluster_->DeleteJob(job);
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(running.message(), HasSubstr("cancel it first"));
  ASSERT_TRUE(cluster_->CancelJob(job, "").ok());
  ASSERT_TRUE(cluster_->DeleteJob(job).ok());
  EXPECT_EQ(cluster_->GetJob(job).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->DeleteJob(job).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*state_.CountReports(), 0);
  EXPECT_TRUE(state_.Load()->jobs.empty());
}

TEST_F(ClusterTest, EndedJobsExpireByAgeAndCount) {
  options_.max_finished_jobs = 2;
  options_.finished_job_ttl = absl::Hours(1);
  cluster_ = MakeCluster(state_);
  std::vector<std::string> ids;
  for (const char* name : {"a", "b", "c"}) {
    ids.push_back(Submit(Spec(name, 1)));
    ASSERT_TRUE(cluster_->CancelJob(ids.back(), "").ok());
    now_ += absl::Minutes(1);
  }
  cluster_->Tick();
  // Three ended, two kept: the oldest went.
  EXPECT_EQ(cluster_->GetJob(ids[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(cluster_->GetJob(ids[1]).ok());
  EXPECT_EQ(state_.Load()->jobs.size(), 2u);
  now_ += absl::Hours(1);
  cluster_->Tick();
  EXPECT_THAT(cluster_->ListJobs({}), IsEmpty());
  EXPECT_TRUE(state_.Load()->jobs.empty());
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

TEST_F(ClusterTest, ADeviceWhoseComputeStaysSlowerIsFlaggedAsAStraggler) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("slow", 4));
  for (int64_t step = 10; step <= 200; step += 10) {
    v1::ReportStepsRequest request = Steps(job, 1, step, {{0, 1}, {1, 1}, {2, 1}, {3, 1}});
    for (v1::StepReport& r : *request.mutable_reports()) {
      r.set_compute_seconds(r.device_id() == 3 ? 2.0 : 1.0);
      r.set_data_wait_seconds(0.1);
    }
    ASSERT_TRUE(cluster_->ReportSteps(request).ok());
  }
  const v1::Job running = Get(job);
  ASSERT_EQ(running.stragglers_size(), 1);
  const v1::Straggler& s = running.stragglers(0);
  EXPECT_EQ(s.device_id(), 3);
  EXPECT_EQ(s.process_index(), 1);
  EXPECT_EQ(s.host(), "b");
  EXPECT_EQ(s.phase(), "compute");
  EXPECT_DOUBLE_EQ(s.ratio(), 2.0);
  std::string reasons;
  for (const v1::JobTransition& t : running.transitions()) absl::StrAppend(&reasons, t.reason());
  EXPECT_THAT(reasons, ::testing::HasSubstr("straggler: device 3 (process 1, worker w-2 (host b)): "
                                            "its compute time is 2.00x the other devices' median"));
}

}  // namespace
}  // namespace substrax
