#include "worker/sdk/step_reporter.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "base/backoff.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/grpc_status.h"

namespace substrax {

absl::Status GrpcStepSender::Send(const v1::ReportStepsRequest& request, absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::ReportStepsResponse response;
  grpc::Status status;
  if (!call_.Run(&context, [&] { status = stub_->ReportSteps(&context, request, &response); })) {
    return absl::CancelledError("the step reporter is stopping");
  }
  return FromGrpcStatus(status, "ReportSteps");
}

void GrpcStepSender::Cancel() { call_.Cancel(); }

StepReporter::StepReporter(StepReporterOptions options, StepSender* sender,
                           EndedFn on_attempt_ended)
    : options_(std::move(options)),
      sender_(sender),
      on_attempt_ended_(std::move(on_attempt_ended)),
      batch_cap_(std::max<size_t>(1, options_.max_batch)) {
  thread_ = std::thread([this] { Loop(); });
}

StepReporter::~StepReporter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sender_->Cancel();
  thread_.join();
  absl::MutexLock lock(&mu_);
  DropLocked(static_cast<int64_t>(queue_.size()));
  queue_.clear();
  LogDropsLocked(/*force=*/true);
}

void StepReporter::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
    return;
  }
  std::fprintf(stderr, "substrax runner: %s\n", line.c_str());
  std::fflush(stderr);
}

void StepReporter::Enqueue(v1::StepReport report) {
  report.set_job_id(options_.job_id);
  report.set_attempt(options_.attempt);
  absl::MutexLock lock(&mu_);
  if (ended_ || stopping_) return;
  ++enqueued_;
  queue_.push_back(std::move(report));
  // Drop-oldest: the newest metrics are worth more than old ones, and memory stays bounded.
  while (queue_.size() > std::max<size_t>(1, options_.max_queued)) {
    queue_.pop_front();
    DropLocked(1);
  }
}

void StepReporter::DropLocked(int64_t n) {
  stats_.dropped += n;
  dropped_unlogged_ += n;
  finished_ += n;
}

void StepReporter::LogDropsLocked(bool force) {
  if (dropped_unlogged_ == 0) return;
  const absl::Time now = absl::Now();
  if (!force && now - last_drop_log_ < options_.drop_log_interval) return;
  Log(absl::StrCat("dropped ", dropped_unlogged_, " step reports of job ", options_.job_id,
                   " attempt ", options_.attempt, " (the queue holds ", options_.max_queued,
                   " while the coordinator is slow or unreachable; ", stats_.dropped,
                   " dropped in all)"));
  dropped_unlogged_ = 0;
  last_drop_log_ = now;
}

void StepReporter::Loop() {
  while (true) {
    std::vector<v1::StepReport> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !queue_.empty() || stopping_ || ended_;
      };
      // Woken at least every drop_log_interval so that drops made meanwhile get their line.
      mu_.AwaitWithTimeout(absl::Condition(&ready), options_.drop_log_interval);
      LogDropsLocked(/*force=*/false);
      if (stopping_ || ended_) return;
      const size_t n = std::min(batch_cap_, queue_.size());
      for (size_t i = 0; i < n; ++i) {
        batch.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    if (!batch.empty()) Deliver(std::move(batch));
  }
}

void StepReporter::Deliver(std::vector<v1::StepReport> batch) {
  const int64_t n = static_cast<int64_t>(batch.size());
  v1::ReportStepsRequest request;
  request.set_job_id(options_.job_id);
  request.set_attempt(options_.attempt);
  for (v1::StepReport& r : batch) *request.add_reports() = std::move(r);
  Backoff backoff({.initial = options_.initial_backoff, .max = options_.max_backoff});
  int failures = 0;
  while (true) {
    absl::Time deadline;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || ended_) {
        DropLocked(n);
        return;
      }
      deadline = std::min(absl::Now() + options_.rpc_timeout, flush_deadline_);
    }
    const absl::Status status = sender_->Send(request, deadline);
    if (status.ok()) {
      if (failures > 0) {
        Log(absl::StrCat("step reports delivered again after ", failures, " failed tries"));
      }
      absl::MutexLock lock(&mu_);
      stats_.sent += n;
      finished_ += n;
      return;
    }
    {
      // A stopping reporter cancelled this send: its error says nothing about the reports.
      absl::MutexLock lock(&mu_);
      if (stopping_) {
        DropLocked(n);
        return;
      }
    }
    // PERMISSION_DENIED: the attempt token is no longer admitted, the attempt has ended too.
    if (absl::IsFailedPrecondition(status) || absl::IsPermissionDenied(status)) {
      {
        absl::MutexLock lock(&mu_);
        ended_ = true;
        const int64_t dropped = n + static_cast<int64_t>(queue_.size());
        stats_.dropped += dropped;
        finished_ += dropped;
        queue_.clear();
      }
      on_attempt_ended_(status);
      return;
    }
    if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
      // One line per outage, not one per try.
      if (failures++ == 0) {
        Log(absl::StrCat(n, " step reports not delivered (", status.message(),
                         "); retrying with backoff"));
      }
      absl::MutexLock lock(&mu_);
      auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stopping), *backoff.Next());
      LogDropsLocked(/*force=*/false);
      continue;
    }
    if ((absl::IsResourceExhausted(status) || absl::IsInvalidArgument(status)) && n > 1) {
      // A per-request limit below ours: halve the request and the cap for the rest of the run.
      {
        absl::MutexLock lock(&mu_);
        batch_cap_ = std::max<size_t>(1, std::min<size_t>(batch_cap_, n / 2));
      }
      Log(absl::StrCat("a request of ", n, " step reports was refused (", status.message(),
                       "); sending at most ", n / 2, " per request"));
      std::vector<v1::StepReport> first(std::make_move_iterator(request.mutable_reports()->begin()),
                                        std::make_move_iterator(request.mutable_reports()->end()));
      std::vector<v1::StepReport> second(std::make_move_iterator(first.begin() + n / 2),
                                         std::make_move_iterator(first.end()));
      first.resize(n / 2);
      Deliver(std::move(first));
      Deliver(std::move(second));
      return;
    }
    Log(absl::StrCat(n, " step reports refused by the coordinator: ", status.ToString()));
    absl::MutexLock lock(&mu_);
    stats_.refused += n;
    finished_ += n;
    return;
  }
}

absl::Status StepReporter::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const int64_t target = enqueued_;
  const absl::Time deadline = absl::Now() + timeout;
  ++flushers_;
  flush_deadline_ = std::min(flush_deadline_, deadline);
  auto done = [this, target]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return finished_ >= target || ended_;
  };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  if (--flushers_ == 0) flush_deadline_ = absl::InfiniteFuture();
  LogDropsLocked(/*force=*/true);
  if (ended_) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", options_.job_id, " attempt ", options_.attempt,
                     " has ended: the coordinator takes no more step reports"));
  }
  if (finished_ < target) {
    return absl::DeadlineExceededError(
        absl::StrCat(target - finished_, " step reports of job ", options_.job_id,
                     " not delivered within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

StepReporterStats StepReporter::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace substrax
