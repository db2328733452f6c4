#include "coordinator/rendezvous.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/limits.h"
#include "core/status.h"

namespace substrax {
namespace {

std::string ScopeName(const Rendezvous::Scope& scope) {
  return absl::StrCat(scope.first, " attempt ", scope.second);
}

constexpr absl::Duration kCancelPoll = absl::Milliseconds(250);

// What a key costs beyond its bytes (the map's node and the strings' headers), counted against
// the byte limits so that empty keys and values are not free.
constexpr size_t kKeyOverheadBytes = 64;

absl::Status TooManyWaiters() {
  return absl::ResourceExhaustedError(absl::StrCat(
      "the coordinator already has ", limits::kMaxRendezvousWaiters,
      " rendezvous waiters, its limit; retry later"));
}

}  // namespace

bool Rendezvous::AwaitLocked(const absl::Condition& ready, absl::Duration timeout,
                             const Cancelled& cancelled, bool* was_cancelled) {
  *was_cancelled = false;
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (mu_.AwaitWithTimeout(ready, std::min(left, kCancelPoll))) return true;
    if (absl::Now() >= deadline) return false;
    if (cancelled && cancelled()) {
      *was_cancelled = true;
      return false;
    }
  }
}

absl::Status Rendezvous::CheckOpenLocked(const Scope& scope) const {
  if (closed_.count(scope)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", ScopeName(scope), " has ended; its rendezvous is closed"));
  }
  return absl::OkStatus();
}

absl::Status Rendezvous::Set(const Scope& scope, const std::string& key, const std::string& value,
                             bool allow_overwrite) {
  if (key.size() > limits::kMaxKeyBytes || value.size() > limits::kMaxValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rendezvous key of ", key.size(), " bytes and value of ", value.size(),
        " bytes: the limits are ", limits::kMaxKeyBytes, " and ", limits::kMaxValueBytes));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(scope); !s.ok()) return s;
  ScopeState& state = scopes_[scope];
  auto& values = state.values;
  auto old = values.find(key);
  if (old == values.end() && static_cast<int>(values.size()) >= limits::kMaxKeysPerAttempt) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", ScopeName(scope), " already has ", values.size(),
        " rendezvous keys, the limit per attempt"));
  }
  if (!allow_overwrite && old != values.end()) {
    return absl::AlreadyExistsError(
        absl::StrCat("rendezvous key '", key, "' of job ", ScopeName(scope), " is already set"));
  }
  const size_t freed =
      old == values.end() ? 0 : key.size() + old->second.size() + kKeyOverheadBytes;
  const size_t added = key.size() + value.size() + kKeyOverheadBytes;
  if (state.bytes - freed + added > options_.max_bytes_per_attempt) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", ScopeName(scope), " holds ", state.bytes, " bytes of rendezvous keys and values; ",
        added, " more would pass the limit per attempt of ", options_.max_bytes_per_attempt));
  }
  if (bytes_ - freed + added > options_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the coordinator holds ", bytes_, " bytes of rendezvous keys and values over all "
        "attempts, its limit of ", options_.max_bytes, "; retry later"));
  }
  state.bytes = state.bytes - freed + added;
  bytes_ = bytes_ - freed + added;
  values[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> Rendezvous::Get(const Scope& scope, const std::string& key,
                                            absl::Duration timeout, const Cancelled& cancelled) {
  absl::MutexLock lock(&mu_);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_.count(scope)) return true;
    auto it = scopes_.find(scope);
    return it != scopes_.end() && it->second.values.count(key) > 0;
  };
  if (!ready() && timeout > absl::ZeroDuration() && waiters_ >= limits::kMaxRendezvousWaiters) {
    return TooManyWaiters();
  }
  ++waiters_;
  bool was_cancelled = false;
  const bool done = AwaitLocked(absl::Condition(&ready), timeout, cancelled, &was_cancelled);
  --waiters_;
  if (absl::Status s = CheckOpenLocked(scope); !s.ok()) return s;
  if (was_cancelled) return absl::CancelledError("the caller went away");
  if (!done) {
    if (timeout <= absl::ZeroDuration()) {
      return absl::NotFoundError(absl::StrCat("rendezvous key '", key, "' of job ",
                                              ScopeName(scope), " is not set"));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous key '", key, "' of job ", ScopeName(scope), " was not set within ",
        absl::FormatDuration(timeout), ": a peer has not started or has died"));
  }
  return scopes_[scope].values[key];
}

absl::Status Rendezvous::Barrier(const Scope& scope, const std::string& id, int participant,
                                 int num_participants, absl::Duration timeout,
                                 const Cancelled& cancelled) {
  SUBSTRAX_RETURN_IF_ERROR(CheckName("barrier_id", id));
  absl::MutexLock lock(&mu_);
  if (absl::Status s = CheckOpenLocked(scope); !s.ok()) return s;
  if (waiters_ >= limits::kMaxRendezvousWaiters) return TooManyWaiters();
  if (num_participants < 1 || participant < 0 || participant >= num_participants) {
    return absl::InvalidArgumentError(absl::StrCat("barrier '", id, "': participant ", participant,
                                                   " of ", num_participants));
  }
  if (num_participants > limits::kMaxBarrierParticipants) {
    return absl::InvalidArgumentError(
        absl::StrCat("barrier '", id, "': ", num_participants,
                     " participants, more than the limit of ", limits::kMaxBarrierParticipants));
  }
  auto& barriers = scopes_[scope].barriers;
  if (barriers.count(id) == 0 && static_cast<int>(barriers.size()) >= limits::kMaxBarriersPerAttempt) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", ScopeName(scope), " already has ", barriers.size(),
        " barriers, the limit per attempt"));
  }
  BarrierState& barrier = barriers[id];
  if (barrier.num_participants == 0) barrier.num_participants = num_participants;
  if (barrier.num_participants != num_participants) {
    return absl::InvalidArgumentError(absl::StrCat(
        "barrier '", id, "' of job ", ScopeName(scope), ": participant ", participant, " expects ",
        num_participants, " participants, others expect ", barrier.num_participants));
  }
  barrier.arrived.insert(participant);
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return closed_.count(scope) ||
           static_cast<int>(scopes_[scope].barriers[id].arrived.size()) >= num_participants;
  };
  ++waiters_;
  bool was_cancelled = false;
  const bool done = AwaitLocked(absl::Condition(&ready), timeout, cancelled, &was_cancelled);
  --waiters_;
  if (absl::Status s = CheckOpenLocked(scope); !s.ok()) return s;
  if (was_cancelled) return absl::CancelledError("the caller went away");
  if (!done) {
    // The first few missing, and how many: the message stays small whatever the count.
    constexpr int kMissingShown = 16;
    std::vector<int> missing;
    const auto& arrived = scopes_[scope].barriers[id].arrived;
    const int absent = num_participants - static_cast<int>(arrived.size());
    for (int p = 0; p < num_participants && static_cast<int>(missing.size()) < kMissingShown;
         ++p) {
      if (!arrived.count(p)) missing.push_back(p);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "barrier '", id, "' of job ", ScopeName(scope), ": participants ",
        absl::StrJoin(missing, ", "), absent > kMissingShown ? absl::StrCat(" (", absent, " in all)") : "",
        " did not arrive within ", absl::FormatDuration(timeout)));
  }
  return absl::OkStatus();
}

void Rendezvous::CloseScope(const Scope& scope) {
  absl::MutexLock lock(&mu_);
  if (auto it = scopes_.find(scope); it != scopes_.end()) {
    bytes_ -= it->second.bytes;
    scopes_.erase(it);
  }
  if (!closed_.insert(scope).second) return;
  closed_order_.push_back(scope);
  if (closed_order_.size() > kClosedScopesKept) {
    closed_.erase(closed_order_.front());
    closed_order_.pop_front();
  }
}

}  // namespace substrax
