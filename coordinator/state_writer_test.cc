#include "coordinator/state_writer.h"

#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/poll.h"

namespace substrax {
namespace {

v1::Job Job(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  return job;
}

v1::StepReport Report(const std::string& job, int64_t step) {
  v1::StepReport r;
  r.set_job_id(job);
  r.set_attempt(1);
  r.set_step(step);
  return r;
}

// A store whose commits block until released, to observe what the writer batches.
class GatedStore final : public StateStore {
 public:
  absl::Status Commit(const StateBatch& batch) override {
    {
      absl::MutexLock lock(&mu_);
      entered_ = true;
      mu_.Await(absl::Condition(&open_));
      batches_.push_back(batch);
    }
    return inner_.Commit(batch);
  }
  absl::StatusOr<Snapshot> Load() override { return inner_.Load(); }
  absl::StatusOr<std::vector<int>> ReportedAttempts(const std::string& id) override {
    return inner_.ReportedAttempts(id);
  }
  absl::StatusOr<std::vector<v1::StepReport>> ReadReports(const std::string& id,
                                                          int attempt) override {
    return inner_.ReadReports(id, attempt);
  }
  absl::StatusOr<std::vector<v1::StepReport>> LatestReports(const std::string& id, int attempt,
                                                            int steps) override {
    return inner_.LatestReports(id, attempt, steps);
  }
  absl::StatusOr<int64_t> CountReports() override { return inner_.CountReports(); }
  absl::StatusOr<std::vector<LogExtent>> LogExtents(const std::string& id, int attempt) override {
    return inner_.LogExtents(id, attempt);
  }
  absl::StatusOr<std::vector<LogChunk>> ReadLogChunks(const std::string& id, int attempt,
                                                      int process, int64_t from,
                                                      int64_t max_bytes) override {
    return inner_.ReadLogChunks(id, attempt, process, from, max_bytes);
  }

  void Open() {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }
  void AwaitEntered() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&entered_));
  }
  std::vector<StateBatch> batches() {
    absl::MutexLock lock(&mu_);
    return batches_;
  }
  InMemoryStateStore inner_;

 private:
  absl::Mutex mu_;
  bool open_ ABSL_GUARDED_BY(mu_) = false;
  bool entered_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<StateBatch> batches_ ABSL_GUARDED_BY(mu_);
};

TEST(StateWriterTest, WaitReturnsOnceCommittedAndLoadSeesIt) {
  InMemoryStateStore store;
  StateWriter writer(&store);
  EXPECT_TRUE(writer.Wait(0).ok());
  const uint64_t a = writer.PutJob(Job("a-1", v1::JOB_STATE_PENDING));
  const uint64_t b = writer.AppendReports({Report("a-1", 10)});
  EXPECT_LT(a, b);
  ASSERT_TRUE(writer.Wait(b).ok());
  auto snapshot = store.Load();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_EQ(*store.CountReports(), 1);
}

TEST(StateWriterTest, GroupCommitCoalescesJobsAndKeepsReportOrder) {
  GatedStore store;
  StateWriter writer(&store);
  writer.PutJob(Job("first-1", v1::JOB_STATE_PENDING));
  store.AwaitEntered();  // the first commit is in flight and blocked
  writer.PutJob(Job("a-1", v1::JOB_STATE_PENDING));
  writer.AppendReports({Report("a-1", 10)});
  writer.PutJob(Job("a-1", v1::JOB_STATE_RUNNING));  // replaces the queued version
  const uint64_t last = writer.AppendReports({Report("a-1", 20)});
  store.Open();
  ASSERT_TRUE(writer.Wait(last).ok());
  const std::vector<StateBatch> batches = store.batches();
  ASSERT_EQ(batches.size(), 2u) << "everything queued behind the first commit goes in one";
  ASSERT_EQ(batches[1].jobs.size(), 1u);
  EXPECT_EQ(batches[1].jobs[0].state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(batches[1].reports.size(), 2u);
  EXPECT_EQ(batches[1].reports[0].step(), 10);
  EXPECT_EQ(batches[1].reports[1].step(), 20);
}

LogChunk Piece(const std::string& job, int64_t offset, const std::string& data) {
  LogChunk c;
  c.job_id = job;
  c.attempt = 1;
  c.offset = offset;
  c.data = data;
  return c;
}

TEST(StateWriterTest, LogChunksRideInTheSameGroupCommitAndGoWithTheirJob) {
  GatedStore store;
  StateWriter writer(&store);
  writer.PutJob(Job("first-1", v1::JOB_STATE_PENDING));
  store.AwaitEntered();
  writer.AppendLog(Piece("a-1", 0, "one\n"));
  writer.PutJob(Job("a-1", v1::JOB_STATE_RUNNING));
  writer.AppendLog(Piece("a-1", 4, "two\n"));
  writer.AppendLog(Piece("gone-2", 0, "x\n"));
  const uint64_t last = writer.DeleteJob("gone-2");  // its queued chunk is not written
  store.Open();
  ASSERT_TRUE(writer.Wait(last).ok());
  const std::vector<StateBatch> batches = store.batches();
  ASSERT_EQ(batches.size(), 2u) << "logs add no commit of their own";
  ASSERT_EQ(batches[1].log_chunks.size(), 2u);
  EXPECT_EQ(batches[1].log_chunks[0].data, "one\n");
  EXPECT_EQ(batches[1].log_chunks[1].data, "two\n");
  EXPECT_EQ(batches[1].jobs.size(), 1u);
}

TEST(StateWriterTest, AFailedCommitAnswersItsWaitersAndIsRetried) {
  InMemoryStateStore store;
  store.FailNextCommits(2);
  StateWriter writer(&store);
  const uint64_t ticket = writer.PutJob(Job("a-1", v1::JOB_STATE_PENDING));
  absl::Status first = writer.Wait(ticket);
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  // Nothing is dropped: the writer commits it again (after backoffs of 50 and 100 ms).
  const uint64_t later = writer.PutJob(Job("b-2", v1::JOB_STATE_PENDING));
  EXPECT_TRUE(testing::PollUntil([&] { return writer.commits() > 0; },
                                 absl::Now() + absl::Seconds(30), "the writer's retried commit"));
  ASSERT_EQ(writer.commits(), 1);
  ASSERT_TRUE(writer.Wait(later).ok());
  auto snapshot = store.Load();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs.size(), 2u);
  EXPECT_GE(writer.failed_commits(), 2);
}

TEST(StateWriterTest, ADeletedJobTakesItsQueuedRecordsAlong) {
  InMemoryStateStore store;
  StateWriter writer(&store);
  ASSERT_TRUE(writer.Wait(writer.PutJob(Job("a-1", v1::JOB_STATE_SUCCEEDED))).ok());
  ASSERT_TRUE(writer.Wait(writer.AppendReports({Report("a-1", 10)})).ok());
  writer.AppendReports({Report("a-1", 20)});
  ASSERT_TRUE(writer.Wait(writer.DeleteJob("a-1")).ok());
  auto snapshot = store.Load();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_TRUE(snapshot->jobs.empty());
  EXPECT_EQ(*store.CountReports(), 0);
}

TEST(StateWriterTest, TheNewestOfAWorkersPutAndDeletionWins) {
  InMemoryStateStore store;
  StateWriter writer(&store);
  v1::Worker w1;
  w1.set_worker_id("w-1");
  v1::Worker w2;
  w2.set_worker_id("w-2");
  ASSERT_TRUE(writer.Wait(writer.PutWorker(w1)).ok());
  ASSERT_TRUE(writer.Wait(writer.PutWorker(w2)).ok());
  // w-1: deleted, then registered again; w-2: changed, then deleted (in one batch or two).
  writer.DeleteWorker("w-1");
  writer.PutWorker(w1);
  writer.PutWorker(w2);
  ASSERT_TRUE(writer.Wait(writer.DeleteWorker("w-2")).ok());
  auto snapshot = store.Load();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->workers.size(), 1u);
  EXPECT_EQ(snapshot->workers[0].worker_id(), "w-1");
}

TEST(StateWriterTest, PrunesKeepTheRecentWindowAndTheHistoryStride) {
  InMemoryStateStore store;
  StateWriter writer(&store);
  std::vector<v1::StepReport> reports;
  for (int64_t step = 10; step <= 100; step += 10) reports.push_back(Report("a-1", step));
  writer.AppendReports(reports);
  // Before step 70, keep multiples of 40 only: 40; then 70..100.
  ASSERT_TRUE(writer.Wait(writer.Prune({"a-1", 1, 70, 40})).ok());
  auto kept = store.ReadReports("a-1", 1);
  ASSERT_TRUE(kept.ok());
  std::vector<int64_t> steps;
  for (const auto& r : *kept) steps.push_back(r.step());
  EXPECT_EQ(steps, (std::vector<int64_t>{40, 70, 80, 90, 100}));
}

}  // namespace
}  // namespace substrax
