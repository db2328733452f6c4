#include "coordinator/change_feed.h"

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "coordinator/cluster.h"
#include "coordinator/limits.h"
#include "coordinator/state_store.h"
#include "core/job_spec.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

TEST(ChangeFeedTest, CallsTheSubscribersOfMarkedTopicsOncePerFlush) {
  ChangeFeed feed;
  int a = 0, b = 0;
  const ChangeFeed::Id id_a = feed.Subscribe("a", [&] { ++a; });
  feed.Subscribe("b", [&] { ++b; });
  feed.Flush();
  EXPECT_EQ(a + b, 0) << "nothing was marked";
  feed.Mark("a");
  feed.Mark("a");
  feed.Flush();
  EXPECT_EQ(a, 1);
  EXPECT_EQ(b, 0);
  feed.Unsubscribe(id_a);
  feed.Mark("a");
  feed.Mark("b");
  feed.Flush();
  EXPECT_EQ(a, 1) << "unsubscribed";
  EXPECT_EQ(b, 1);
  EXPECT_EQ(feed.subscriptions(), 1u);
}

TEST(ChangeFeedTest, AMarkNobodyWaitsForIsNotKept) {
  ChangeFeed feed;
  feed.Mark("late");
  int calls = 0;
  feed.Subscribe("late", [&] { ++calls; });
  feed.Flush();
  EXPECT_EQ(calls, 0) << "a subscriber looks at the state after subscribing";
}

TEST(ChangeFeedTest, ACallbackMaySubscribeAndUnsubscribe) {
  ChangeFeed feed;
  ChangeFeed::Id self = 0;
  int calls = 0;
  self = feed.Subscribe("t", [&] {
    ++calls;
    feed.Unsubscribe(self);
    feed.Subscribe("u", [] {});
  });
  feed.Mark("t");
  feed.Flush();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(feed.subscriptions(), 1u);
}

// A one-device job (flow style: the fields a valid spec needs, nothing more).
constexpr char kSpec[] =
    "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: one}\n"
    "spec: {model: {type: mlp, hidden_sizes: [4], num_classes: 2},"
    " optimizer: {type: sgd, learning_rate: 0.1}, data: {format: synthetic,"
    " synthetic: {task: classification, num_train_examples: 64, num_features: 2}},"
    " mesh: {data_parallel_size: 1}, batch: {global_batch_size: 8}, steps: 5}\n";

class ClusterChangesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto cluster = Cluster::Create({}, [this] { return now_; }, &state_);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
  }

  void Register(const std::string& worker_id, const std::string& incarnation) {
    v1::RegisterWorkerRequest request;
    request.set_worker_id(worker_id);
    request.set_host(worker_id + "-host");
    request.set_incarnation(incarnation);
    v1::Device* d = request.add_devices();
    d->set_local_index(0);
    d->set_kind(v1::DEVICE_KIND_CPU);
    d->set_name("cpu");
    ASSERT_TRUE(cluster_->RegisterWorker(request).ok());
  }

  absl::Time now_ = absl::FromUnixSeconds(1'000'000);
  InMemoryStateStore state_;
  std::unique_ptr<Cluster> cluster_;
};

// True once `condition` holds, polled until a deadline (the commit callback runs on the
// writer's thread, after the committing call may have returned).
template <typename F>
bool Eventually(F condition) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!condition()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));  // polling a condition with a deadline
  }
  return true;
}

TEST_F(ClusterChangesTest, AWorkersStreamIsWokenOnceItsStartEventCanBeRead) {
  Register("w-1", "inc-1");
  int64_t cursor = 0;
  ASSERT_TRUE(cluster_->PollAssignments("w-1", "inc-1", &cursor).ok());
  std::atomic<int> wakes{0}, empty_wakes{0};
  cluster_->changes().Subscribe(ChangeFeed::WorkerTopic("w-1"), [&] {
    ++wakes;
    int64_t at = cursor;
    auto events = cluster_->PollAssignments("w-1", "inc-1", &at);  // no lock is held here
    if (!events.ok() || events->empty()) ++empty_wakes;
  });
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kSpec, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(cluster_->SubmitJob(*spec).ok());
  EXPECT_TRUE(Eventually([&] { return wakes.load() >= 1; }));
  EXPECT_EQ(empty_wakes.load(), 0) << "woken once the start event was committed, not before";
}

TEST_F(ClusterChangesTest, AJobsWatchersAreWokenByItsChangesAndItsLogs) {
  Register("w-1", "inc-1");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kSpec, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<v1::Job> job = cluster_->SubmitJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<int> job_wakes{0}, log_wakes{0}, other_wakes{0};
  cluster_->changes().Subscribe(ChangeFeed::JobTopic(job->id()), [&] { ++job_wakes; });
  cluster_->changes().Subscribe(ChangeFeed::LogsTopic(job->id()), [&] { ++log_wakes; });
  cluster_->changes().Subscribe(ChangeFeed::JobTopic("other-1"), [&] { ++other_wakes; });
  v1::ShipLogsRequest ship;
  ship.set_job_id(job->id());
  ship.set_attempt(1);
  ship.set_worker_id("w-1");
  ship.set_host("w-1-host");
  ship.set_data("hello\n");
  ASSERT_TRUE(cluster_->ShipLogs(ship).ok());
  EXPECT_EQ(log_wakes.load(), 1);
  ASSERT_TRUE(cluster_->CancelJob(job->id(), "").ok());
  EXPECT_GE(job_wakes.load(), 1);
  EXPECT_EQ(other_wakes.load(), 0);
  const int before = job_wakes.load();
  ASSERT_TRUE(cluster_->DeleteJob(job->id()).ok());
  EXPECT_GT(job_wakes.load(), before) << "a deleted job's watchers learn it";
}

TEST_F(ClusterChangesTest, AnOldIncarnationsStreamIsWokenToEnd) {
  Register("w-1", "inc-1");
  std::atomic<int> wakes{0};
  cluster_->changes().Subscribe(ChangeFeed::WorkerTopic("w-1"), [&] { ++wakes; });
  Register("w-1", "inc-2");
  EXPECT_GE(wakes.load(), 1);
  int64_t cursor = 0;
  EXPECT_EQ(cluster_->PollAssignments("w-1", "inc-1", &cursor).status().code(),
            absl::StatusCode::kAborted);
}

TEST_F(ClusterChangesTest, ListJobsPagesAreBoundedAndTokensChecked) {
  Register("w-1", "inc-1");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kSpec, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cluster_->SubmitJob(*spec).ok());
  v1::ListJobsRequest request;
  request.set_page_size(2);
  absl::StatusOr<v1::ListJobsResponse> first = cluster_->ListJobsPage(request);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->jobs_size(), 2);
  request.set_page_token(first->next_page_token());
  absl::StatusOr<v1::ListJobsResponse> second = cluster_->ListJobsPage(request);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->jobs_size(), 1);
  EXPECT_TRUE(second->next_page_token().empty());
  request.set_page_token("x");
  EXPECT_EQ(cluster_->ListJobsPage(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::ListJobsRequest huge;
  huge.set_page_size(1 << 30);
  absl::StatusOr<v1::ListJobsResponse> all = cluster_->ListJobsPage(huge);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs_size(), 3);
}

TEST_F(ClusterChangesTest, ListJobsPagesAreBoundedInBytesAndEveryJobIsListedOnce) {
  Register("w-1", "inc-1");
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kSpec, "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  // Large jobs (the rpc layer bounds a reason; the Cluster stores what it is given): 40 jobs of
  // 120 KB each are about 4.7 MiB, more than a client receives in one message.
  std::set<std::string> ids;
  for (int i = 0; i < 40; ++i) {
    absl::StatusOr<v1::Job> job = cluster_->SubmitJob(*spec);
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(cluster_->CancelJob(job->id(), std::string(120 * 1024, 'r')).ok());
    ids.insert(job->id());
  }
  v1::ListJobsRequest request;
  request.set_page_size(1000);
  std::set<std::string> listed;
  int pages = 0;
  do {
    absl::StatusOr<v1::ListJobsResponse> page = cluster_->ListJobsPage(request);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->ByteSizeLong(), limits::kMaxJobsPageBytes + 1024);
    ASSERT_GT(page->jobs_size(), 0);
    for (const v1::Job& job : page->jobs()) EXPECT_TRUE(listed.insert(job.id()).second);
    request.set_page_token(page->next_page_token());
    ASSERT_LT(++pages, 100);
  } while (!request.page_token().empty());
  EXPECT_GE(pages, 5);
  EXPECT_EQ(listed, ids);
}

}  // namespace
}  // namespace substrax
