// Logs as the daemons ship them (ShipLogs): each process's output is a byte stream that its
// worker ships in pieces at increasing offsets. The coordinator keeps where each stored log
// ends, so that a retried piece is acknowledged without being stored twice and a gap is refused
// with the offset to resume from. The bytes themselves go to the state store through the writer,
// in its group commits.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster.h"
#include "coordinator/limits.h"
#include "core/status.h"

namespace substrax {

absl::StatusOr<std::string> Cluster::WorkerOfProcessLocked(const JobEntry& entry, int attempt,
                                                           int p) const {
  const v1::Job& job = entry.job;
  auto it = entry.attempt_workers.find(attempt);
  if (it == entry.attempt_workers.end()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job.id(), " attempt ", attempt,
        ": this coordinator does not know which workers ran it (it restarted since, or the "
        "attempt is older than the last ", kAttemptsRemembered, "); its log is not kept"));
  }
  const std::vector<std::string>& workers = it->second;
  if (p >= static_cast<int>(workers.size())) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " attempt ", attempt, " has ",
                                            workers.size(), " processes, not process ", p));
  }
  return workers[p];
}

absl::Status Cluster::CheckShipperLocked(const v1::ShipLogsRequest& request) const {
  const JobEntry* entry = FindJobOrNullLocked(request.job_id());
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("no job ", request.job_id()));
  if (request.attempt() < 1 || request.attempt() > entry->job.attempt()) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " has no attempt ",
                                            request.attempt(), " (its latest is ",
                                            entry->job.attempt(), ")"));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::string worker,
      WorkerOfProcessLocked(*entry, request.attempt(), request.process_index()));
  if (worker != request.worker_id()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "worker ", request.worker_id(), " did not run process ", request.process_index(),
        " of job ", request.job_id(), " attempt ", request.attempt(), " (worker ", worker,
        " did); a worker ships only its own processes' logs"));
  }
  return absl::OkStatus();
}

void Cluster::NoteLogTailLocked(const v1::ShipLogsRequest& request, const std::string& data) {
  auto it = jobs_.find(request.job_id());
  JobEntry* entry = it == jobs_.end() ? nullptr : &it->second;
  if (entry == nullptr || entry->job.state() != v1::JOB_STATE_RUNNING ||
      entry->job.attempt() != request.attempt() ||
      request.process_index() >= static_cast<int>(entry->processes.size())) {
    return;
  }
  std::string& tail = entry->processes[request.process_index()].log_tail;
  tail.append(data.size() > kHangLogTailBytes ? data.substr(data.size() - kHangLogTailBytes) : data);
  if (tail.size() > kHangLogTailBytes) tail.erase(0, tail.size() - kHangLogTailBytes);
}

absl::StatusOr<int64_t> Cluster::ShipLogs(const v1::ShipLogsRequest& request) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("job_id", request.job_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("worker_id", request.worker_id()));
  SUBSTRAX_RETURN_IF_ERROR(CheckName("host", request.host()));
  if (request.offset() < 0 || request.process_index() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "offset and process_index must be >= 0, got ", request.offset(), " and ",
        request.process_index()));
  }
  if (request.data().size() > limits::kMaxLogChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("data: ", request.data().size(),
                                                   " bytes; at most ", limits::kMaxLogChunkBytes,
                                                   " per request"));
  }
  const LogKey key{request.job_id(), request.attempt(), request.process_index()};
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    SUBSTRAX_RETURN_IF_ERROR(CheckShipperLocked(request));
    known = log_ends_.count(key) > 0;
  }
  if (!known) {
    // The first piece of this log in this coordinator run: where the stored log ends (read
    // without the lock; a concurrent first piece is settled by try_emplace below).
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<LogExtent> extents,
                              state_->LogExtents(request.job_id(), request.attempt()));
    absl::MutexLock lock(&mu_);
    for (const LogExtent& e : extents) {
      if (e.process_index != request.process_index()) continue;
      log_ends_.try_emplace(key, LogEnd{e.end, e.eof});
    }
    log_ends_.try_emplace(key, LogEnd{});
  }
  uint64_t ticket = 0;
  int64_t next = 0;
  {
    absl::MutexLock lock(&mu_);
    // Again: the job may have been deleted while the lock was not held.
    SUBSTRAX_RETURN_IF_ERROR(CheckShipperLocked(request));
    LogEnd& end = log_ends_[key];
    if (request.offset() > end.next) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the log of job ", request.job_id(), " attempt ", request.attempt(), " process ",
          request.process_index(), " has a gap: got offset ", request.offset(),
          ", expected offset ", end.next));
    }
    // Bytes already stored (a retry, or a daemon that restarted and ships from 0) are skipped.
    const size_t skip = static_cast<size_t>(end.next - request.offset());
    LogChunk chunk;
    if (skip < request.data().size()) chunk.data = request.data().substr(skip);
    chunk.eof = request.eof() && !end.eof;
    if (chunk.data.empty() && !chunk.eof) return end.next;
    chunk.job_id = request.job_id();
    chunk.attempt = request.attempt();
    chunk.process_index = request.process_index();
    chunk.offset = end.next;
    chunk.host = request.host();
    chunk.max_bytes = options_.log_max_bytes_per_process;
    end.next += static_cast<int64_t>(chunk.data.size());
    end.eof = end.eof || chunk.eof;
    NoteLogTailLocked(request, chunk.data);
    next = end.next;
    ticket = writer_->AppendLog(std::move(chunk));
  }
  // Stored before the answer. On a failed commit the chunk stays queued (the writer retries
  // it), so the shipper's retry of the same bytes is acknowledged as already had.
  SUBSTRAX_RETURN_IF_ERROR(writer_->Wait(ticket));
  // Readers read the store: wake them once the piece is there.
  changes_.Mark(ChangeFeed::LogsTopic(request.job_id()));
  changes_.Flush();
  return next;
}

absl::StatusOr<int> Cluster::LogAttempt(const v1::ReadLogsRequest& request,
                                        std::string* notice) const {
  const int process = request.has_process_index() ? request.process_index() : -1;
  if (request.attempt() < 0 || request.tail_lines() < 0 || process < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attempt and tail_lines must be >= 0 and process_index >= -1, got ", request.attempt(),
        ", ", request.tail_lines(), " and ", process));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(v1::Job job, GetJob(request.job_id()));
  if (request.attempt() > job.attempt()) {
    return absl::NotFoundError(absl::StrCat("job ", job.id(), " has no attempt ",
                                            request.attempt(), " (its latest is ",
                                            job.attempt(), ")"));
  }
  if (request.attempt() > 0) return request.attempt();
  // The latest attempt of a job that has not started: none to read, or (following) the first
  // one once it starts.
  if (job.attempt() == 0 && (!request.follow() || IsTerminalJobState(job.state()))) {
    *notice = absl::StrCat("job ", job.id(), " has not started an attempt: nothing logged");
  }
  return job.attempt();
}

absl::StatusOr<LogFollow> Cluster::FollowLogs(const std::string& job_id, int attempt,
                                              int process_index, const LogReader& reader,
                                              absl::Time* give_up) const {
  SUBSTRAX_ASSIGN_OR_RETURN(v1::Job job, GetJob(job_id));
  LogFollow follow;
  const bool ended = IsTerminalJobState(job.state()) || job.attempt() > attempt ||
                     job.state() == v1::JOB_STATE_PENDING;
  if (!ended) return follow;
  // The attempt's processes: the mesh's distinct workers while it is the job's last attempt;
  // for an older one, the logs the store holds.
  std::set<std::string> workers;
  for (const v1::Device& d : job.mesh().devices()) workers.insert(d.worker_id());
  const int processes =
      job.attempt() == attempt ? static_cast<int>(workers.size()) : reader.seen();
  const int expected = process_index >= 0 ? 1 : processes;
  if (reader.complete() >= expected) {
    follow.done = true;
    return follow;
  }
  const absl::Time now = clock_();
  if (*give_up == absl::InfiniteFuture()) *give_up = now + options_.log_follow_grace;
  if (now < *give_up) {
    follow.recheck = *give_up;
    return follow;
  }
  follow.done = true;
  follow.notices = reader.Incomplete(processes, options_.log_follow_grace);
  return follow;
}

std::unique_ptr<LogReader> Cluster::ReadLogs(const std::string& job_id, int attempt,
                                             int process_index, int tail_lines) const {
  return std::make_unique<LogReader>(state_, job_id, attempt, process_index, tail_lines);
}

}  // namespace substrax
