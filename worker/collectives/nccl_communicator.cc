// The CUDA build of NcclCommunicator (bazel build --config=cuda); nccl_communicator_stub.cc is
// the default build's.
#include "worker/collectives/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/collectives/nccl_errors.h"

namespace substrax {

// nccl_errors.h mirrors ncclResult_t so that it builds without CUDA; keep the mirror honest.
static_assert(static_cast<int>(NcclResult::kSuccess) == ncclSuccess);
static_assert(static_cast<int>(NcclResult::kUnhandledCudaError) == ncclUnhandledCudaError);
static_assert(static_cast<int>(NcclResult::kSystemError) == ncclSystemError);
static_assert(static_cast<int>(NcclResult::kInternalError) == ncclInternalError);
static_assert(static_cast<int>(NcclResult::kInvalidArgument) == ncclInvalidArgument);
static_assert(static_cast<int>(NcclResult::kInvalidUsage) == ncclInvalidUsage);
static_assert(static_cast<int>(NcclResult::kRemoteError) == ncclRemoteError);
static_assert(static_cast<int>(NcclResult::kInProgress) == ncclInProgress);

namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";

NcclCall CallOf(const char* op, const NcclCommunicatorOptions& options, int rank, int size) {
  NcclCall call;
  call.op = op;
  call.communicator = options.name;
  call.rank = rank;
  call.size = size;
  call.self = options.self;
  return call;
}

std::string Where(const NcclCall& call) {
  return absl::StrCat(call.op, " on NCCL communicator '", call.communicator, "' (rank ",
                      call.rank, " of ", call.size,
                      call.self.empty() ? "" : absl::StrCat(", ", call.self), ")");
}

// A CUDA runtime call that failed around a collective: the device is in trouble.
absl::Status CudaError(cudaError_t error, const char* what, const NcclCall& call) {
  return absl::InternalError(absl::StrCat(Where(call), ": ", what, " failed: ",
                                          cudaGetErrorName(error), ": ",
                                          cudaGetErrorString(error),
                                          "; check the GPU (nvidia-smi, dmesg)"));
}

absl::Status Translate(ncclResult_t result, ncclComm_t comm, const NcclCall& call) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  return TranslateNcclResult(static_cast<int>(result), last == nullptr ? "" : last, call);
}

ncclRedOp_t ToNcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMean:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

// Polls a non-blocking communicator until it leaves ncclInProgress (creation, split, finalize):
// the watchdog watches collectives, not these one-time steps. Aborts `comm` on failure.
absl::Status WaitReady(ncclComm_t comm, absl::Time deadline, absl::Duration poll,
                       const NcclCall& call) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm, &state);
    if (got != ncclSuccess) state = got;
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      absl::Status status = Translate(state, comm, call);
      ncclCommAbort(comm);
      return status;
    }
    if (absl::Now() >= deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat(
          Where(call), " did not complete within its timeout: not every rank took part (each "
                       "must call it), or the ranks cannot reach each other; check the other "
                       "ranks' logs and NCCL_DEBUG=WARN output"));
    }
    absl::SleepFor(poll);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclCommunicatorOptions& options, Store* store, int rank, int size) {
  const NcclCall call = CallOf("init", options, rank, size);
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(call), ": rank ", rank, " is not in 0..", size - 1));
  }
  if (const cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(call), ": CUDA device ", options.device, " cannot be used: ", cudaGetErrorName(e),
        ": ", cudaGetErrorString(e), "; check nvidia-smi and the driver"));
  }
  const absl::Time deadline = absl::Now() + options.connect_timeout;
  ncclUniqueId id;
  if (rank == 0) {
    if (absl::Status s = Translate(ncclGetUniqueId(&id), nullptr, call); !s.ok()) return s;
    if (absl::Status s = store->Set(kUniqueIdKey, std::string(id.internal, sizeof(id.internal)));
        !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(Where(call), ": publishing the unique id: ",
                                                 s.message()));
    }
  } else {
    absl::StatusOr<std::string> value = store->Get(kUniqueIdKey, options.connect_timeout);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat(Where(call), ": waiting for rank 0's unique id: ",
                                       value.status().message(),
                                       " (rank 0 has not created its communicator; check it)"));
    }
    if (value->size() != sizeof(id.internal)) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(call), ": the unique id in the store has ", value->size(), " bytes, not ",
          sizeof(id.internal), ": another job attempt or program wrote the same key"));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; WaitReady and the watchdog do the waiting
  ncclComm_t comm = nullptr;
  const ncclResult_t init = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (init != ncclSuccess && init != ncclInProgress) {
    absl::Status status = Translate(init, comm, call);
    if (comm != nullptr) ncclCommAbort(comm);
    return status;
  }
  if (absl::Status s = WaitReady(comm, deadline, options.poll_interval, call); !s.ok()) return s;

  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    ncclCommAbort(comm);
    return CudaError(e, "creating the communicator's stream", call);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(options, rank, size, comm, stream));
}

NcclCommunicator::NcclCommunicator(const NcclCommunicatorOptions& options, int rank, int size,
                                   ncclComm_t comm, cudaStream_t stream)
    : options_(options),
      rank_(rank),
      size_(size),
      events_(std::make_shared<NcclEventPool>()),
      stream_(stream),
      comm_(comm) {
  NcclWatchdog::Options w;
  w.communicator = options_.name;
  w.rank = rank_;
  w.size = size_;
  w.self = options_.self;
  w.async_error = [this] {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return static_cast<int>(ncclSuccess);
    ncclResult_t state = ncclSuccess;
    const ncclResult_t got = ncclCommGetAsyncError(comm_, &state);
    return static_cast<int>(got != ncclSuccess ? got : state);
  };
  w.last_error = [this] {
    absl::MutexLock lock(&comm_mu_);
    const char* last = ncclGetLastError(comm_);
    return std::string(last == nullptr ? "" : last);
  };
  w.abort = [this] {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return;
    ncclCommAbort(comm_);
    comm_ = nullptr;
  };
  watchdog_ = std::make_shared<NcclWatchdog>(std::move(w));
  poller_ = std::thread([this] { PollLoop(); });
}

void NcclCommunicator::PollLoop() {
  // CUDA calls from this thread (event queries) act on the communicator's device.
  cudaSetDevice(options_.device);
  while (!stop_.WaitForNotificationWithTimeout(options_.poll_interval)) {
    watchdog_->Poll().IgnoreError();  // the failed collective reports it, through Wait
  }
}

NcclCommunicator::~NcclCommunicator() {
  stop_.Notify();
  if (poller_.joinable()) poller_.join();
  cudaSetDevice(options_.device);
  ncclComm_t comm = nullptr;
  {
    absl::MutexLock lock(&comm_mu_);
    comm = comm_;
    comm_ = nullptr;
  }
  if (comm != nullptr) {
    // Finalize flushes outstanding work; if that fails or hangs, abort instead of waiting.
    const NcclCall call = CallOf("finalize", options_, rank_, size_);
    const ncclResult_t r = ncclCommFinalize(comm);
    if ((r == ncclSuccess || r == ncclInProgress) &&
        WaitReady(comm, absl::Now() + options_.timeout, options_.poll_interval, call).ok()) {
      ncclCommDestroy(comm);
    } else if (r != ncclSuccess && r != ncclInProgress) {
      ncclCommAbort(comm);
    }  // else WaitReady aborted it
  }
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (barrier_ != nullptr) cudaFree(barrier_);
  if (ready_ != nullptr) cudaEventDestroy(ready_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclCommunicator::PeerDied(const std::string& who) { watchdog_->PeerDied(who); }

absl::Status NcclCommunicator::Broken(const char* op) const {
  return absl::FailedPreconditionError(absl::StrCat(
      Where(CallOf(op, options_, rank_, size_)),
      ": the communicator was aborted after an earlier failure and cannot be used again (",
      watchdog_->aborted().message(), ")"));
}

absl::Status NcclCommunicator::WaitUntilIdle(std::string op, absl::Time deadline) {
  // Non-blocking: the communicator's state is ncclInProgress until NCCL has finished the call
  // (a collective is then on its stream). An error state is left to the watchdog's async-error
  // check, which aborts and fails this op.
  absl::StatusOr<NcclWatchdog::OpId> id = watchdog_->Register(std::move(op), deadline, [this] {
    absl::MutexLock lock(&comm_mu_);
    ncclResult_t state = ncclInProgress;
    return comm_ != nullptr && ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
           state == ncclSuccess;
  });
  if (!id.ok()) return id.status();
  return watchdog_->Wait(*id);
}

namespace {

ncclDataType_t ToNccl(DataType type) {
  return type == DataType::kFloat64 ? ncclFloat64 : ncclFloat32;
}

}  // namespace

// The CUDA events recorded after collectives, reused: a step records one per group, and creating
// an event per collective would be a host allocation (and a driver call) every step. An event
// goes back only once its collective has been collected, so it is never re-recorded while a
// query of its previous record is still wanted; a cudaStreamWaitEvent issued on it earlier is
// unaffected by a later record (CUDA captures the record at the time of the wait).
class NcclEventPool {
 public:
  ~NcclEventPool() {
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
  }
  cudaError_t Get(cudaEvent_t* event) {
    {
      absl::MutexLock lock(&mu_);
      if (!free_.empty()) {
        *event = free_.back();
        free_.pop_back();
        return cudaSuccess;
      }
    }
    return cudaEventCreateWithFlags(event, cudaEventDisableTiming);
  }
  void Put(cudaEvent_t event) {
    absl::MutexLock lock(&mu_);
    free_.push_back(event);
  }

 private:
  absl::Mutex mu_;
  std::vector<cudaEvent_t> free_ ABSL_GUARDED_BY(mu_);
};

namespace {

// A collective queued on a stream, resolved by the communicator's watchdog. Holds the CUDA event
// recorded after it; waits for the outcome before it goes (an op nobody waited for would stay in
// the watchdog), then gives the event back to the pool.
class NcclPending final : public CollectiveEvent::Pending {
 public:
  // `start`: the event recorded just before the collective, or null.
  NcclPending(std::shared_ptr<NcclWatchdog> watchdog, NcclWatchdog::OpId id, cudaEvent_t event,
              cudaEvent_t start, std::shared_ptr<NcclEventPool> events)
      : watchdog_(std::move(watchdog)),
        id_(id),
        event_(event),
        start_(start),
        events_(std::move(events)) {}
  ~NcclPending() override {
    // A failed collective's events may never complete (the device failed): destroy them.
    const bool ok = Await().ok();
    for (cudaEvent_t e : {event_, start_}) {
      if (e == nullptr) continue;
      if (ok) {
        events_->Put(e);
      } else {
        cudaEventDestroy(e);
      }
    }
  }

  bool IsReady() override {
    absl::MutexLock lock(&mu_);
    return collected_ || watchdog_->Resolved(id_);
  }

  absl::Status Await() override {
    absl::MutexLock lock(&mu_);
    if (!collected_) {
      status_ = watchdog_->Wait(id_);
      collected_ = true;
    }
    return status_;
  }

 private:
  const std::shared_ptr<NcclWatchdog> watchdog_;
  const NcclWatchdog::OpId id_;
  const cudaEvent_t event_;
  const cudaEvent_t start_;
  const std::shared_ptr<NcclEventPool> events_;
  absl::Mutex mu_;
  bool collected_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Whether the stream has passed `event` (`what`: "to start", "to finish", for messages). Only
// cudaErrorNotReady means "not yet"; any other error is the device failing.
NcclWatchdog::DoneFn EventDone(cudaEvent_t event, const char* what) {
  return [event, what]() -> absl::StatusOr<bool> {
    const cudaError_t state = cudaEventQuery(event);
    if (state == cudaSuccess) return true;
    if (state == cudaErrorNotReady) return false;
    return absl::InternalError(absl::StrCat("waiting for the collective on its stream ", what,
                                            ": ", cudaGetErrorName(state), ": ",
                                            cudaGetErrorString(state)));
  };
}

}  // namespace

template <typename Enqueue>
CollectiveEvent NcclCommunicator::Run(const char* op, ExecutionContext context,
                                      Enqueue&& enqueue) {
  const NcclCall call = CallOf(op, options_, rank_, size_);
  // With a stream context the collective runs on the communicator's own stream, ordered by
  // events: after the work queued on the context's stream so far, and before the work queued
  // there later (cudaStreamWaitEvent). Neither stream, nor the host, waits for the other
  // otherwise, so compute queued meanwhile on other streams overlaps the collective. An event
  // recorded just before the collective tells the watchdog when it could start: the host may be
  // several steps ahead, and the queued compute must not count against its timeout.
  const bool ordered = context.stream != nullptr && context.stream != stream_;
  cudaEvent_t start = nullptr;
  if (ordered) {
    cudaError_t e = ready_ == nullptr ? cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming)
                                      : cudaSuccess;
    if (e == cudaSuccess) e = cudaEventRecord(ready_, context.stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(stream_, ready_, 0);
    if (e == cudaSuccess) e = events_->Get(&start);
    if (e == cudaSuccess) e = cudaEventRecord(start, stream_);
    if (e != cudaSuccess) {
      if (start != nullptr) cudaEventDestroy(start);
      return CollectiveEvent::Done(
          CudaError(e, "ordering the collective after the work on the caller's stream", call));
    }
  }
  // Gives `start` back on the paths that register nothing.
  auto fail = [&](absl::Status status) {
    if (start != nullptr) events_->Put(start);
    return CollectiveEvent::Done(std::move(status));
  };
  if (options_.test_stall_after_start > absl::ZeroDuration()) {
    const cudaError_t e = cudaLaunchHostFunc(
        stream_, [](void* d) { absl::SleepFor(*static_cast<const absl::Duration*>(d)); },
        const_cast<absl::Duration*>(&options_.test_stall_after_start));
    if (e != cudaSuccess) return fail(CudaError(e, "queueing the test stall", call));
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  ncclResult_t result = ncclSuccess;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return fail(Broken(op));
    result = enqueue(comm_, stream_);
    if (result != ncclSuccess && result != ncclInProgress) {
      return fail(Translate(result, comm_, call));
    }
  }
  if (result == ncclInProgress) {
    if (absl::Status s = WaitUntilIdle(absl::StrCat(op, " (enqueue)"), deadline); !s.ok()) {
      return fail(s);
    }
  }
  cudaEvent_t event = nullptr;
  cudaError_t e = events_->Get(&event);
  if (e == cudaSuccess) e = cudaEventRecord(event, stream_);
  if (e == cudaSuccess && ordered) e = cudaStreamWaitEvent(context.stream, event, 0);
  if (e != cudaSuccess) {
    if (event != nullptr) cudaEventDestroy(event);
    return fail(CudaError(e, "recording an event after the collective", call));
  }
  absl::StatusOr<NcclWatchdog::OpId> id =
      ordered ? watchdog_->RegisterQueued(op, options_.timeout, EventDone(start, "to start"),
                                          EventDone(event, "to finish"))
              : watchdog_->Register(op, deadline, EventDone(event, "to finish"));
  if (!id.ok()) {
    cudaEventDestroy(event);
    return fail(id.status());
  }
  return CollectiveEvent(std::make_shared<NcclPending>(watchdog_, *id, event, start, events_));
}

bool NcclCommunicator::OnDevice(const void* ptr) const {
  cudaPointerAttributes attributes;
  if (cudaPointerGetAttributes(&attributes, ptr) != cudaSuccess) {
    cudaGetLastError();  // clear it: an unknown pointer is host memory, not a failure
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

absl::StatusOr<void*> NcclCommunicator::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes_ && scratch_ != nullptr) return scratch_;
  if (scratch_ != nullptr) cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  if (const cudaError_t e = cudaMalloc(&scratch_, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
    scratch_ = nullptr;
    return CudaError(e, absl::StrCat("cudaMalloc of ", bytes, " staging bytes").c_str(),
                     CallOf("stage", options_, rank_, size_));
  }
  scratch_bytes_ = bytes;
  return scratch_;
}

absl::Status NcclCommunicator::CopyAndWait(void* dst, const void* src, size_t bytes,
                                           bool to_device) {
  if (bytes == 0) return absl::OkStatus();
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes,
                                  to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                                  stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) {
    return CudaError(e, to_device ? "staging the input to the device" : "copying the result back",
                     CallOf("stage", options_, rank_, size_));
  }
  return absl::OkStatus();
}

// Host buffers: copy in, collective on stream_, copy out. One extra round trip over PCIe each
// way; GPU code passes device memory instead. Staged calls wait, so the scratch is never shared
// by two collectives in flight.
template <typename Fn>
absl::Status NcclCommunicator::Staged(const void* input, size_t in_bytes, void* output,
                                      size_t out_bytes, Fn&& fn) {
  absl::StatusOr<void*> scratch = Scratch(in_bytes + out_bytes);
  if (!scratch.ok()) return scratch.status();
  char* in = static_cast<char*>(*scratch);
  char* out = in + in_bytes;
  if (absl::Status s = CopyAndWait(in, input, in_bytes, true); !s.ok()) return s;
  if (absl::Status s = fn(in, out).Await(); !s.ok()) return s;
  return CopyAndWait(output, out, out_bytes, false);
}

CollectiveEvent NcclCommunicator::DoAllReduce(void* data, DataType type, size_t count,
                                              ReduceOp op, ExecutionContext context) {
  auto enqueue = [&](const void* in, void* out, ExecutionContext ctx) {
    return Run("all_reduce", ctx, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(in, out, count, ToNccl(type), ToNcclOp(op), comm, stream);
    });
  };
  if (OnDevice(data)) return enqueue(data, data, context);
  const size_t bytes = count * DataTypeSize(type);
  return CollectiveEvent::Done(Staged(data, bytes, data, bytes, [&](void* in, void* out) {
    return enqueue(in, out, ExecutionContext());
  }));
}

CollectiveEvent NcclCommunicator::DoAllGather(const void* input, void* output, DataType type,
                                              size_t count, ExecutionContext context) {
  auto enqueue = [&](const void* in, void* out, ExecutionContext ctx) {
    return Run("all_gather", ctx, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(in, out, count, ToNccl(type), comm, stream);
    });
  };
  if (OnDevice(input) && OnDevice(output)) return enqueue(input, output, context);
  const size_t bytes = count * DataTypeSize(type);
  return CollectiveEvent::Done(
      Staged(input, bytes, output, bytes * size_,
             [&](void* in, void* out) { return enqueue(in, out, ExecutionContext()); }));
}

CollectiveEvent NcclCommunicator::DoBroadcast(void* data, DataType type, size_t count, int root,
                                              ExecutionContext context) {
  auto enqueue = [&](const void* in, void* out, ExecutionContext ctx) {
    return Run("broadcast", ctx, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(in, out, count, ToNccl(type), root, comm, stream);
    });
  };
  if (OnDevice(data)) return enqueue(data, data, context);
  const size_t bytes = count * DataTypeSize(type);
  return CollectiveEvent::Done(Staged(data, bytes, data, bytes, [&](void* in, void* out) {
    return enqueue(in, out, ExecutionContext());
  }));
}

CollectiveEvent NcclCommunicator::DoReduceScatter(const void* input, void* output, DataType type,
                                                  size_t count, ReduceOp op,
                                                  ExecutionContext context) {
  auto enqueue = [&](const void* in, void* out, ExecutionContext ctx) {
    return Run("reduce_scatter", ctx, [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(in, out, count, ToNccl(type), ToNcclOp(op), comm, stream);
    });
  };
  if (OnDevice(input) && OnDevice(output)) return enqueue(input, output, context);
  const size_t bytes = count * DataTypeSize(type);
  return CollectiveEvent::Done(
      Staged(input, bytes * size_, output, bytes,
             [&](void* in, void* out) { return enqueue(in, out, ExecutionContext()); }));
}

// One group (ncclGroupStart/End): NCCL fuses the buckets' launches and the watchdog watches one
// event for them all. Host buffers are staged one by one, as single all-reduces are.
CollectiveEvent NcclCommunicator::DoAllReduceGroup(absl::Span<const ReduceBuffer> buffers,
                                                   DataType type, ReduceOp op,
                                                   ExecutionContext context) {
  for (const ReduceBuffer& b : buffers) {
    if (!OnDevice(b.data)) return Communicator::DoAllReduceGroup(buffers, type, op, context);
  }
  return Run("all_reduce (group)", context, [&](ncclComm_t comm, cudaStream_t stream) {
    ncclResult_t result = ncclGroupStart();
    if (result != ncclSuccess) return result;
    for (const ReduceBuffer& b : buffers) {
      result = ncclAllReduce(b.data, b.data, b.count, ToNccl(type), ToNcclOp(op), comm, stream);
      if (result != ncclSuccess && result != ncclInProgress) break;
    }
    // The group is closed even after a failed call; the first failure is what is reported.
    const ncclResult_t end = ncclGroupEnd();
    return result != ncclSuccess && result != ncclInProgress ? result : end;
  });
}

CollectiveEvent NcclCommunicator::DoBarrier(ExecutionContext context) {
  if (barrier_ == nullptr) {
    if (const cudaError_t e = cudaMalloc(&barrier_, sizeof(float)); e != cudaSuccess) {
      barrier_ = nullptr;
      return CollectiveEvent::Done(CudaError(e, "cudaMalloc of the barrier's value",
                                             CallOf("barrier", options_, rank_, size_)));
    }
  }
  return Run("barrier", context, [&](ncclComm_t comm, cudaStream_t stream) {
    return ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm, stream);
  });
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Split(int color, int key,
                                                                          std::string name) {
  NcclCommunicatorOptions options = options_;
  options.name = std::move(name);
  const NcclCall call = CallOf("split", options_, rank_, size_);
  if (color < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(call), ": color ", color, " is negative; every rank must join a group (>= 0)"));
  }
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  {
    absl::MutexLock lock(&comm_mu_);
    if (comm_ == nullptr) return Broken("split");
    const ncclResult_t r = ncclCommSplit(comm_, color, key, &child, &config);
    if (r != ncclSuccess && r != ncclInProgress) return Translate(r, comm_, call);
  }
  if (child == nullptr) {
    return absl::InternalError(absl::StrCat(Where(call), ": ncclCommSplit returned no communicator"));
  }
  if (absl::Status s = WaitReady(child, deadline, options_.poll_interval, call); !s.ok()) {
    return s;
  }
  // The parent is in progress too until the split is done; collectives on it must wait.
  if (absl::Status s = WaitUntilIdle("split", deadline); !s.ok()) {
    ncclCommAbort(child);
    return s;
  }
  int rank = 0, size = 0;
  if (absl::Status s = Translate(ncclCommUserRank(child, &rank), child, call); !s.ok()) return s;
  if (absl::Status s = Translate(ncclCommCount(child, &size), child, call); !s.ok()) return s;
  cudaStream_t stream = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
      e != cudaSuccess) {
    ncclCommAbort(child);
    return CudaError(e, "creating the split communicator's stream", call);
  }
  return std::unique_ptr<NcclCommunicator>(new NcclCommunicator(options, rank, size, child, stream));
}

}  // namespace substrax
