// PrefetchToDevice on a GPU: worker/data's Prefetcher whose items are batches already in device
// memory. A background thread takes each host Batch from the producer, copies it into pinned host
// memory (cudaHostAlloc) and queues the host-to-device copy on a copy stream of its own, recording
// an event; Next() makes the device's compute stream wait for that event (cudaStreamWaitEvent, on
// the GPU, not the host). So the copy of batch k+1 overlaps the compute of batch k.
//
//   SUBSTRAX_ASSIGN_OR_RETURN(auto batches, CudaPrefetcher::Create(device, producer, 2));
//   while (true) {
//     SUBSTRAX_ASSIGN_OR_RETURN(std::optional<DeviceBatchView> batch, batches->Next());
//     if (!batch) break;
//     SUBSTRAX_RETURN_IF_ERROR(model->LossAndGradients(params, *batch, &grads, metrics));
//   }
//
// Memory: size + 2 slots (the `size` ready batches, the one being copied, the one in use), each
// growing to the largest batch seen. A slot is reused only after the compute stream has passed the
// work queued while it was in use (an event recorded at the next Next()).
//
// Thread-safety: Next() from the device thread that owns the CudaDevice only. Without
// --config=cuda, Create returns UNIMPLEMENTED.
#ifndef SUBSTRAX_WORKER_DATA_CUDA_PREFETCH_H_
#define SUBSTRAX_WORKER_DATA_CUDA_PREFETCH_H_

#include <memory>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/data/prefetch.h"
#include "worker/gpu/cuda_device.h"
#include "worker/tensor/tensor.h"

namespace substrax {

class CudaPrefetcher {
 public:
  // Starts prefetching from `producer` onto `device` (which must outlive the prefetcher), keeping
  // up to `size` batches ready on the device.
  // Errors: UNIMPLEMENTED without --config=cuda; INVALID_ARGUMENT when size < 1 or the producer
  // is empty; CUDA errors (stream or event creation).
  static absl::StatusOr<std::unique_ptr<CudaPrefetcher>> Create(const CudaDevice* device,
                                                                Producer<Batch> producer,
                                                                int size = 2);
  // Stops the thread (as Prefetcher's destructor) and waits for copies in flight.
  ~CudaPrefetcher();
  CudaPrefetcher(const CudaPrefetcher&) = delete;
  CudaPrefetcher& operator=(const CudaPrefetcher&) = delete;

  // The next batch on the device, ordered before any work queued on device->stream() after this
  // call; valid until the next call. std::nullopt after the last batch.
  // Errors: the producer's (once, as Prefetcher::Next); INVALID_ARGUMENT for a batch whose inputs
  // are not [batch, features] or whose targets do not have one row per example; CUDA errors
  // (RESOURCE_EXHAUSTED when pinned or device memory runs out).
  absl::StatusOr<std::optional<DeviceBatchView>> Next();

 private:
  struct Impl;
  explicit CudaPrefetcher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DATA_CUDA_PREFETCH_H_
