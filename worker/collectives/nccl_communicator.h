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
// Buffers: the Communicator interface takes host spans. Those methods stage through device
// memory (copy in, collective, copy out on this communicator's stream): correct but slower,
// for tests and small values. GPU code calls the ...Device methods with device pointers. Every
// method returns when the collective has completed on the device (or failed).
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
#include "worker/collectives/nccl_watchdog.h"
#include "worker/collectives/store.h"

// The same opaque handle types nccl.h and cuda_runtime.h declare, so that this header needs
// neither (it is also compiled without CUDA).
typedef struct ncclComm* ncclComm_t;
typedef struct CUstream_st* cudaStream_t;
typedef struct CUevent_st* cudaEvent_t;

namespace substrax {

struct NcclCommunicatorOptions {
  // Name used in messages ("world", "axis 'data' group 0").
  std::string name = "world";
  // CUDA device ordinal this rank runs on (cudaSetDevice).
  int device = 0;
  // Who this rank is, for messages: "device 2 (cuda:2 on host-b)"; may be empty.
  std::string self;
  // Every collective must finish within this time, else the communicator is aborted and the
  // collective fails with DEADLINE_EXCEEDED.
  absl::Duration timeout = absl::Seconds(30);
  // How long reading the unique id and connecting every rank may take at creation (and split).
  absl::Duration connect_timeout = absl::Seconds(60);
  // How often the watchdog thread looks at the collectives in flight.
  absl::Duration poll_interval = absl::Milliseconds(1);
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

  // The coordinator or the peer monitor says `who` died ("process 2 (worker w-2, host b)
  // died: ..."): the watchdog aborts this communicator at once, and a collective in flight
  // fails with UNAVAILABLE naming `who`. Forward it to every communicator of the process
  // (each split communicator has its own watchdog).
  void PeerDied(std::string who);

  // The stream the host-span methods and Barrier use (created for this communicator).
  cudaStream_t stream() const { return stream_; }

  // Device-pointer collectives, enqueued on `stream` (any stream of this device; pass
  // stream() for this communicator's), returning once complete. Counts are elements. Errors:
  // as Communicator (communicator.h), plus INTERNAL for a CUDA failure (the message says to
  // check the GPU).
  absl::Status AllReduceDevice(float* data, size_t count, ReduceOp op, cudaStream_t stream);
  absl::Status AllReduceDevice(double* data, size_t count, ReduceOp op, cudaStream_t stream);
  // `output` holds count * size() elements: the inputs of ranks 0..size-1 concatenated.
  absl::Status AllGatherDevice(const float* input, float* output, size_t count,
                               cudaStream_t stream);
  absl::Status AllGatherDevice(const double* input, double* output, size_t count,
                               cudaStream_t stream);
  absl::Status BroadcastDevice(float* data, size_t count, int root, cudaStream_t stream);
  // `input` holds count * size() elements; `output` gets block rank() of their reduction.
  absl::Status ReduceScatterDevice(const float* input, float* output, size_t count, ReduceOp op,
                                   cudaStream_t stream);

 protected:
  absl::Status DoAllReduce(absl::Span<float> data, ReduceOp op) override;
  absl::Status DoAllReduce(absl::Span<double> data, ReduceOp op) override;
  absl::Status DoAllGather(absl::Span<const float> input, absl::Span<float> output) override;
  absl::Status DoAllGather(absl::Span<const double> input, absl::Span<double> output) override;
  absl::Status DoBroadcast(absl::Span<float> data, int root) override;
  absl::Status DoReduceScatter(absl::Span<const float> input, absl::Span<float> output,
                               ReduceOp op) override;
  // An all-reduce of one element on stream().
  absl::Status DoBarrier() override;

 private:
  NcclCommunicator(const NcclCommunicatorOptions& options, int rank, int size, ncclComm_t comm,
                   cudaStream_t stream, cudaEvent_t event);

  // Enqueues one collective with `enqueue(comm)` (an ncclResult_t value) under comm_mu_, then
  // waits for it through the watchdog: first until NCCL has enqueued it (a non-blocking
  // communicator may answer ncclInProgress), then until an event recorded after it on `stream`
  // has completed.
  template <typename Enqueue>
  absl::Status Run(const char* op, cudaStream_t stream, Enqueue&& enqueue);
  // Waits (through the watchdog) until this non-blocking communicator has left ncclInProgress.
  absl::Status WaitUntilIdle(std::string op, absl::Time deadline);
  template <typename T>
  absl::Status AllReduceDeviceImpl(T* data, size_t count, ReduceOp op, cudaStream_t stream);
  template <typename T>
  absl::Status AllGatherDeviceImpl(const T* input, T* output, size_t count, cudaStream_t stream);
  template <typename T>
  absl::Status StagedAllReduce(absl::Span<T> data, ReduceOp op);
  template <typename T>
  absl::Status StagedAllGather(absl::Span<const T> input, absl::Span<T> output);
  // Device scratch of at least `bytes` (grown, never shrunk).
  absl::StatusOr<void*> Scratch(size_t bytes);
  // Copies on stream_ and waits for it.
  absl::Status CopyAndWait(void* dst, const void* src, size_t bytes, bool to_device);
  absl::Status Broken(const char* op) const;
  void PollLoop();

  const NcclCommunicatorOptions options_;
  const int rank_;
  const int size_;
  std::unique_ptr<NcclWatchdog> watchdog_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;

  // Held while calling into NCCL with comm_ from the device thread (enqueueing) and from the
  // watchdog thread (async error, abort), so that ncclCommAbort never frees the communicator
  // under a call. Never held while waiting for a collective.
  mutable absl::Mutex comm_mu_;
  ncclComm_t comm_ ABSL_GUARDED_BY(comm_mu_) = nullptr;  // null once aborted

  absl::Notification stop_;
  std::thread poller_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_NCCL_COMMUNICATOR_H_
