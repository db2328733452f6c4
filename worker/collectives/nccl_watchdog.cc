#include "worker/collectives/nccl_watchdog.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace substrax {

absl::StatusOr<NcclWatchdog::OpId> NcclWatchdog::Register(std::string op, absl::Time deadline,
                                                          DoneFn done) {
  absl::MutexLock lock(&mu_);
  if (!aborted_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(op), "the communicator was aborted after an earlier failure and cannot be "
                         "used again; create a new one (earlier failure: ",
        aborted_.message(), ")"));
  }
  const OpId id = next_id_++;
  Op& entry = ops_[id];
  entry.op = std::move(op);
  entry.deadline = deadline;
  entry.done = std::move(done);
  return id;
}

absl::StatusOr<NcclWatchdog::OpId> NcclWatchdog::RegisterQueued(std::string op,
                                                                absl::Duration timeout,
                                                                DoneFn started, DoneFn done) {
  absl::StatusOr<OpId> id = Register(std::move(op), absl::InfiniteFuture(), std::move(done));
  if (!id.ok()) return id;
  absl::MutexLock lock(&mu_);
  Op& entry = ops_[*id];
  entry.started = std::move(started);
  entry.timeout = timeout;
  return id;
}

std::string NcclWatchdog::Where(const std::string& op) const {
  std::string where = absl::StrCat(op, " on NCCL communicator '", options_.communicator,
                                   "' (rank ", options_.rank, " of ", options_.size);
  if (!options_.self.empty()) absl::StrAppend(&where, ", ", options_.self);
  absl::StrAppend(&where, ") failed: ");
  return where;
}

absl::Status NcclWatchdog::Poll() {
  struct Pending {
    OpId id;
    std::string op;
    absl::Time deadline;
    DoneFn done;
    DoneFn started;
    absl::Duration timeout;
  };
  std::vector<Pending> pending;
  std::vector<std::string> dead;
  std::string where;
  {
    absl::MutexLock lock(&mu_);
    if (!aborted_.ok()) return absl::OkStatus();
    dead = dead_peers_;
    for (const auto& [id, op] : ops_) {
      if (!op.resolved) {
        pending.push_back({id, op.op, op.deadline, op.done, op.started, op.timeout});
      }
    }
    where = Where(pending.empty() ? std::string("watchdog") : pending.front().op);
  }
  const std::string first_op = pending.empty() ? "watchdog" : pending.front().op;

  // Callbacks run without the lock: they call into NCCL and CUDA, which may take a while.
  absl::Status error;
  const int async = options_.async_error ? options_.async_error() : 0;
  if (async != static_cast<int>(NcclResult::kSuccess) &&
      async != static_cast<int>(NcclResult::kInProgress)) {
    NcclCall call;
    call.op = first_op;
    call.communicator = options_.communicator;
    call.rank = options_.rank;
    call.size = options_.size;
    call.self = options_.self;
    call.peers = absl::StrJoin(dead, "; ");
    error = TranslateNcclResult(async, options_.last_error ? options_.last_error() : "", call);
  }
  if (error.ok() && !dead.empty()) {
    error = absl::UnavailableError(absl::StrCat(
        where, absl::StrJoin(dead, "; "),
        "; the communicator was aborted because its collectives would wait for the dead peer. "
        "The job attempt cannot continue; check that process's log"));
  }
  std::vector<OpId> finished;
  std::vector<std::pair<OpId, absl::Time>> started;  // queued ops seen started: their deadlines
  if (error.ok()) {
    const absl::Time now = options_.clock();
    for (const Pending& p : pending) {
      absl::StatusOr<bool> done = p.done ? p.done() : absl::StatusOr<bool>(false);
      absl::Time deadline = p.deadline;
      if (done.ok() && !*done && p.started) {
        absl::StatusOr<bool> begun = p.started();
        if (!begun.ok()) {
          done = begun.status();
        } else if (*begun) {
          deadline = now + p.timeout;
          started.emplace_back(p.id, deadline);
        }
      }
      if (!done.ok()) {
        // The device failed (a CUDA error other than "not ready"): report it at once, never
        // as a timeout. Nothing queued on the communicator can be trusted afterwards.
        error = absl::InternalError(absl::StrCat(Where(p.op), done.status().message(),
                                                 "; check the GPU (nvidia-smi, dmesg)"));
        break;
      }
      if (*done) {
        finished.push_back(p.id);
      } else if (now >= deadline) {
        error = absl::DeadlineExceededError(absl::StrCat(
            Where(p.op), "it did not complete by its deadline and no peer is known to "
                               "have died: a peer is stuck, far slower, or called a different "
                               "collective; the communicator was aborted"));
        break;
      }
    }
  }

  bool call_abort = false;
  {
    absl::MutexLock lock(&mu_);
    for (OpId id : finished) {
      auto it = ops_.find(id);
      if (it != ops_.end() && !it->second.resolved) it->second.resolved = true;
    }
    for (const auto& [id, deadline] : started) {
      auto it = ops_.find(id);
      if (it == ops_.end()) continue;
      it->second.deadline = deadline;
      it->second.started = nullptr;
    }
    if (!error.ok()) call_abort = AbortLocked(error);
  }
  if (!call_abort) return absl::OkStatus();
  if (options_.abort) options_.abort();
  return error;
}

bool NcclWatchdog::AbortLocked(const absl::Status& status) {
  if (!aborted_.ok()) return false;
  aborted_ = status;
  for (auto& [id, op] : ops_) {
    if (op.resolved) continue;
    op.resolved = true;
    op.status = status;
  }
  return true;
}

void NcclWatchdog::PeerDied(std::string who) {
  absl::MutexLock lock(&mu_);
  dead_peers_.push_back(std::move(who));
}

absl::Status NcclWatchdog::Wait(OpId id) {
  absl::MutexLock lock(&mu_);
  auto it = ops_.find(id);
  if (it == ops_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL watchdog of communicator '", options_.communicator, "': no pending op ",
                     id, " (never registered or already waited for)"));
  }
  // std::map nodes stay put while other ops come and go; only Wait erases, and only its own.
  const bool* resolved = &it->second.resolved;
  mu_.Await(absl::Condition(resolved));
  absl::Status status = std::move(it->second.status);
  ops_.erase(it);
  return status;
}

bool NcclWatchdog::Resolved(OpId id) const {
  absl::MutexLock lock(&mu_);
  auto it = ops_.find(id);
  return it != ops_.end() && it->second.resolved;
}

int NcclWatchdog::pending() const {
  absl::MutexLock lock(&mu_);
  int n = 0;
  for (const auto& [id, op] : ops_) n += op.resolved ? 0 : 1;
  return n;
}

absl::Status NcclWatchdog::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

}  // namespace substrax
