#include "worker/data/cuda_prefetch.h"

#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker/gpu/cuda_status.h"

namespace substrax {
namespace {

// One batch's memory: pinned host staging, device buffers, and the events that order its reuse.
struct Slot {
  float* host = nullptr;  // pinned: inputs, then targets
  int64_t host_capacity = 0;
  DeviceBuffer device;    // inputs, then targets
  cudaEvent_t copied = nullptr;    // the host-to-device copy finished (copy stream)
  cudaEvent_t consumed = nullptr;  // the compute stream passed the work that used this batch
};

// What the background thread hands to Next(): which slot holds the batch, and its view.
struct Ready {
  int slot = 0;
  DeviceBatchView view;
};

}  // namespace

struct CudaPrefetcher::Impl {
  const CudaDevice* device = nullptr;
  Producer<Batch> producer;
  cudaStream_t copy_stream = nullptr;
  std::vector<Slot> slots;
  int next_slot = 0;           // the background thread's next slot (its own)
  int in_use = -1;             // the slot whose batch Next() returned last (the consumer's)
  std::unique_ptr<Prefetcher<Ready>> prefetcher;

  // Runs on the prefetcher's thread.
  absl::StatusOr<std::optional<Ready>> Produce() {
    SUBSTRAX_ASSIGN_OR_RETURN(std::optional<Batch> batch, producer());
    if (!batch) return std::optional<Ready>();
    const Tensor& x = batch->inputs;
    const Tensor& t = batch->targets;
    if (x.rank() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch.inputs has shape ", x.ShapeString(), ", expected (batch, features)"));
    }
    const int64_t n = x.dim(0);
    if (t.rank() < 1 || t.rank() > 2 || t.dim(0) != n) {
      return absl::InvalidArgumentError(absl::StrCat("batch.targets has shape ", t.ShapeString(),
                                                     ", expected (", n, ",) or (", n,
                                                     ", outputs)"));
    }
    const int index = next_slot;
    next_slot = (next_slot + 1) % static_cast<int>(slots.size());
    Slot& slot = slots[index];
    SUBSTRAX_RETURN_IF_ERROR(device->MakeCurrent());  // the current device is per thread
    const int64_t total = x.size() + t.size();
    // The previous copy out of this slot's pinned memory must be done before it is overwritten.
    SUBSTRAX_RETURN_IF_ERROR(
        CudaStatus(cudaEventSynchronize(slot.copied), "cudaEventSynchronize", device->name()));
    if (total > slot.host_capacity) {
      // Growing: the compute stream must be done with the old device buffer before it is freed.
      SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(slot.consumed),
                                          "cudaEventSynchronize", device->name()));
      if (slot.host != nullptr) cudaFreeHost(slot.host);
      slot.host = nullptr;
      slot.host_capacity = 0;
      void* host = nullptr;
      SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaHostAlloc(&host, total * sizeof(float), 0),
                                          absl::StrCat("cudaHostAlloc of ", total, " floats"),
                                          device->name()));
      slot.host = static_cast<float*>(host);
      SUBSTRAX_ASSIGN_OR_RETURN(slot.device, DeviceBuffer::Allocate(*device, total));
      slot.host_capacity = total;
    }
    std::memcpy(slot.host, x.data(), x.size() * sizeof(float));
    std::memcpy(slot.host + x.size(), t.data(), t.size() * sizeof(float));
    // The copy overwrites the device buffer only after the compute stream released it.
    SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaStreamWaitEvent(copy_stream, slot.consumed, 0),
                                        "cudaStreamWaitEvent", device->name()));
    if (total > 0) {
      SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(slot.device.data(), slot.host, total * sizeof(float),
                          cudaMemcpyHostToDevice, copy_stream),
          "cudaMemcpyAsync host to device (prefetch)", device->name()));
    }
    SUBSTRAX_RETURN_IF_ERROR(
        CudaStatus(cudaEventRecord(slot.copied, copy_stream), "cudaEventRecord", device->name()));
    Ready ready;
    ready.slot = index;
    ready.view.inputs = slot.device.data();
    ready.view.targets = slot.device.data() + x.size();
    ready.view.size = n;
    ready.view.num_features = x.dim(1);
    ready.view.target_width = t.rank() == 1 ? 1 : t.dim(1);
    return std::optional<Ready>(ready);
  }
};

CudaPrefetcher::CudaPrefetcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaPrefetcher::~CudaPrefetcher() {
  impl_->prefetcher.reset();  // joins the thread first: nothing queues copies after this
  cudaSetDevice(impl_->device->ordinal());
  if (impl_->copy_stream != nullptr) cudaStreamSynchronize(impl_->copy_stream);
  // The compute stream may still read the last batch.
  cudaStreamSynchronize(impl_->device->stream());
  for (Slot& slot : impl_->slots) {
    if (slot.host != nullptr) cudaFreeHost(slot.host);
    if (slot.copied != nullptr) cudaEventDestroy(slot.copied);
    if (slot.consumed != nullptr) cudaEventDestroy(slot.consumed);
  }
  if (impl_->copy_stream != nullptr) cudaStreamDestroy(impl_->copy_stream);
}

absl::StatusOr<std::unique_ptr<CudaPrefetcher>> CudaPrefetcher::Create(const CudaDevice* device,
                                                                       Producer<Batch> producer,
                                                                       int size) {
  if (device == nullptr) return absl::InvalidArgumentError("CudaPrefetcher needs a device");
  if (size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("prefetch size must be >= 1 (batches kept ready), got ", size));
  }
  if (!producer) return absl::InvalidArgumentError("prefetch needs a producer, got none");
  auto impl = std::make_unique<Impl>();
  impl->device = device;
  impl->producer = std::move(producer);
  std::unique_ptr<CudaPrefetcher> prefetcher(new CudaPrefetcher(std::move(impl)));
  Impl& p = *prefetcher->impl_;
  SUBSTRAX_RETURN_IF_ERROR(device->MakeCurrent());
  SUBSTRAX_RETURN_IF_ERROR(
      CudaStatus(cudaStreamCreateWithFlags(&p.copy_stream, cudaStreamNonBlocking),
                 "cudaStreamCreate (prefetch copy stream)", device->name()));
  p.slots.resize(size + 2);
  for (Slot& slot : p.slots) {
    SUBSTRAX_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming),
                   "cudaEventCreate", device->name()));
    SUBSTRAX_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&slot.consumed, cudaEventDisableTiming),
                   "cudaEventCreate", device->name()));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(p.prefetcher,
                            PrefetchToDevice<Ready>([&p] { return p.Produce(); }, size));
  return prefetcher;
}

absl::StatusOr<std::optional<DeviceBatchView>> CudaPrefetcher::Next() {
  Impl& p = *impl_;
  const CudaDevice& device = *p.device;
  SUBSTRAX_RETURN_IF_ERROR(device.MakeCurrent());
  // Everything the caller queued since the last Next() used the previous batch: once the compute
  // stream passes this point, its slot may be refilled. Recorded before taking the next item, so
  // the producer (which may reuse that slot only after this item leaves the queue) sees it.
  if (p.in_use >= 0) {
    SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(p.slots[p.in_use].consumed, device.stream()),
                                        "cudaEventRecord", device.name()));
    p.in_use = -1;
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::optional<Ready> ready, p.prefetcher->Next());
  if (!ready) return std::optional<DeviceBatchView>();
  SUBSTRAX_RETURN_IF_ERROR(
      CudaStatus(cudaStreamWaitEvent(device.stream(), p.slots[ready->slot].copied, 0),
                 "cudaStreamWaitEvent", device.name()));
  p.in_use = ready->slot;
  return std::optional<DeviceBatchView>(ready->view);
}

}  // namespace substrax
