// OverlappedReduction: the gradient buckets of a step all-reduced while the backward pass is
// still producing the buffer, as PyTorch DDP and Horovod overlap them, for backends whose
// collectives run on the calling thread (CPU).
//
// The buckets are ReduceFlat's: each axis's ranges of the flat buffer cut at range ends and
// every bucket_bytes. The backend announces each gradient as soon as it is complete (Ready);
// a bucket whose values are all announced starts at once on this object's own thread, so the
// device thread goes on with the pass. Every device runs the same backward, so buckets start in
// the same order on every device, as a communicator needs. A bucket of a later axis starts only
// after every bucket of the earlier axes that shares values with it: each value is reduced over
// the axes in mesh order, as ReduceFlat does, and the results equal it bit for bit.
//
// Finish() starts whatever was not announced, waits for every bucket, and returns the first
// error (annotated with fn). A step: Begin(), the backward pass calling Ready(), Finish().
//
// Nothing else may use the plan's communicators between Begin and Finish (the thread is theirs
// then): the step loop does not overlap when the backward pass itself communicates (tensor
// parallelism).
#ifndef SUBSTRAX_WORKER_RUNTIME_OVERLAPPED_REDUCTION_H_
#define SUBSTRAX_WORKER_RUNTIME_OVERLAPPED_REDUCTION_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/runtime/gradient_buckets.h"

namespace substrax {

class OverlappedReduction {
 public:
  // Errors: INVALID_ARGUMENT for an axis the mesh does not have.
  static absl::StatusOr<std::unique_ptr<OverlappedReduction>> Create(
      MeshCommunicators& comms, const GradientPlan& plan, float* flat, ReduceOp op,
      int64_t bucket_bytes, const char* fn);
  ~OverlappedReduction();

  // A new step: nothing announced, nothing started.
  void Begin();
  // [offset, offset + size) of the flat buffer holds its final values. Device thread only.
  void Ready(int64_t offset, int64_t size);
  // Starts the buckets not started yet and waits for all of them.
  absl::Status Finish();

  // All-reduces issued so far (buckets times steps), for tests and stats.
  int64_t collectives() const { return collectives_; }
  int64_t buckets() const { return static_cast<int64_t>(buckets_.size()); }

 private:
  struct Bucket {
    Communicator* comm = nullptr;
    int axis = 0;
    int64_t offset = 0;
    int64_t count = 0;
    int64_t pending = 0;  // values not announced yet this step
    bool started = false;
  };

  OverlappedReduction(float* flat, ReduceOp op, const char* fn);
  // Starts every bucket that may start now, in bucket order.
  void StartReady();
  bool EarlierAxesStarted(const Bucket& b) const;
  void Run();

  float* const flat_;
  const ReduceOp op_;
  const char* const fn_;
  std::vector<Bucket> buckets_;
  int64_t collectives_ = 0;
  size_t started_ = 0;

  absl::Mutex mu_;
  std::deque<size_t> queue_ ABSL_GUARDED_BY(mu_);
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_OVERLAPPED_REDUCTION_H_
