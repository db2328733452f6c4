#include "agent/log_shipper.h"

#include <optional>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <optional>

#include "base/backoff.h"
#include "absl/random/random.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"

namespace substrax {

absl::StatusOr<int64_t> GrpcLogSink::Ship(const v1::ShipLogsRequest& request,
                                          absl::Time deadline) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(deadline));
  v1::ShipLogsResponse response;
  grpc::Status status;
  if (!call_.Run(&context, [&] { status = stub_->ShipLogs(&context, request, &response); })) {
    return absl::CancelledError("the log shipper is stopping");
  }
  if (!status.ok()) return FromGrpcStatus(status, "ShipLogs");
  return response.next_offset();
}

void GrpcLogSink::Cancel() { call_.Cancel(); }

int64_t ExpectedOffset(const absl::Status& status) {
  if (status.code() != absl::StatusCode::kFailedPrecondition) return -1;
  constexpr absl::string_view kMarker = "expected offset ";
  const absl::string_view message = status.message();
  const size_t at = message.find(kMarker);
  if (at == absl::string_view::npos) return -1;
  absl::string_view digits = message.substr(at + kMarker.size());
  size_t n = 0;
  while (n < digits.size() && digits[n] >= '0' && digits[n] <= '9') ++n;
  int64_t offset = -1;
  if (n == 0 || !absl::SimpleAtoi(digits.substr(0, n), &offset)) return -1;
  return offset;
}

LogShipper::LogShipper(LogShipperOptions options, LogSink* sink)
    : options_(std::move(options)), sink_(sink) {
  thread_ = std::thread([this] { Loop(); });
}

LogShipper::~LogShipper() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  sink_->Cancel();
  thread_.join();
}

void LogShipper::Add(const std::string& job_id, int attempt, int process_index,
                     const std::string& path) {
  absl::MutexLock lock(&mu_);
  logs_.try_emplace(Key{job_id, attempt, process_index}, Entry{path, 0, false});
}

void LogShipper::Ended(const std::string& job_id, int attempt, int process_index) {
  absl::MutexLock lock(&mu_);
  auto it = logs_.find(Key{job_id, attempt, process_index});
  if (it == logs_.end()) return;
  it->second.ended = true;
  wake_ = true;
}

bool LogShipper::AwaitShipped(const std::string& job_id, int attempt, int process_index,
                              absl::Duration timeout) {
  const Key key{job_id, attempt, process_index};
  absl::MutexLock lock(&mu_);
  auto gone = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return logs_.count(key) == 0 || stopping_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&gone), timeout) && logs_.count(key) == 0;
}

std::vector<std::pair<std::string, int>> LogShipper::Pending() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, int>> pending;
  for (const auto& [key, entry] : logs_) pending.emplace_back(std::get<0>(key), std::get<1>(key));
  return pending;
}

void LogShipper::Log(const std::string& line) const {
  if (options_.log) {
    options_.log(line);
  } else {
    std::cerr << "substrax-agent: " << line << std::endl;
  }
}

void LogShipper::Forget(const Key& key, const std::string& why) {
  if (!why.empty()) {
    Log(absl::StrCat("the log of job ", std::get<0>(key), " attempt ", std::get<1>(key),
                     " process ", std::get<2>(key), " is not shipped further: ", why));
  }
  absl::MutexLock lock(&mu_);
  logs_.erase(key);
}

void LogShipper::Loop() {
  // Retried: UNAVAILABLE and DEADLINE_EXCEEDED (coordinator restarting or unreachable), with
  // exponential backoff and jitter up to max_backoff; no deadline, as logs of a running job
  // keep coming and the offsets make a late retry harmless.
  Backoff backoff({.initial = options_.initial_backoff, .max = options_.max_backoff});
  // Set after a failed round: the wait before the next.
  std::optional<absl::Duration> retry_wait;
  while (true) {
    std::vector<Key> keys;
    {
      absl::MutexLock lock(&mu_);
      // A round every interval, at once when a runner ended; after a failure, the backoff (an
      // ended runner does not cut it short: the coordinator is unreachable).
      auto ready = [this, &retry_wait]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (wake_ && !retry_wait.has_value());
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), retry_wait.value_or(options_.interval));
      if (stopping_) return;
      wake_ = false;
      for (const auto& [key, entry] : logs_) keys.push_back(key);
    }
    bool failed = false;
    bool more = true;
    // Rounds follow each other at once while some log has more to send.
    while (more && !failed) {
      more = false;
      for (const Key& key : keys) {
        const Outcome outcome = ShipSome(key);
        if (outcome == Outcome::kRetry) {
          failed = true;
          break;
        }
        more = more || outcome == Outcome::kMore;
      }
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (failed) {
      retry_wait = backoff.Next();
    } else {
      backoff.Reset();
      retry_wait.reset();
    }
  }
}

LogShipper::Outcome LogShipper::ShipSome(const Key& key) {
  std::string path;
  int64_t offset = 0;
  bool ended = false;
  {
    absl::MutexLock lock(&mu_);
    auto it = logs_.find(key);
    if (it == logs_.end()) return Outcome::kIdle;
    path = it->second.path;
    offset = it->second.offset;
    ended = it->second.ended;
  }
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    if (ended) Forget(key, absl::StrCat("cannot read ", path, ": ", std::strerror(error)));
    return Outcome::kIdle;
  }
  std::string buffer(options_.max_chunk_bytes, '\0');
  Outcome outcome = Outcome::kIdle;
  for (int round = 0; round < options_.max_chunks_per_round; ++round) {
    ssize_t n = 0;
    do {
      n = pread(fd, buffer.data(), buffer.size(), offset);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
      const int error = errno;
      close(fd);
      if (ended) Forget(key, absl::StrCat("cannot read ", path, ": ", std::strerror(error)));
      return Outcome::kIdle;
    }
    // The runner has exited, so its log no longer grows: a short read is its end.
    const bool eof = ended && static_cast<size_t>(n) < buffer.size();
    if (n == 0 && !eof) break;
    v1::ShipLogsRequest request;
    request.set_worker_id(options_.worker_id);
    request.set_host(options_.host);
    request.set_job_id(std::get<0>(key));
    request.set_attempt(std::get<1>(key));
    request.set_process_index(std::get<2>(key));
    request.set_offset(offset);
    request.set_data(buffer.data(), static_cast<size_t>(n));
    request.set_eof(eof);
    absl::StatusOr<int64_t> next = sink_->Ship(request, absl::Now() + options_.rpc_timeout);
    if (!next.ok()) {
      const absl::StatusCode code = next.status().code();
      if (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded ||
          code == absl::StatusCode::kCancelled) {
        outcome = Outcome::kRetry;
        break;
      }
      const int64_t expected = ExpectedOffset(next.status());
      if (expected < 0) {
        close(fd);
        Forget(key, std::string(next.status().message()));
        return Outcome::kIdle;
      }
      offset = expected;  // a gap: resume where the coordinator's copy ends
    } else {
      offset = std::max(*next, offset + static_cast<int64_t>(n));
      if (eof) {
        close(fd);
        Forget(key, "");
        return Outcome::kIdle;
      }
    }
    absl::MutexLock lock(&mu_);
    auto it = logs_.find(key);
    if (it == logs_.end()) break;
    it->second.offset = offset;
    // A runner that ended meanwhile: its end is shipped in this round too.
    ended = it->second.ended;
    // A full piece or a gap: there may be more than this round's budget (another round at
    // once); a short piece: the log is shipped up to its current end (the next interval looks
    // again).
    const bool full = static_cast<size_t>(n) == buffer.size();
    outcome = full || !next.ok() ? Outcome::kMore : Outcome::kIdle;
  }
  close(fd);
  return outcome;
}

}  // namespace substrax
