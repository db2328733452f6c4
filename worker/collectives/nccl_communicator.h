// NcclCommunicator: Communicator over NCCL for one GPU rank (the GPU backend).
//
// Real only under `bazel build --config=cuda`; the default build compiles a stub whose Create
// returns UNIMPLEMENTED, so that everything that depends on this target builds everywhere.
//
// Creation: rank 0 draws NCCL's unique id (ncclGetUniqueId) and publishes it in the Store under
// "nccl_unique_id" (give each communicator its own PrefixStore); the other ranks
// read it with connect_timeout. Communicators are non-blocking (ncclConfig_t blocking = 0):
// creation polls ncclCommGetAsyncError until the communicator is ready or connect_timeout
// passes (then it is aborted).
//
// Collectives are enqueued on a CUDA stream and watched by an NcclWatchdog, which a thread of
// this communicator polls every poll_interval: an async error (ncclCommGetAsyncError), the
// collective's timeout, or a peer reported dead with PeerDied() aborts the communicator
// (ncclCommAbort) and fails the collective with the mapped error (nccl_errors.h, including
// ncclGetLastError's text). After an abort every call fails with FAILED_PRECONDITION: create a
// new communicator (in practice: restart the job attempt).
//
// Buffers and streams: a collective on device memory is queued on the communicator's own stream
// and returns at once. With a stream in its context it is ordered there by CUDA events: the own
// stream waits for an event recorded on the context's stream, the collective runs, an event is
// recorded after it, and the context's stream waits for that event (cudaStreamWaitEvent), so the
// work queued there later sees the result while the host never waits. AllReduceGroupAsync puts
// all its buffers in one ncclGroupStart/ncclGroupEnd with one such event. The CollectiveEvent is
// resolved by the watchdog when the event after the collective completes (events are pooled).
// A host buffer (memory CUDA does not map to the device, found with cudaPointerGetAttributes) is
// staged: copied in, reduced and copied back on the communicator's stream before the call
// returns: correct but slower, for metrics and other small values.
//
// ReduceOp mapping: kSum -> ncclSum, kMean -> ncclAvg, kMax -> ncclMax, kMin -> ncclMin.
//
// Thread-safety: as Communicator, one thread (the device's) at a time; PeerDied may be called
// from any thread.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_NCCL_COMMUNICATOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_NCCL_COMMUNICATOR_H_

#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/collectives/nccl_watchdog.h"
#include "worker/collectives/store.h"

// The same opaque handle types nccl.h and cuda_runtime.h declare, so that this header needs
// neither (it is also compiled without CUDA).
typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace substrax {

class NcclEventPool;

struct NcclCommunicatorOptions {
  // Name used in messages ("world", "axis 'data' group 0").
  std::string name = "world";
  // CUDA device ordinal this rank runs on (cudaSetDevice).
  int device = 0;
  // Who this rank is, for messages: "device 2 (cuda:2 on host-b)"; may be empty.
  std::string self;
  // Every collective must finish within this time, else the communicator is aborted and the
  // collective fails with DEADLINE_EXCEEDED. Counted from the call, or, for a collective ordered
  // after a caller's stream, from when the work queued before it is done (the host may be steps
  // ahead of the device).
  absl::Duration timeout = absl::Seconds(30);
  // How long reading the unique id and connecting every rank may take at creation (and split).
  absl::Duration connect_timeout = absl::Seconds(60);
  // How often the watchdog thread looks at the collectives in flight.
  absl::Duration poll_interval = absl::Milliseconds(1);
  // Tests only: each collective's own stream sleeps this long (a host function) after the
  // collective could start and before it runs, so that one GPU can show a collective that
  // outlasts its timeout (a single rank never waits for a peer). Zero: off.
  absl::Duration test_stall_after_start = absl::ZeroDuration();
};

class NcclCommunicator final : public Communicator {
 public:
  // Connects rank `rank` of `size` ranks through `store` (which must outlive the call only).
  // Errors: INVALID_ARGUMENT (rank/size out of range); FAILED_PRECONDITION (the CUDA device
  // cannot be used: no GPU, driver missing; the CUDA error text is included); DEADLINE_EXCEEDED
  // (the unique id did not appear, or the ranks did not connect, within connect_timeout);
  // whatever NCCL reports, mapped by nccl_errors; UNIMPLEMENTED when built without
  // --config=cuda.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const NcclCommunicatorOptions& options, Store* store, int rank, int size);
  // Finalizes and destroys the NCCL communicator (unless it was aborted).
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return options_.name; }

  // A communicator of the ranks that pass the same `color` (>= 0), ranked by `key` then by
  // rank here (ncclCommSplit): the communicators of mesh axes are split from the world. Every
  // rank of this communicator must call it (it is a collective). `name` names the new one.
  // Errors: INVALID_ARGUMENT (negative color), FAILED_PRECONDITION (this one was aborted),
  // DEADLINE_EXCEEDED (not every rank split within connect_timeout), NCCL's errors.
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> Split(int color, int key, std::string name);

  // PeerDied(who) (the coordinator or the peer monitor says "process 2 (worker w-2, host b)
  // died: ..."): the watchdog aborts this communicator at once, and a collective in flight
  // fails with UNAVAILABLE naming `who`. Forward it to every communicator of the process
  // (each split communicator has its own watchdog).

  // The communicator's own stream (collectives whose context has none; staging; Barrier).
  cudaStream_t stream() const { return stream_; }

  void PeerDied(const std::string& who) override;

 protected:
  CollectiveEvent DoAllReduce(void* data, DataType type, size_t count, ReduceOp op,
                              ExecutionContext context) override;
  CollectiveEvent DoAllGather(const void* input, void* output, DataType type, size_t count,
                              ExecutionContext context) override;
  CollectiveEvent DoBroadcast(void* data, DataType type, size_t count, int root,
                              ExecutionContext context) override;
  CollectiveEvent DoReduceScatter(const void* input, void* output, DataType type, size_t count,
                                  ReduceOp op, ExecutionContext context) override;
  // An all-reduce of one element on the context's stream.
  CollectiveEvent DoBarrier(ExecutionContext context) override;
  // One NCCL group of all-reduces (device buffers); host buffers staged one by one.
  CollectiveEvent DoAllReduceGroup(absl::Span<const ReduceBuffer> buffers, DataType type,
                                   ReduceOp op, ExecutionContext context) override;

 private:
  NcclCommunicator(const NcclCommunicatorOptions& options, int rank, int size, ncclComm_t comm,
                   cudaStream_t stream);

  // Queues one collective (or one group) with `enqueue(comm, stream)` (an ncclResult_t value)
  // under comm_mu_ on stream_, ordered after and before the context's stream by events when it
  // has one, then returns an event the watchdog resolves: first NCCL must have enqueued it (a
  // non-blocking communicator may answer ncclInProgress), then an event recorded after it on
  // stream_ must complete. The host never waits for the collective itself.
  template <typename Enqueue>
  CollectiveEvent Run(const char* op, ExecutionContext context, Enqueue&& enqueue);
  // Waits (through the watchdog) until this non-blocking communicator has left ncclInProgress.
  absl::Status WaitUntilIdle(std::string op, absl::Time deadline);
  // Whether `ptr` is memory the device can access (device or managed memory).
  bool OnDevice(const void* ptr) const;
  // A host-buffer collective: copy `in_bytes` from `input` into device scratch, run `fn(in,
  // out)` on stream_ with device pointers, wait, copy `out_bytes` back into `output`.
  template <typename Fn>
  absl::Status Staged(const void* input, size_t in_bytes, void* output, size_t out_bytes,
                      Fn&& fn);
  // Device scratch of at least `bytes` (grown, never shrunk).
  absl::StatusOr<void*> Scratch(size_t bytes);
  // Copies on stream_ and waits for it.
  absl::Status CopyAndWait(void* dst, const void* src, size_t bytes, bool to_device);
  absl::Status Broken(const char* op) const;
  void PollLoop();

  const NcclCommunicatorOptions options_;
  const int rank_;
  const int size_;
  // Shared with the events of collectives in flight, which may outlive a call.
  std::shared_ptr<NcclWatchdog> watchdog_;
  // The events recorded after collectives, reused (shared with the collectives in flight).
  std::shared_ptr<NcclEventPool> events_;
  cudaStream_t stream_ = nullptr;
  // Recorded on the caller's stream before a collective; the own stream waits for it.
  cudaEvent_t ready_ = nullptr;
  void* scratch_ = nullptr;
  void* barrier_ = nullptr;  // one float in device memory for Barrier
  size_t scratch_bytes_ = 0;

  // Held while calling into NCCL with comm_ from the device thread (enqueueing) and from the
  // watchdog thread (async error, abort), so that ncclCommAbort never frees the communicator
  // under a call. Never held while waiting for a collective.
  mutable absl::Mutex comm_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_) = nullptr;  // null once aborted

  absl::Notification stop_;
  std::thread poller_;
};

// Connects the groups of a mesh with NCCL: the world from a unique id published under its prefix
// of `store`, each axis group split from the world (color = the group, key = the rank on the
// axis). `options` names the device and the timeouts; name and self are set per group.
class NcclGroupConnector final : public GroupConnector {
 public:
  // `store` must outlive the connector.
  NcclGroupConnector(NcclCommunicatorOptions options, Store* store)
      : options_(std::move(options)), store_(store) {}

  absl::StatusOr<std::unique_ptr<Communicator>> ConnectWorld(
      const CommunicatorGroup& world) override;
  // Errors: INVALID_ARGUMENT when `world` is not an NcclCommunicator; those of Split.
  absl::StatusOr<std::unique_ptr<Communicator>> ConnectAxis(
      Communicator& world, const CommunicatorGroup& group) override;

 private:
  const NcclCommunicatorOptions options_;
  Store* const store_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_NCCL_COMMUNICATOR_H_
