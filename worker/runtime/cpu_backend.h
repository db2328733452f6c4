// The CPU DeviceBackend: worker/compute's Eigen models and optimizers on host memory, batches
// from PrefetchToDevice, timing on the host clock (the work is done when each call returns).
#ifndef SUBSTRAX_WORKER_RUNTIME_CPU_BACKEND_H_
#define SUBSTRAX_WORKER_RUNTIME_CPU_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "substrax/v1/job.pb.h"
#include "worker/collectives/communicator.h"
#include "worker/data/prefetch.h"
#include "worker/runtime/device_backend.h"

namespace substrax {

// What either backend is built from.
struct BackendSetup {
  // A defaulted, validated spec: model, optimizer, seed, data.prefetch_size.
  const v1::JobSpec* spec = nullptr;
  int64_t num_features = 0;
  // The device: its index among its host's devices of its kind (the CUDA ordinal).
  int local_index = 0;
  // Tensor parallelism: the communicator of the model axis (null without one) and this
  // device's coordinate on it.
  Communicator* model_axis = nullptr;
  int64_t model_index = 0;
  // This device's training batches, in order.
  Producer<Batch> batches;
};

// Errors: those of Model::Create and Optimizer::Create (INVALID_ARGUMENT naming the field;
// UNIMPLEMENTED for an optimizer the CPU backend lacks), and of starting the prefetcher.
absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCpuBackend(BackendSetup setup);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_CPU_BACKEND_H_
