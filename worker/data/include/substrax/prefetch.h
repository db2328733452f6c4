// Prefetcher: the guide's prefetch_to_device(pipeline, size=2). A background thread calls a
// producer (gather the next shard, later: copy it to the device) and keeps up to `size` items
// ready, so a device thread finds its next batch waiting instead of building it between steps.
//
//   SUBSTRAX_ASSIGN_OR_RETURN(auto batches, PrefetchToDevice<Batch>(
//       [&]() -> absl::StatusOr<std::optional<Batch>> { ... }, spec.data().prefetch_size()));
//   while (true) {
//     SUBSTRAX_ASSIGN_OR_RETURN(std::optional<Batch> batch, batches->Next());
//     if (!batch) break;  // end of the data
//     ...
//   }
//
// Thread-safety: Next() may be called from any thread (items are handed out once each, in the
// producer's order); the producer runs on the prefetcher's own thread only, one call at a time,
// never under the prefetcher's lock. Destroying the Prefetcher must not race with Next().
//
// Header-only.
#ifndef SUBSTRAX_PREFETCH_H_
#define SUBSTRAX_PREFETCH_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace substrax {

// Returns the next item, std::nullopt at the end of the stream, or an error (which also ends
// it). Called again only after the previous call returned an item.
template <typename T>
using Producer = std::function<absl::StatusOr<std::optional<T>>()>;

template <typename T>
class Prefetcher {
 public:
  // Starts the background thread, which keeps up to `size` items ready: it calls the producer
  // only when fewer than `size` items wait, so at most `size` items exist ahead of the consumer
  // (counting the one being produced).
  // Errors: INVALID_ARGUMENT when size < 1 or the producer is empty.
  static absl::StatusOr<std::unique_ptr<Prefetcher>> Create(Producer<T> producer, int size) {
    if (size < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("prefetch size must be >= 1 (items kept ready), got ", size));
    }
    if (!producer) return absl::InvalidArgumentError("prefetch needs a producer, got none");
    return std::unique_ptr<Prefetcher>(new Prefetcher(std::move(producer), size));
  }

  // Stops the thread and waits for it: promptly when it waits on a full queue, also when the
  // consumer stopped before the end; after the producer returns when a call is in progress (a
  // call is never interrupted). Items not taken are dropped.
  ~Prefetcher() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    thread_.join();
  }

  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next item in the producer's order, waiting for it when none is ready. After the last
  // item: std::nullopt, on every call. When the producer failed: its error, once, after the
  // items it produced before; then std::nullopt.
  absl::StatusOr<std::optional<T>> Next() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &Prefetcher::HasItemOrEndedLocked));
    if (!queue_.empty()) {
      std::optional<T> item(std::move(queue_.front()));
      queue_.pop_front();
      return item;
    }
    if (!error_.ok()) return std::exchange(error_, absl::OkStatus());
    return std::optional<T>();
  }

 private:
  Prefetcher(Producer<T> producer, int size)
      : producer_(std::move(producer)), size_(static_cast<size_t>(size)) {
    thread_ = std::thread([this] { Run(); });
  }

  void Run() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        mu_.Await(absl::Condition(this, &Prefetcher::HasRoomOrStoppingLocked));
        if (stopping_) return;
      }
      // Without the lock: a slow producer must not hold up Next().
      absl::StatusOr<std::optional<T>> item = producer_();
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      if (!item.ok() || !item->has_value()) {
        error_ = item.status();
        ended_ = true;
        return;
      }
      queue_.push_back(std::move(**item));
    }
  }

  bool HasRoomOrStoppingLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || queue_.size() < size_;
  }
  bool HasItemOrEndedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || ended_;
  }

  const Producer<T> producer_;
  const size_t size_;
  absl::Mutex mu_;
  std::deque<T> queue_ ABSL_GUARDED_BY(mu_);
  // The producer returned the end or an error; it is not called again.
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // The producer's error until Next() hands it out; OK otherwise.
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Declared last: the thread starts once every member it uses exists.
  std::thread thread_;
};

// The guide's prefetch_to_device(pipeline, size=2): a Prefetcher over `producer`.
// Errors: as Prefetcher::Create.
template <typename T>
absl::StatusOr<std::unique_ptr<Prefetcher<T>>> PrefetchToDevice(Producer<T> producer,
                                                                int size = 2) {
  return Prefetcher<T>::Create(std::move(producer), size);
}

}  // namespace substrax

#endif  // SUBSTRAX_PREFETCH_H_
