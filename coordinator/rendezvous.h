// Rendezvous: the coordinator's key-value store and barriers, scoped per job attempt. Runners of
// one attempt connect their Gloo contexts (and exchange NCCL ids) through it; keys of one
// attempt never meet another's, and an attempt's keys are dropped when it ends.
//
// Thread-safe. Get and Barrier block their caller (a gRPC handler thread) up to a timeout.
#ifndef SUBSTRAX_COORDINATOR_RENDEZVOUS_H_
#define SUBSTRAX_COORDINATOR_RENDEZVOUS_H_

#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace substrax {

class Rendezvous {
 public:
  using Scope = std::pair<std::string, int>;  // (job id, attempt)

  // Errors: ALREADY_EXISTS (set before and !allow_overwrite), FAILED_PRECONDITION (the scope
  // was closed: the attempt ended).
  absl::Status Set(const Scope& scope, const std::string& key, const std::string& value,
                   bool allow_overwrite);
  // Waits up to `timeout` for the key. Errors: NOT_FOUND (timeout zero and not set),
  // DEADLINE_EXCEEDED (not set in time; names the key), FAILED_PRECONDITION (scope closed, also
  // while waiting).
  absl::StatusOr<std::string> Get(const Scope& scope, const std::string& key,
                                  absl::Duration timeout);
  // Returns once `num_participants` distinct participants entered barrier `id` of the scope.
  // Errors: INVALID_ARGUMENT (participant out of range, participants disagree on the count),
  // DEADLINE_EXCEEDED (listing who is missing), FAILED_PRECONDITION (scope closed).
  absl::Status Barrier(const Scope& scope, const std::string& id, int participant,
                       int num_participants, absl::Duration timeout);
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
  };
  absl::Status CheckOpenLocked(const Scope& scope) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  std::map<Scope, ScopeState> scopes_ ABSL_GUARDED_BY(mu_);
  std::set<Scope> closed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_RENDEZVOUS_H_
