// Communicator: the device-neutral collectives one device uses to talk to the other devices of a
// group (the whole mesh, or the devices along one mesh axis). Implementations: Gloo over TCP for
// CPU devices (gloo_communicator.h) and NCCL for GPUs (nccl_communicator.h).
//
// Like NCCL's own API (and XLA's collectives Communicator), a collective takes a buffer, a dtype
// value, an element count and an execution context:
//   - on CPU the context is the calling thread: the collective has run when the call returns;
//   - on a GPU the context is a CUDA stream: the collective is queued on it, after the work
//     already queued there and before the work queued after it.
// Each collective returns a CollectiveEvent, its completion handle: Await() waits for it (and for
// the device), IsReady() asks without blocking, so a caller can overlap collectives with compute.
// The plain-named methods (AllReduce, ...) are the blocking twins: start, then Await.
//
// AllReduceGroupAsync reduces many buffers (the buckets of a gradient buffer) as one group with
// one completion handle. On a GPU backend with a stream context it is queued on the
// communicator's own stream, ordered after the work already on the context's stream and before
// the work queued there afterwards by CUDA events, and the host does not wait: Await the handle
// later (at a report) to learn the outcome. On CPU it runs each all-reduce in turn.
//
// Buffers may be host memory on every backend (the NCCL backend stages host buffers through
// device memory); device memory only on the backend of that device.
//
// Every rank of a group calls the same collectives in the same order (as with MPI, Gloo and
// NCCL); the implementation allocates the tags that match them up, never the caller. Every
// collective has a timeout. Errors are mapped once, by retry semantics:
//   UNAVAILABLE         a peer died or a connection broke (the message names the dead rank and
//                       host when known); the job attempt must be restarted.
//   DEADLINE_EXCEEDED   the collective did not finish within its timeout and no peer is known
//                       to be dead (a peer is stuck or far slower).
//   INVALID_ARGUMENT    the call itself is wrong (buffer sizes, root out of range); checked here
//                       before anything is sent.
//   FAILED_PRECONDITION the communicator is unusable (an earlier collective failed).
//   INTERNAL            the device failed (a CUDA error); at once, never as a timeout.
//
// A Communicator is used by one thread (the device's) at a time; PeerDied from any thread.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_COMMUNICATOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_COMMUNICATOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/metric_reductions.h"

// cudaStream_t is a CUstream_st*; declared here so that this header needs no CUDA headers.
struct CUstream_st;

namespace substrax {

// The element type of a collective's buffers.
enum class DataType { kFloat32, kFloat64 };

size_t DataTypeSize(DataType type);
const char* DataTypeName(DataType type);

template <typename T>
constexpr DataType DataTypeOf();
template <>
constexpr DataType DataTypeOf<float>() {
  return DataType::kFloat32;
}
template <>
constexpr DataType DataTypeOf<double>() {
  return DataType::kFloat64;
}

// Where a collective is ordered: the calling thread (stream == nullptr; on a GPU backend, the
// communicator's own stream, waited for by Await), or a CUDA stream of the communicator's device.
struct ExecutionContext {
  CUstream_st* stream = nullptr;

  static ExecutionContext CallingThread() { return ExecutionContext(); }
  static ExecutionContext Stream(CUstream_st* s) { return ExecutionContext{s}; }
};

// One buffer of a grouped all-reduce: `count` values at `data`, reduced in place.
struct ReduceBuffer {
  void* data = nullptr;
  size_t count = 0;
};

// The completion handle of one collective. Copyable; every copy refers to the same collective.
class CollectiveEvent {
 public:
  // What a backend implements for a collective still in flight.
  class Pending {
   public:
    virtual ~Pending() = default;
    // True once the collective has completed or failed. Never blocks.
    virtual bool IsReady() = 0;
    // Blocks until the collective has completed (or failed) and returns its outcome.
    virtual absl::Status Await() = 0;
  };

  // A collective that has already completed with `status`.
  static CollectiveEvent Done(absl::Status status = absl::OkStatus());
  // The handle of several collectives: ready once all are, its outcome the first error among
  // them (in order), else OK.
  static CollectiveEvent All(std::vector<CollectiveEvent> events);
  explicit CollectiveEvent(std::shared_ptr<Pending> pending) : pending_(std::move(pending)) {}

  bool IsReady() const;
  // The collective's outcome, waiting for it first. Calling it again returns the same outcome.
  absl::Status Await() const;

 private:
  CollectiveEvent() = default;
  std::shared_ptr<Pending> pending_;
  absl::Status done_;  // the outcome when pending_ is null
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "world", "axis 'data' group 1": for messages.
  virtual const std::string& name() const = 0;

  // In place: every rank ends with the reduction of all ranks' `count` values at `data`. kMean
  // divides the sum by size().
  CollectiveEvent AllReduceAsync(void* data, DataType type, size_t count, ReduceOp op,
                                 ExecutionContext context = {});
  // `output` holds count * size() values: the `count` values of `input` of ranks 0..size-1
  // concatenated.
  CollectiveEvent AllGatherAsync(const void* input, void* output, DataType type, size_t count,
                                 ExecutionContext context = {});
  // Every rank ends with root's `count` values at `data`.
  CollectiveEvent BroadcastAsync(void* data, DataType type, size_t count, int root,
                                 ExecutionContext context = {});
  // `input` holds count * size() values; `output` gets block rank() (of `count` values) of
  // their reduction over all ranks.
  CollectiveEvent ReduceScatterAsync(const void* input, void* output, DataType type,
                                     size_t count, ReduceOp op, ExecutionContext context = {});
  // Completes once every rank has entered the barrier.
  CollectiveEvent BarrierAsync(ExecutionContext context = {});
  // Every buffer all-reduced in place, as one group (see the header comment). Errors: as
  // AllReduceAsync, for the first buffer that fails; INVALID_ARGUMENT for a null buffer with a
  // non-zero count (checked before anything is queued).
  CollectiveEvent AllReduceGroupAsync(absl::Span<const ReduceBuffer> buffers, DataType type,
                                      ReduceOp op, ExecutionContext context = {});

  // The blocking twins.
  absl::Status AllReduce(void* data, DataType type, size_t count, ReduceOp op,
                         ExecutionContext context = {}) {
    return AllReduceAsync(data, type, count, op, context).Await();
  }
  absl::Status AllGather(const void* input, void* output, DataType type, size_t count,
                         ExecutionContext context = {}) {
    return AllGatherAsync(input, output, type, count, context).Await();
  }
  absl::Status Broadcast(void* data, DataType type, size_t count, int root,
                         ExecutionContext context = {}) {
    return BroadcastAsync(data, type, count, root, context).Await();
  }
  absl::Status ReduceScatter(const void* input, void* output, DataType type, size_t count,
                             ReduceOp op, ExecutionContext context = {}) {
    return ReduceScatterAsync(input, output, type, count, op, context).Await();
  }
  absl::Status Barrier() { return BarrierAsync().Await(); }

  // Host-span conveniences (blocking, on the calling thread); sizes are checked as above.
  template <typename T>
  absl::Status AllReduce(absl::Span<T> data, ReduceOp op) {
    return AllReduce(data.data(), DataTypeOf<T>(), data.size(), op);
  }
  // `input`: anything absl::Span<const T> is made from (a vector, a span).
  template <typename Input, typename T>
  absl::Status AllGather(const Input& input, absl::Span<T> output) {
    const absl::Span<const T> in(input);
    absl::Status sizes = CheckSizes("all_gather", in.size(), output.size(),
                                    in.size() * static_cast<size_t>(size()));
    if (!sizes.ok()) return sizes;
    return AllGather(in.data(), output.data(), DataTypeOf<T>(), in.size());
  }
  template <typename T>
  absl::Status Broadcast(absl::Span<T> data, int root) {
    return Broadcast(data.data(), DataTypeOf<T>(), data.size(), root);
  }
  template <typename Input, typename T>
  absl::Status ReduceScatter(const Input& input, absl::Span<T> output, ReduceOp op) {
    const absl::Span<const T> in(input);
    if (in.size() % static_cast<size_t>(size()) != 0) return Indivisible(in.size());
    absl::Status sizes = CheckSizes("reduce_scatter", in.size(), output.size(),
                                    in.size() / static_cast<size_t>(size()));
    if (!sizes.ok()) return sizes;
    return ReduceScatter(in.data(), output.data(), DataTypeOf<T>(), output.size(), op);
  }

  // The job learned that `who` ("process 2 (worker w-2, host b) died: ...") is dead: a backend
  // whose collectives would otherwise wait for it until their timeout aborts them now (NCCL);
  // one that notices closed connections by itself ignores it (Gloo).
  virtual void PeerDied(const std::string& who) { (void)who; }

  // This communicator is a part of another (a hierarchical communicator's inside-host or
  // between-hosts group): its collectives are not counted in the process's activity file
  // (contract/activity.h), the whole one's are.
  void NotCounted() { activity_slot_ = kNotCounted; }

 protected:
  // Called with arguments already checked (root in range, buffers non-null when count > 0).
  virtual CollectiveEvent DoAllReduce(void* data, DataType type, size_t count, ReduceOp op,
                                      ExecutionContext context) = 0;
  virtual CollectiveEvent DoAllGather(const void* input, void* output, DataType type,
                                      size_t count, ExecutionContext context) = 0;
  virtual CollectiveEvent DoBroadcast(void* data, DataType type, size_t count, int root,
                                      ExecutionContext context) = 0;
  virtual CollectiveEvent DoReduceScatter(const void* input, void* output, DataType type,
                                          size_t count, ReduceOp op,
                                          ExecutionContext context) = 0;
  virtual CollectiveEvent DoBarrier(ExecutionContext context) = 0;
  // Buffers checked and non-empty. The default starts DoAllReduce for each buffer and returns
  // CollectiveEvent::All of them; NCCL groups them (ncclGroupStart/End).
  virtual CollectiveEvent DoAllReduceGroup(absl::Span<const ReduceBuffer> buffers, DataType type,
                                           ReduceOp op, ExecutionContext context);

 private:
  absl::Status CheckSizes(const char* op, size_t input, size_t output, size_t expected_output);
  absl::Status Indivisible(size_t input);
  absl::Status CheckBuffers(const char* op, const void* a, const void* b, size_t count);
  // The collective about to start is counted as entered in the process's activity file
  // (contract/activity.h; `kind` a CollectiveKind); returns its slot there, -1 for none.
  int Entering(int64_t kind, size_t count);
  // An all-reduce about to start: the job failpoints' (job_failpoints.h) sleep or skip; true
  // when it is to be skipped.
  bool SkippedByFailpoint();
  // `event`, counted as completed in `slot` once it is.
  static CollectiveEvent Counted(int slot, CollectiveEvent event);

  static constexpr int kUnregistered = -2;
  static constexpr int kNotCounted = -3;
  int activity_slot_ = kUnregistered;
  int64_t all_reduces_ = 0;  // numbered for the job failpoints (job_failpoints.h)
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_COMMUNICATOR_H_
