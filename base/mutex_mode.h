// How absl::Mutex runs in substrax's programs.
#ifndef SUBSTRAX_BASE_MUTEX_MODE_H_
#define SUBSTRAX_BASE_MUTEX_MODE_H_

#include "absl/synchronization/mutex.h"

namespace substrax::base {

// Debian's abseil is built without NDEBUG, so every absl::Mutex lock, ours and gRPC's (gRPC's
// own mutexes are absl::Mutex), runs abseil's deadlock detector: a process-wide graph of lock
// ids behind one global lock. Profiled in the coordinator holding 10,000 workers, that graph
// (GraphCycles::GetId) took 15% of all CPU. Optimized builds (`-c opt` defines NDEBUG) turn the
// detector off; fastbuild, where the tests run, keeps it, so tests still catch a lock-order
// cycle. Call it first in main(), before any thread starts.
inline void DisableMutexDeadlockDetectionInOptimizedBuilds() {
#ifdef NDEBUG
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
#endif
}

}  // namespace substrax::base

#endif  // SUBSTRAX_BASE_MUTEX_MODE_H_
