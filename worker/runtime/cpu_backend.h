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

// The sharded update (DeviceBackend::shards_update) of the CPU devices along the data axis of
// one process: made once by the trainer for `size` devices and handed to each of those devices'
// BackendSetup with its rank on the axis. Every device builds the same model with the same spec
// and seed (a mesh with a data axis alone), keeps its own copy of the parameters, updates its
// block of them (with its optimizer state, kept up to date in that block only) and copies the
// others' blocks from them. The group keeps every device's state alive while any device may
// still read it.
class ShardedUpdateGroup;
std::shared_ptr<ShardedUpdateGroup> MakeShardedUpdateGroup(int size);

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
  // The CPU backend: the sharded update's group and this device's rank in it (null: the device
  // updates all of its parameters itself). Refused with a model axis.
  std::shared_ptr<ShardedUpdateGroup> sharded_update;
  int sharded_update_rank = 0;
};

// Errors: those of Model::Create and Optimizer::Create (INVALID_ARGUMENT naming the field;
// UNIMPLEMENTED for an optimizer the CPU backend lacks), and of starting the prefetcher.
absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCpuBackend(BackendSetup setup);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_CPU_BACKEND_H_
