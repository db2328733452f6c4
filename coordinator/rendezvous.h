// Rendezvous: the coordinator's key-value store and barriers, scoped per job attempt. Runners of
// one attempt connect their Gloo contexts (and exchange NCCL ids) through it; keys of one
// attempt never meet another's, and an attempt's keys are dropped when it ends.
//
// Bounded: key and value sizes, keys, bytes and barriers per attempt, bytes over all attempts,
// participants of a barrier, and waiters (limits.h); closed scopes are
// remembered only for the most recent kClosedScopesKept (the rpc layer refuses ended attempts
// before they get here anyway).
//
// Thread-safe. Get and Barrier block their caller (a gRPC handler thread) up to a timeout, and
// return early with CANCELLED once `cancelled` (polled every 250 ms) says the caller is gone.
#ifndef SUBSTRAX_COORDINATOR_RENDEZVOUS_H_
#define SUBSTRAX_COORDINATOR_RENDEZVOUS_H_

#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/limits.h"

namespace substrax {

class Rendezvous {
 public:
  using Scope = std::pair<std::string, int>;  // (job id, attempt)

  // The byte totals (limits.h's by default; tests make them small).
  struct Options {
    size_t max_bytes_per_attempt = limits::kMaxRendezvousBytesPerAttempt;
    size_t max_bytes = limits::kMaxRendezvousBytes;
  };
  Rendezvous() : Rendezvous(Options()) {}
  explicit Rendezvous(Options options) : options_(options) {}

  using Cancelled = std::function<bool()>;
  static constexpr size_t kClosedScopesKept = 100000;

  // Errors: ALREADY_EXISTS (set before and !allow_overwrite), FAILED_PRECONDITION (the scope
  // was closed: the attempt ended), INVALID_ARGUMENT (key or value too long),
  // RESOURCE_EXHAUSTED (the attempt has kMaxKeysPerAttempt keys or would pass
  // Options::max_bytes_per_attempt, or all attempts together Options::max_bytes).
  absl::Status Set(const Scope& scope, const std::string& key, const std::string& value,
                   bool allow_overwrite);
  // Waits up to `timeout` for the key. Errors: NOT_FOUND (timeout zero and not set),
  // DEADLINE_EXCEEDED (not set in time; names the key), FAILED_PRECONDITION (scope closed, also
  // while waiting), CANCELLED, RESOURCE_EXHAUSTED (kMaxRendezvousWaiters wait already).
  absl::StatusOr<std::string> Get(const Scope& scope, const std::string& key,
                                  absl::Duration timeout, const Cancelled& cancelled = nullptr);
  // Returns once `num_participants` distinct participants entered barrier `id` of the scope.
  // Errors: INVALID_ARGUMENT (participant out of range, participants disagree on the count,
  // more than kMaxBarrierParticipants, id too long), DEADLINE_EXCEEDED (listing the first who
  // are missing), FAILED_PRECONDITION (scope closed), CANCELLED, RESOURCE_EXHAUSTED (as Get; or
  // the attempt has kMaxBarriersPerAttempt barriers). Nothing grows with num_participants but
  // the participants that arrived.
  absl::Status Barrier(const Scope& scope, const std::string& id, int participant,
                       int num_participants, absl::Duration timeout,
                       const Cancelled& cancelled = nullptr);
  // Drops the scope's keys and barriers and fails its waiters; later calls on it fail.
  void CloseScope(const Scope& scope);

 private:
  struct BarrierState {
    int num_participants = 0;
    std::set<int> arrived;
  };
  struct ScopeState {
    std::map<std::string, std::string> values;
    std::map<std::string, BarrierState> barriers;
    // Bytes of the keys and values in `values`.
    size_t bytes = 0;
  };
  absl::Status CheckOpenLocked(const Scope& scope) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for `ready` up to `timeout` in slices, so that `cancelled` is looked at; false when
  // the time is up or the caller cancelled (*was_cancelled says which).
  bool AwaitLocked(const absl::Condition& ready, absl::Duration timeout,
                   const Cancelled& cancelled, bool* was_cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  absl::Mutex mu_;
  std::map<Scope, ScopeState> scopes_ ABSL_GUARDED_BY(mu_);
  std::set<Scope> closed_ ABSL_GUARDED_BY(mu_);
  std::deque<Scope> closed_order_ ABSL_GUARDED_BY(mu_);
  int waiters_ ABSL_GUARDED_BY(mu_) = 0;
  // The bytes of every open scope's keys and values.
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_RENDEZVOUS_H_
