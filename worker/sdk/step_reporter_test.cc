#include "worker/sdk/step_reporter.h"

#include <deque>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

// Records every request; answers with the scripted statuses first, then OK. Send blocks while
// the sender is held.
class FakeSender : public StepSender {
 public:
  absl::Status Send(const v1::ReportStepsRequest& request, absl::Time) override {
    absl::MutexLock lock(&mu_);
    requests_.push_back(request);
    auto released = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !held_ || cancelled_; };
    mu_.Await(absl::Condition(&released));
    if (cancelled_) return absl::CancelledError("cancelled");
    if (refuse_over_ > 0 && request.reports_size() > refuse_over_) {
      return absl::ResourceExhaustedError("at most 100 reports per request");
    }
    if (script_.empty()) return absl::OkStatus();
    absl::Status s = script_.front();
    script_.pop_front();
    return s;
  }
  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
  void Hold(bool held) {
    absl::MutexLock lock(&mu_);
    held_ = held;
  }
  void Script(std::vector<absl::Status> statuses) {
    absl::MutexLock lock(&mu_);
    script_.assign(statuses.begin(), statuses.end());
  }
  void RefuseOver(int n) {
    absl::MutexLock lock(&mu_);
    refuse_over_ = n;
  }
  void AwaitRequests(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return requests_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
  }
  std::vector<v1::ReportStepsRequest> requests() {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::ReportStepsRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::deque<absl::Status> script_ ABSL_GUARDED_BY(mu_);
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  int refuse_over_ ABSL_GUARDED_BY(mu_) = 0;
};

v1::StepReport Report(int64_t step) {
  v1::StepReport r;
  r.set_step(step);
  r.set_device_id(0);
  return r;
}

// Step 0 goes first and blocks the reporter's thread in its send; steps 1..n queue meanwhile;
// then the sender is released.
void EnqueueWhileBlocked(FakeSender& sender, StepReporter& reporter, int n) {
  sender.Hold(true);
  reporter.Enqueue(Report(0));
  sender.AwaitRequests(1);
  for (int i = 1; i <= n; ++i) reporter.Enqueue(Report(i));
  sender.Hold(false);
}

StepReporterOptions Options() {
  StepReporterOptions o;
  o.job_id = "job-1";
  o.attempt = 2;
  o.initial_backoff = absl::Milliseconds(1);
  o.max_backoff = absl::Milliseconds(5);
  return o;
}

std::vector<int64_t> Steps(const std::vector<v1::ReportStepsRequest>& requests, size_t from) {
  std::vector<int64_t> steps;
  for (size_t i = from; i < requests.size(); ++i) {
    for (const v1::StepReport& r : requests[i].reports()) steps.push_back(r.step());
  }
  return steps;
}

TEST(StepReporterTest, BatchesEverythingQueuedInRequestsOfAtMost256) {
  FakeSender sender;
  StepReporter reporter(Options(), &sender, [](const absl::Status&) { FAIL(); });
  EnqueueWhileBlocked(sender, reporter, 300);
  ASSERT_TRUE(reporter.Flush(absl::Seconds(60)).ok());
  const std::vector<v1::ReportStepsRequest> requests = sender.requests();
  ASSERT_EQ(requests.size(), 3u);
  EXPECT_EQ(requests[0].reports_size(), 1);
  EXPECT_EQ(requests[1].reports_size(), 256);
  EXPECT_EQ(requests[2].reports_size(), 44);
  for (const auto& request : requests) {
    EXPECT_EQ(request.job_id(), "job-1");
    EXPECT_EQ(request.attempt(), 2);
    for (const auto& r : request.reports()) EXPECT_EQ(r.job_id(), "job-1");
  }
  std::vector<int64_t> want;
  for (int i = 0; i <= 300; ++i) want.push_back(i);
  EXPECT_EQ(Steps(requests, 0), want);
  EXPECT_EQ(reporter.stats().sent, 301);
  EXPECT_EQ(reporter.stats().dropped, 0);
}

TEST(StepReporterTest, FullQueueDropsTheOldestCountsAndLogsIt) {
  FakeSender sender;
  StepReporterOptions options = Options();
  options.max_queued = 10;
  absl::Mutex log_mu;
  std::vector<std::string> lines;
  options.log = [&](const std::string& line) {
    absl::MutexLock lock(&log_mu);
    lines.push_back(line);
  };
  StepReporter reporter(options, &sender, [](const absl::Status&) { FAIL(); });
  // The coordinator is stuck: enqueueing never waits for it.
  EnqueueWhileBlocked(sender, reporter, 1000);
  ASSERT_TRUE(reporter.Flush(absl::Seconds(60)).ok());
  const std::vector<v1::ReportStepsRequest> requests = sender.requests();
  std::vector<int64_t> want = {0};
  for (int i = 991; i <= 1000; ++i) want.push_back(i);
  EXPECT_EQ(Steps(requests, 0), want);
  EXPECT_EQ(reporter.stats().dropped, 990);
  EXPECT_EQ(reporter.stats().sent, 11);
  absl::MutexLock lock(&log_mu);
  bool logged = false;
  for (const std::string& line : lines) logged |= absl::StrContains(line, "dropped 990 step reports");
  EXPECT_TRUE(logged);
}

TEST(StepReporterTest, RetriesUnavailableUntilDelivered) {
  FakeSender sender;
  sender.Script({absl::UnavailableError("connection refused"),
                 absl::DeadlineExceededError("deadline"), absl::UnavailableError("again")});
  StepReporter reporter(Options(), &sender, [](const absl::Status&) { FAIL(); });
  reporter.Enqueue(Report(7));
  ASSERT_TRUE(reporter.Flush(absl::Seconds(60)).ok());
  const std::vector<v1::ReportStepsRequest> requests = sender.requests();
  ASSERT_EQ(requests.size(), 4u);
  for (const auto& request : requests) EXPECT_EQ(Steps({request}, 0), std::vector<int64_t>{7});
  EXPECT_EQ(reporter.stats().sent, 1);
}

TEST(StepReporterTest, FailedPreconditionEndsTheAttemptOnce) {
  FakeSender sender;
  sender.Script({absl::FailedPreconditionError("attempt 2 of job-1 was cancelled")});
  absl::Notification ended;
  int calls = 0;
  StepReporter reporter(Options(), &sender, [&](const absl::Status& s) {
    ++calls;
    EXPECT_TRUE(absl::StrContains(s.message(), "cancelled")) << s;
    ended.Notify();
  });
  reporter.Enqueue(Report(1));
  ended.WaitForNotification();
  reporter.Enqueue(Report(2));  // ignored: the attempt is over
  EXPECT_TRUE(absl::IsFailedPrecondition(reporter.Flush(absl::Seconds(60))));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(sender.requests().size(), 1u);
}

// A job's attempt token is refused once its attempt ended: that ends the attempt as well.
TEST(StepReporterTest, ARefusedAttemptTokenEndsTheAttempt) {
  FakeSender sender;
  sender.Script({absl::PermissionDeniedError(
      "the attempt token of process 0 of job job-1 attempt 2 is valid only while that attempt "
      "runs: attempt 2 of job job-1 has ended")});
  absl::Notification ended;
  StepReporter reporter(Options(), &sender, [&](const absl::Status& s) {
    EXPECT_TRUE(absl::IsPermissionDenied(s)) << s;
    ended.Notify();
  });
  reporter.Enqueue(Report(1));
  ended.WaitForNotification();
  reporter.Enqueue(Report(2));  // ignored: the attempt is over
  EXPECT_TRUE(absl::IsFailedPrecondition(reporter.Flush(absl::Seconds(60))));
  EXPECT_EQ(sender.requests().size(), 1u);
  EXPECT_EQ(reporter.stats().refused, 0);
}

TEST(StepReporterTest, RefusedLargeRequestsAreSplit) {
  FakeSender sender;
  sender.RefuseOver(100);
  StepReporter reporter(Options(), &sender, [](const absl::Status&) { FAIL(); });
  EnqueueWhileBlocked(sender, reporter, 300);
  ASSERT_TRUE(reporter.Flush(absl::Seconds(60)).ok());
  std::vector<int64_t> delivered;
  for (const auto& request : sender.requests()) {
    if (request.reports_size() > 100) continue;  // refused
    for (const auto& r : request.reports()) delivered.push_back(r.step());
  }
  std::vector<int64_t> want;
  for (int i = 0; i <= 300; ++i) want.push_back(i);
  EXPECT_EQ(delivered, want);
  EXPECT_EQ(reporter.stats().sent, 301);
  EXPECT_EQ(reporter.stats().refused, 0);
}

TEST(StepReporterTest, FlushIsBoundedWhileTheCoordinatorIsDown) {
  FakeSender sender;
  std::vector<absl::Status> down(1000000, absl::UnavailableError("connection refused"));
  sender.Script(down);
  StepReporter reporter(Options(), &sender, [](const absl::Status&) { FAIL(); });
  reporter.Enqueue(Report(1));
  reporter.Enqueue(Report(2));
  const absl::Status flushed = reporter.Flush(absl::Milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(flushed)) << flushed;
  EXPECT_TRUE(absl::StrContains(flushed.message(), "2 step reports")) << flushed;
}

}  // namespace
}  // namespace substrax
