// The guide's distributed-training functions on live devices (docs/api-parity.md).
//
// A runner has one thread per device; each thread holds a DeviceContext and calls these
// functions, and every device of the mesh makes the same calls in the same order (SPMD). Two
// families, as in the guide:
//  - SPMD functions (ReduceMean, ReduceSum, ReduceCustom, CollectFromDevices,
//    ReduceGradientTree, SpmdTrainStep) take no axis name: what they reduce over follows from
//    the mesh and the shardings.
//  - Collective functions (ReduceMeanCollective, ReduceSumCollective, AllGather) take an axis
//    name; an axis the mesh does not have is INVALID_ARGUMENT, never a silent no-op.
//
// Errors from collectives pass through unchanged (UNAVAILABLE when a peer died, ...), annotated
// with the function that ran them.
#ifndef SUBSTRAX_SPMD_H_
#define SUBSTRAX_SPMD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "substrax/mesh.h"
#include "substrax/metrics.h"
#include "substrax/optimizer.h"
#include "substrax/sharding.h"
#include "substrax/tensor.h"

namespace substrax {

// The device's communicators, one group per mesh axis: internal to substrax (the SDK connects
// them; programs reach them only through the functions below).
class MeshCommunicators;

// What one device thread knows about itself.
struct DeviceContext {
  const Mesh* mesh = nullptr;
  Device device;
  // The device's coordinates in the mesh.
  std::vector<int64_t> coords;
  MeshCommunicators* comms = nullptr;

  // Coordinate on / size of the data axis (0 / 1 when the mesh has none).
  int64_t data_index() const;
  int64_t data_size() const;
};

// --- SPMD metric reductions over every device of the mesh --------------------------------
// Each device passes its own values; every device gets the same result. Errors:
// FAILED_PRECONDITION when devices pass different metric names; as core/metric_reductions.h.
absl::StatusOr<Metrics> ReduceMean(DeviceContext& ctx, const Metrics& metrics);
absl::StatusOr<Metrics> ReduceSum(DeviceContext& ctx, const Metrics& metrics);
absl::StatusOr<Metrics> ReduceCustom(DeviceContext& ctx, const Metrics& metrics,
                                     const std::map<std::string, std::string>& reduce_fn);
absl::StatusOr<Metrics> ReduceCustom(DeviceContext& ctx, const Metrics& metrics,
                                     const std::map<std::string, ReduceOp>& reduce_fn);
// Every device's metrics, in mesh (row-major) order.
absl::StatusOr<std::vector<Metrics>> CollectFromDevices(DeviceContext& ctx,
                                                        const Metrics& metrics);

// --- Collective variants over one mesh axis -------------------------------------------------
absl::Status ReduceMeanCollective(DeviceContext& ctx, TensorTree* tree, absl::string_view axis);
absl::Status ReduceSumCollective(DeviceContext& ctx, TensorTree* tree, absl::string_view axis);
absl::StatusOr<Metrics> ReduceMeanCollective(DeviceContext& ctx, const Metrics& metrics,
                                             absl::string_view axis);
absl::StatusOr<Metrics> ReduceSumCollective(DeviceContext& ctx, const Metrics& metrics,
                                            absl::string_view axis);
// The tensors of every device along `axis`, stacked on a new leading dimension.
absl::StatusOr<Tensor> AllGather(DeviceContext& ctx, const Tensor& tensor,
                                 absl::string_view axis);

// --- Gradients ------------------------------------------------------------------------------
enum class ReduceType { kMean, kSum };

// The gradient bucket size of every reduction that does not choose one: the SDK's
// ReduceGradientTree and a job whose spec.gradients.bucket_bytes is left out. Small enough that
// the last layers' buckets are reduced while the backward pass computes the first layers'
// gradients, large enough that each is one long run (docs/performance.md#overlap).
inline constexpr int64_t kDefaultGradientBucketBytes = int64_t{1} << 20;

struct GradientReductionOptions {
  // Gradients are packed into buckets of at most this many bytes and all-reduced one bucket at
  // a time: fewer, larger messages than one per tensor.
  int64_t bucket_bytes = kDefaultGradientBucketBytes;
};

// All-reduces every gradient over the data axis (mean or sum), in buckets. A mesh without a
// data axis has one replica of each parameter: nothing to reduce.
absl::Status ReduceGradientTree(DeviceContext& ctx, TensorTree* grads, ReduceType type,
                                const GradientReductionOptions& options = {});

// The reduction the shardings imply: each gradient is averaged over exactly the mesh axes its
// parameter is not sharded on (its replicas): over "data" for every parameter of a data-parallel
// job, and also over "model" for the parameters tensor parallelism replicates. A sharded
// parameter's gradient is never reduced over the axis it is split on, and nothing is reduced
// twice. `specs`: partition spec by parameter name (missing: replicated).
absl::Status ReduceGradientsBySharding(DeviceContext& ctx, TensorTree* grads,
                                       const std::map<std::string, PartitionSpec>& specs,
                                       const GradientReductionOptions& options = {});

// --- Placement ------------------------------------------------------------------------------
// The device's part of a global batch: inputs and targets split along their leading (batch)
// dimension as `sharding` lays it out (CreateDataParallelSharding: over the data axis).
// Errors: INVALID_ARGUMENT when the batch does not divide (names sizes), NOT_FOUND when the
// device is not in the sharding's mesh.
absl::StatusOr<Batch> PlaceBatchOnShards(const Batch& global, const NamedSharding& sharding,
                                         int device_id);
// The device's shard of every tensor of `state`: replicated unless `specs` has a partition
// spec for the name. Errors: as NamedSharding::Layout, naming the tensor.
absl::StatusOr<TensorTree> PlaceStateOnShards(const TensorTree& state, const Mesh& mesh,
                                              const std::map<std::string, PartitionSpec>& specs,
                                              int device_id);

// The inverse of PlaceStateOnShards: every tensor at its full (global) shape, gathered over the
// axes its spec splits it on. Every device of the mesh must call it. Errors: INVALID_ARGUMENT
// for a spec the mesh cannot hold; collective errors.
absl::StatusOr<TensorTree> AllGatherState(DeviceContext& ctx, const TensorTree& local,
                                          const std::map<std::string, PartitionSpec>& specs);

// AllGatherState with the collective supplied: `gather(tensor, axis)` returns the tensors of every
// device along `axis`, stacked on a new leading dimension (any backend: Gloo, NCCL).
using AxisGather = std::function<absl::StatusOr<Tensor>(const Tensor&, const std::string& axis)>;
absl::StatusOr<TensorTree> AllGatherState(const TensorTree& local,
                                          const std::map<std::string, PartitionSpec>& specs,
                                          const AxisGather& gather);

// --- Training steps -------------------------------------------------------------------------
struct StepResult {
  double loss = 0;      // this device's batch
  double accuracy = 0;  // this device's batch (classification)
  // Where the step's time went on this device.
  double compute_seconds = 0;
  double collective_seconds = 0;
};


// What a program's model computes on one device's batch: the mean loss and its gradients (and the
// accuracy for classification). Called on the device's thread.
using LossAndGradsFn =
    std::function<absl::StatusOr<LossAndGrads>(const TensorTree& params, const Batch& batch)>;

// The guide's spmd_train_step for a program's own model: `loss_and_grads` on the device's batch,
// the gradients reduced as the shardings imply (ReduceGradientsBySharding with `specs`: by
// parameter name, missing = replicated, so a data-parallel job averages every gradient over the
// data axis), then one update of `params` by `optimizer`. Every device of the mesh calls it.
// Errors: those of `loss_and_grads` (returned as they are), of the collectives, and of the update
// (INVALID_ARGUMENT naming a gradient whose name or shape does not match its parameter).
absl::StatusOr<StepResult> SpmdTrainStep(DeviceContext& ctx, const LossAndGradsFn& loss_and_grads,
                                         Optimizer& optimizer, TensorTree* params,
                                         const Batch& batch,
                                         const std::map<std::string, PartitionSpec>& specs = {},
                                         const GradientReductionOptions& options = {});

}  // namespace substrax

#endif  // SUBSTRAX_SPMD_H_
