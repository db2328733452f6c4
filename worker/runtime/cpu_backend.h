// The CPU DeviceBackend: worker/compute's Eigen models and optimizers on host memory, batches
// from PrefetchToDevice, timing on the host clock (the work is done when each call returns).
#ifndef SUBSTRAX_WORKER_RUNTIME_CPU_BACKEND_H_
#define SUBSTRAX_WORKER_RUNTIME_CPU_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "substrax/v1/job.pb.h"
#include "worker/runtime/device_backend.h"

namespace substrax {

// The sharded update (sharded_update.h) of the CPU devices along the data axis of one process:
// made once per process for `size` devices and handed to each of those devices' CreateCpuBackend
// with its rank on the axis. Every device builds the same model with the same spec
// and seed (a mesh with a data axis alone), keeps its own copy of the parameters, updates its
// block of them (with its optimizer state, kept up to date in that block only) and copies the
// others' blocks from them. The group keeps every device's state alive while any device may
// still read it.
class ShardedUpdateGroup;
std::shared_ptr<ShardedUpdateGroup> MakeShardedUpdateGroup(int size);

// The sharded update of one device: its process's group and the device's rank in it (its
// coordinate on the data axis).
struct CpuShardedUpdate {
  std::shared_ptr<ShardedUpdateGroup> group;
  int rank = 0;
};

// `sharded`: the device's part in a sharded update (a null group: the device updates all of its
// parameters itself); refused with a model axis. With one, the backend brings its own
// GradientReducer (DeviceBackend::OwnGradientReducer, sharded_update.h).
// Errors: those of Model::Create and Optimizer::Create (INVALID_ARGUMENT naming the field;
// UNIMPLEMENTED for an optimizer the CPU backend lacks), and of starting the prefetcher;
// INVALID_ARGUMENT for a sharded update with a model axis.
absl::StatusOr<std::unique_ptr<DeviceBackend>> CreateCpuBackend(BackendSetup setup,
                                                                CpuShardedUpdate sharded = {});

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_CPU_BACKEND_H_
