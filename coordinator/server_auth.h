// The coordinator's one authorization step, keyed by the method gRPC reports for each call.
//
// gRPC 1.51's server interceptors can look at a call but cannot end it, so the step has two
// halves: an interceptor (MakeInterceptorFactory) that, once the call's initial metadata has
// arrived, decides with Authenticator::Authorize(peer, ServerRpcInfo::method()) and records the
// decision; and Decision(), which the reactor of every method calls first and whose refusal it
// answers with. A call with no recorded decision (it bypassed the interceptor: a bug) is refused
// with PERMISSION_DENIED, as is a method without a rule in MethodRules. No handler spells a
// method name.
//
// The same step caps each identity's calls in flight (CallerCaps): a user's open server streams
// (WatchJob, ReadLogs) and its unary calls, each counted from the call's initial metadata until
// it is done; a call past a cap is refused with RESOURCE_EXHAUSTED naming the cap and its flag.
// Never counted: the worker-facing CoordinatorService (daemons and runners), callers with the
// worker role, and --insecure callers (who have no identity to count by), so that no user can
// starve heartbeats, reports or rendezvous.
//
// Thread-safe.
#ifndef SUBSTRAX_COORDINATOR_SERVER_AUTH_H_
#define SUBSTRAX_COORDINATOR_SERVER_AUTH_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auth.h"
#include "coordinator/limits.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/server_interceptor.h"

namespace substrax {

// What one identity may have in flight (CoordinatorServerOptions' fields of the same names);
// 0 or less: no cap.
struct CallerCaps {
  int max_streams_per_caller = limits::kDefaultMaxStreamsPerCaller;
  int max_calls_per_caller = limits::kDefaultMaxCallsPerCaller;
};

class CallAuthorizer {
 public:
  // `auth` must outlive this and every server built with its interceptor factory.
  explicit CallAuthorizer(Authenticator* auth, CallerCaps caps = CallerCaps())
      : auth_(auth), caps_(caps) {}

  // For grpc::ServerBuilder::experimental().SetInterceptorCreators: one per server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeInterceptorFactory();

  // The decision recorded for the call of `context`: the Caller (for the per-request checks: a
  // worker only as itself, a submitter's own jobs), or the refusal to answer with.
  absl::StatusOr<Caller> Decision(const grpc::ServerContextBase* context) const;

  // Calls with a recorded decision now (tests: the entries go with their calls).
  size_t calls() const;
  // The calls of `name` counted against its caps now (tests: they go with their calls).
  int counted(const std::string& name) const;

  // The caps' half of the step, which the interceptor takes with Authorize's decision for a
  // call of `method` (a server stream when `stream`): the decision itself, counted (*counted
  // true: Release when the call is done) when the caps apply and the caller is under them, or
  // RESOURCE_EXHAUSTED naming the caller, the cap and its flag.
  absl::StatusOr<Caller> Admit(absl::StatusOr<Caller> decision, bool stream,
                               absl::string_view method, bool* counted);
  void Release(const std::string& name, bool stream);

 private:
  class Interceptor;
  class Factory;
  struct Entry {
    uint64_t serial;  // the Record() that made it
    absl::StatusOr<Caller> decision;
  };
  // Returns the entry's serial, for Forget.
  uint64_t Record(const grpc::ServerContextBase* context, absl::StatusOr<Caller> decision);
  // Erases the entry of `context` if it is still the one Record returned `serial` for.
  void Forget(const grpc::ServerContextBase* context, uint64_t serial);

  Authenticator* const auth_;
  const CallerCaps caps_;
  mutable absl::Mutex mu_;
  // Per identity counted: (open streams, unary calls in flight); an entry goes at (0, 0).
  std::map<std::string, std::pair<int, int>> in_flight_ ABSL_GUARDED_BY(mu_);
  uint64_t last_serial_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const grpc::ServerContextBase*, Entry> decisions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_SERVER_AUTH_H_
