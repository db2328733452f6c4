// CancellableCall: lets one thread cancel the unary rpc another thread has in flight, and every
// later one (a sender that stops: StepReporter's and LogShipper's gRPC senders).
//
// Thread-safe.
#ifndef SUBSTRAX_RPC_CANCELLABLE_CALL_H_
#define SUBSTRAX_RPC_CANCELLABLE_CALL_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"

namespace substrax {

class CancellableCall {
 public:
  // Runs `call` with `context` registered for Cancel; false (and `call` not run) once cancelled.
  template <typename Fn>
  bool Run(grpc::ClientContext* context, Fn call) {
    {
      absl::MutexLock lock(&mu_);
      if (cancelled_) return false;
      active_ = context;
    }
    call();
    absl::MutexLock lock(&mu_);
    active_ = nullptr;
    return true;
  }
  // Cancels the call in flight, if any, and every later one.
  void Cancel() {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (active_ != nullptr) active_->TryCancel();
  }

 private:
  absl::Mutex mu_;
  grpc::ClientContext* active_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace substrax

#endif  // SUBSTRAX_RPC_CANCELLABLE_CALL_H_
