#include "coordinator/state_writer.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "base/backoff.h"

namespace substrax {

StateWriter::StateWriter(StateStore* store) : store_(store) {
  thread_ = std::thread([this] { Run(); });
}

StateWriter::~StateWriter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

uint64_t StateWriter::PutWorker(const v1::Worker& worker) {
  absl::MutexLock lock(&mu_);
  workers_[worker.worker_id()] = worker;
  deleted_workers_.erase(worker.worker_id());
  return next_ticket_++;
}

uint64_t StateWriter::PutJob(const v1::Job& job) {
  absl::MutexLock lock(&mu_);
  jobs_[job.id()] = job;
  return next_ticket_++;
}

uint64_t StateWriter::DeleteJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  // What is still queued for the job would only be deleted again (or orphaned).
  jobs_.erase(job_id);
  reports_.erase(std::remove_if(reports_.begin(), reports_.end(),
                                [&](const v1::StepReport& r) { return r.job_id() == job_id; }),
                 reports_.end());
  logs_.erase(std::remove_if(logs_.begin(), logs_.end(),
                             [&](const LogChunk& c) { return c.job_id == job_id; }),
              logs_.end());
  deleted_jobs_.push_back(job_id);
  return next_ticket_++;
}

uint64_t StateWriter::DeleteWorker(const std::string& worker_id) {
  absl::MutexLock lock(&mu_);
  workers_.erase(worker_id);
  deleted_workers_.insert(worker_id);
  return next_ticket_++;
}

uint64_t StateWriter::AppendReports(std::vector<v1::StepReport> reports) {
  absl::MutexLock lock(&mu_);
  if (reports_.empty()) {
    reports_ = std::move(reports);
  } else {
    reports_.insert(reports_.end(), std::make_move_iterator(reports.begin()),
                    std::make_move_iterator(reports.end()));
  }
  return next_ticket_++;
}

uint64_t StateWriter::AppendLog(LogChunk chunk) {
  absl::MutexLock lock(&mu_);
  logs_.push_back(std::move(chunk));
  return next_ticket_++;
}

uint64_t StateWriter::Prune(StateBatch::Prune prune) {
  absl::MutexLock lock(&mu_);
  prunes_.push_back(std::move(prune));
  return next_ticket_++;
}

uint64_t StateWriter::last_ticket() const {
  absl::MutexLock lock(&mu_);
  return next_ticket_ - 1;
}

absl::Status StateWriter::Wait(uint64_t ticket) {
  if (ticket == 0) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  auto settled = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return committed_ >= ticket || failed_through_ >= ticket;
  };
  mu_.Await(absl::Condition(&settled));
  if (committed_ >= ticket) return absl::OkStatus();
  return failure_;
}

absl::Status StateWriter::Flush() { return Wait(last_ticket()); }

uint64_t StateWriter::committed() const {
  absl::MutexLock lock(&mu_);
  return committed_;
}

void StateWriter::SetCommitCallback(std::function<void()> callback) {
  absl::MutexLock lock(&mu_);
  on_commit_ = std::move(callback);
}

int64_t StateWriter::commits() const {
  absl::MutexLock lock(&mu_);
  return commits_;
}

int64_t StateWriter::failed_commits() const {
  absl::MutexLock lock(&mu_);
  return failed_commits_;
}

void StateWriter::Run() {
  // A failed commit (SQLite busy, disk full) is retried until it succeeds or the coordinator
  // stops: what the batch holds was acknowledged to no one yet, and nothing else can store it.
  Backoff backoff({.initial = absl::Milliseconds(50), .max = absl::Seconds(5), .jitter = 0});
  absl::MutexLock lock(&mu_);
  auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || next_ticket_ - 1 > committed_;
  };
  while (true) {
    mu_.Await(absl::Condition(&work));
    if (next_ticket_ - 1 <= committed_) return;  // stopping, nothing left
    StateBatch batch;
    for (auto& [id, worker] : workers_) batch.workers.push_back(std::move(worker));
    for (auto& [id, job] : jobs_) batch.jobs.push_back(std::move(job));
    batch.deleted_jobs = std::move(deleted_jobs_);
    batch.deleted_workers.assign(deleted_workers_.begin(), deleted_workers_.end());
    deleted_workers_.clear();
    batch.reports = std::move(reports_);
    batch.prunes = std::move(prunes_);
    batch.log_chunks = std::move(logs_);
    logs_.clear();
    workers_.clear();
    jobs_.clear();
    deleted_jobs_.clear();
    reports_.clear();
    prunes_.clear();
    const uint64_t through = next_ticket_ - 1;

    mu_.Unlock();
    absl::Status status = store_->Commit(batch);
    mu_.Lock();

    if (status.ok()) {
      committed_ = through;
      ++commits_;
      backoff.Reset();
      if (on_commit_) {
        std::function<void()> callback = on_commit_;
        mu_.Unlock();
        callback();
        mu_.Lock();
      }
      continue;
    }
    failed_through_ = through;
    failure_ = status;
    ++failed_commits_;
    // Back in the queue, behind nothing: what was enqueued meanwhile is newer and wins.
    for (v1::Worker& w : batch.workers) {
      if (deleted_workers_.count(w.worker_id()) == 0) workers_.emplace(w.worker_id(), std::move(w));
    }
    for (const std::string& id : batch.deleted_workers) {
      if (workers_.count(id) == 0) deleted_workers_.insert(id);
    }
    for (v1::Job& j : batch.jobs) {
      const bool deleted_since = std::find(deleted_jobs_.begin(), deleted_jobs_.end(), j.id()) !=
                                 deleted_jobs_.end();
      if (!deleted_since) jobs_.emplace(j.id(), std::move(j));
    }
    deleted_jobs_.insert(deleted_jobs_.begin(), batch.deleted_jobs.begin(),
                         batch.deleted_jobs.end());
    // (Points of a job deleted meanwhile would be orphaned: the deletion runs first.)
    const std::set<std::string> deleted(deleted_jobs_.begin(), deleted_jobs_.end());
    batch.reports.erase(std::remove_if(batch.reports.begin(), batch.reports.end(),
                                       [&deleted](const v1::StepReport& r) {
                                         return deleted.count(r.job_id()) > 0;
                                       }),
                        batch.reports.end());
    reports_.insert(reports_.begin(), std::make_move_iterator(batch.reports.begin()),
                    std::make_move_iterator(batch.reports.end()));
    prunes_.insert(prunes_.begin(), batch.prunes.begin(), batch.prunes.end());
    batch.log_chunks.erase(std::remove_if(batch.log_chunks.begin(), batch.log_chunks.end(),
                                          [&deleted](const LogChunk& c) {
                                            return deleted.count(c.job_id) > 0;
                                          }),
                           batch.log_chunks.end());
    logs_.insert(logs_.begin(), std::make_move_iterator(batch.log_chunks.begin()),
                 std::make_move_iterator(batch.log_chunks.end()));
    if (stopping_) return;  // the last try failed: the store is gone with the process
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), *backoff.Next());
  }
}

}  // namespace substrax
