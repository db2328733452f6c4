#include "worker/runtime/overlapped_reduction.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace substrax {

absl::StatusOr<std::unique_ptr<OverlappedReduction>> OverlappedReduction::Create(
    MeshCommunicators& comms, const GradientPlan& plan, float* flat, ReduceOp op,
    int64_t bucket_bytes, const char* fn) {
  std::unique_ptr<OverlappedReduction> r(new OverlappedReduction(flat, op, fn));
  const int64_t bucket = BucketValues(bucket_bytes);
  for (size_t axis = 0; axis < plan.axes.size(); ++axis) {
    SUBSTRAX_ASSIGN_OR_RETURN(Communicator * comm, comms.Axis(plan.axes[axis].first));
    if (comm->size() == 1) continue;  // one replica along this axis: nothing to average
    for (const FlatRange& b : CutBuckets(plan.axes[axis].second, bucket)) {
      r->buckets_.push_back({comm, static_cast<int>(axis), b.offset, b.size, b.size, false});
    }
  }
  r->thread_ = std::thread([p = r.get()] { p->Run(); });
  return r;
}

OverlappedReduction::OverlappedReduction(float* flat, ReduceOp op, const char* fn)
    : flat_(flat), op_(op), fn_(fn) {}

OverlappedReduction::~OverlappedReduction() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void OverlappedReduction::Begin() {
  for (Bucket& b : buckets_) {
    b.pending = b.count;
    b.started = false;
  }
  started_ = 0;
  absl::MutexLock lock(&mu_);
  done_ = 0;
}

void OverlappedReduction::Ready(int64_t offset, int64_t size) {
  const int64_t end = offset + size;
  for (Bucket& b : buckets_) {
    const int64_t overlap =
        std::min(end, b.offset + b.count) - std::max(offset, b.offset);
    if (overlap > 0) b.pending -= overlap;
  }
  StartReady();
}

bool OverlappedReduction::EarlierAxesStarted(const Bucket& b) const {
  for (const Bucket& e : buckets_) {
    if (e.axis >= b.axis) continue;
    const bool shares = e.offset < b.offset + b.count && b.offset < e.offset + e.count;
    if (shares && !e.started) return false;
  }
  return true;
}

void OverlappedReduction::StartReady() {
  // Starting one bucket may let a later axis's bucket start: loop until nothing changes.
  for (bool again = true; again;) {
    again = false;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      if (b.started || b.pending > 0 || !EarlierAxesStarted(b)) continue;
      b.started = true;
      ++started_;
      ++collectives_;
      again = true;
      absl::MutexLock lock(&mu_);
      queue_.push_back(i);
    }
  }
}

absl::Status OverlappedReduction::Finish() {
  // What the backend did not announce is final now.
  for (Bucket& b : buckets_) b.pending = 0;
  StartReady();
  absl::MutexLock lock(&mu_);
  struct Wait {
    const size_t* done;
    size_t all;
  } wait{&done_, started_};
  mu_.Await(absl::Condition(+[](Wait* w) { return *w->done >= w->all; }, &wait));
  return Annotate(status_, fn_);
}

void OverlappedReduction::Run() {
  for (;;) {
    size_t i;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](OverlappedReduction* r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(r->mu_) {
            return r->stop_ || !r->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping, nothing left
      i = queue_.front();
      queue_.pop_front();
      if (!status_.ok()) {  // a bucket failed: the step fails; the rest need not run
        ++done_;
        continue;
      }
    }
    const Bucket& b = buckets_[i];
    absl::Status s = b.comm->AllReduce(flat_ + b.offset, DataType::kFloat32,
                                       static_cast<size_t>(b.count), op_);
    absl::MutexLock lock(&mu_);
    if (!s.ok() && status_.ok()) status_ = std::move(s);
    ++done_;
  }
}

}  // namespace substrax
