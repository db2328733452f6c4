// NcclWatchdog: decides, for each collective a non-blocking NCCL communicator has in flight,
// whether to keep waiting or to abort the communicator, and with which error. Builds without
// CUDA: NCCL and the clock are reached only through the callbacks in Options, so the logic is
// unit-tested with a fake clock and fake callbacks (no sleeps).
//
// In real use (nccl_communicator.cc) a thread calls Poll() every millisecond or so; the device
// thread Register()s each collective after enqueueing it and Wait()s for its outcome. Each
// Poll, in this order:
//   the communicator reports an async error        -> abort; that error (via nccl_errors)
//   a peer was reported dead (PeerDied)            -> abort; UNAVAILABLE naming it
//   per pending op, oldest first:
//     its `done` (or `started`) callback fails     -> abort; INTERNAL with that error, at once
//     finished (its `done` callback is true)       -> OK
//     queued (RegisterQueued) and not started      -> no deadline yet; once `started` is true,
//                                                     the deadline is that poll's time + timeout
//     its deadline has passed                      -> abort; DEADLINE_EXCEEDED naming the op,
//                                                     the communicator and the rank
//     otherwise (still in progress)                -> keep waiting
// The communicator's health is checked first: once it is broken, no op on it can be trusted. Aborting calls
// Options::abort (ncclCommAbort) exactly once; every pending op then fails with the abort's
// error, and every later Register fails with FAILED_PRECONDITION quoting it. A peer death is
// acted on at the next Poll even when no op is pending: every later collective of this
// communicator would wait for the dead peer.
//
// Thread-safe, except that Poll() must not run on two threads at once (it calls the callbacks
// outside the lock, and `abort` must not race `async_error`). Callbacks are never called with
// the watchdog's lock held.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_NCCL_WATCHDOG_H_
#define SUBSTRAX_WORKER_COLLECTIVES_NCCL_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collectives/nccl_errors.h"

namespace substrax {

class NcclWatchdog {
 public:
  struct Options {
    // Communicator name, rank, size and who this rank is, for messages.
    std::string communicator = "world";
    int rank = 0;
    int size = 1;
    std::string self;
    // The current time (absl::Now in real use; a fake clock in tests).
    std::function<absl::Time()> clock = [] { return absl::Now(); };
    // The communicator's async error as an ncclResult_t value (ncclCommGetAsyncError):
    // kSuccess or kInProgress while healthy. Null: never reports one.
    std::function<int()> async_error;
    // ncclGetLastError(comm)'s text, for messages. Null: none.
    std::function<std::string()> last_error;
    // Aborts the communicator (ncclCommAbort), making every op on it return. Called at most
    // once, from Poll. Null: nothing to call.
    std::function<void()> abort;
  };

  using OpId = uint64_t;
  // Whether an op has finished: true, false (still in flight), or an error when the device
  // failed (cudaEventQuery answered anything but cudaSuccess or cudaErrorNotReady).
  using DoneFn = std::function<absl::StatusOr<bool>()>;

  explicit NcclWatchdog(Options options) : options_(std::move(options)) {}

  // Starts watching op `op` ("all_reduce") that must finish by `deadline`; `done` says whether
  // it has finished (cudaEventQuery on an event recorded after it; called only from Poll).
  // Errors: FAILED_PRECONDITION once the communicator has been aborted (the message quotes why).
  absl::StatusOr<OpId> Register(std::string op, absl::Time deadline, DoneFn done);
  // As Register, for an op queued behind other work on its stream (the host runs steps ahead of
  // the device): its `timeout` counts from the first Poll at which `started` says true
  // (cudaEventQuery on an event recorded just before it), not from now, so queued compute is
  // never taken for a stuck peer. Until then it has no deadline: the op before it on the stream
  // has one. `started` failing is a device failure, as `done` failing.
  absl::StatusOr<OpId> RegisterQueued(std::string op, absl::Duration timeout, DoneFn started,
                                      DoneFn done);

  // Looks at every pending op once (see the header comment). Returns the abort's error if this
  // call aborted the communicator, else OK.
  absl::Status Poll();

  // The coordinator or the peer monitor says `who` ("process 2 (worker w-2, host b) died:
  // connection closed without goodbye") is dead; the next Poll aborts.
  void PeerDied(std::string who);

  // Blocks until Poll has resolved op `id`, then returns its outcome (and forgets it). For an
  // unknown or already collected id: INVALID_ARGUMENT.
  absl::Status Wait(OpId id);
  // True once op `id` is resolved (Wait would not block).
  bool Resolved(OpId id) const;
  // Number of ops not yet resolved.
  int pending() const;
  // OK, or the error the communicator was aborted with.
  absl::Status aborted() const;

 private:
  struct Op {
    std::string op;
    absl::Time deadline;
    DoneFn done;
    // RegisterQueued until the op is seen started (then null, and deadline set).
    DoneFn started;
    absl::Duration timeout;
    bool resolved = false;
    absl::Status status;
  };

  // Resolves every pending op with `status`, marks the communicator aborted; true if this call
  // did so (so the caller calls `abort`).
  bool AbortLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "<op> on NCCL communicator ... failed: " (options_ only; no lock needed).
  std::string Where(const std::string& op) const;

  const Options options_;
  mutable absl::Mutex mu_;
  OpId next_id_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<OpId, Op> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> dead_peers_ ABSL_GUARDED_BY(mu_);
  absl::Status aborted_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_NCCL_WATCHDOG_H_
