// The sharded update (ZeRO stage 1 inside a process; spec.gradients.shard_update): the devices
// along the data axis each update one block of the parameters and take the others' blocks from
// them. A GradientReducer a backend brings (DeviceBackend::OwnGradientReducer): the step loop
// runs it as any other and does not know what it does. A step:
//   Reduce: the gradient buffer, padded to one block of whole cache lines per device, is
//     reduce-scattered over the data axis (each device then holds the mean of its block);
//   Apply: BlockUpdate::ApplyGradientBlock for this device's block, a barrier of the axis (every
//     block is updated), BlockUpdate::FetchPeerBlocks (the others' blocks from their devices).
// Every value is computed as without sharding (the optimizer's kernels are elementwise): the
// results are equal bit for bit. The CPU backend implements BlockUpdate over its
// ShardedUpdateGroup (cpu_backend.h); tests implement it with fakes.
#ifndef SUBSTRAX_WORKER_RUNTIME_SHARDED_UPDATE_H_
#define SUBSTRAX_WORKER_RUNTIME_SHARDED_UPDATE_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/gradient_reducer.h"

namespace substrax {

// What a backend that shards its update does with the blocks. Called on the device's thread.
class BlockUpdate {
 public:
  virtual ~BlockUpdate() = default;
  // The update of step `step` (1 for the first) of the values at [begin, end) of the gradient
  // layout, from the buffer's values there. The devices of the axis call it at once for their
  // disjoint blocks.
  virtual absl::Status ApplyGradientBlock(int64_t begin, int64_t end, int64_t step) = 0;
  // After every device of the axis has updated its block: copies the other blocks (block q is
  // values [q * block, (q + 1) * block) of the layout, updated by the device of rank q of the
  // data axis; this device is `rank` of `size`) from their devices into this device's
  // parameters.
  virtual absl::Status FetchPeerBlocks(int64_t block, int rank, int size) = 0;
};

// Binds `backend`'s gradient buffer (setup.layout padded to the blocks) and returns the reducer
// that updates through `blocks`; both must outlive it. Errors: INVALID_ARGUMENT unless the mesh
// has a data axis alone, the path is the shardings' (not explicit collectives) and the backend
// runs on the calling thread (max_steps_in_flight() == 0); those of BindGradients.
absl::StatusOr<std::unique_ptr<GradientReducer>> CreateShardedUpdate(
    const GradientReducerSetup& setup, DeviceBackend& backend, BlockUpdate& blocks);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_SHARDED_UPDATE_H_
