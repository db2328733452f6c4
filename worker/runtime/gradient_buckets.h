// Gradient reduction over flat buffers, in buckets: the one implementation behind the guide's
// tree functions (ReduceGradientTree, ReduceGradientsBySharding, ReduceMeanCollective on a tree)
// and the step loop, on every backend.
//
// The gradients of a device live in one flat float32 buffer (host memory on CPU, device memory
// on a GPU), one parameter after another in a FlatLayout. A GradientPlan says, per mesh axis,
// which ranges of that buffer are averaged over the axis. Reducing a plan cuts each axis's ranges
// into buckets of at most bucket_bytes (adjacent parameters merge; a large one is cut) and
// all-reduces the buckets of each axis in place as one group (Communicator::AllReduceGroupAsync):
// few, large messages, no copies. It then waits for them, or, when the caller collects the
// handles (a GPU stream orders the later work after them), returns without waiting.
#ifndef SUBSTRAX_WORKER_RUNTIME_GRADIENT_BUCKETS_H_
#define SUBSTRAX_WORKER_RUNTIME_GRADIENT_BUCKETS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/sharding.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// A parameter's place in a flat buffer.
struct FlatSlot {
  std::string name;
  int64_t offset = 0;
  int64_t size = 0;
  std::vector<int64_t> shape;
};

struct FlatLayout {
  std::vector<FlatSlot> slots;
  int64_t total = 0;
  // The slot of `name`. Errors: NOT_FOUND.
  absl::StatusOr<const FlatSlot*> Find(const std::string& name) const;
};

// A layout of tensors of these shapes, in the given order.
FlatLayout MakeFlatLayout(const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes);

// [offset, offset + size) of a flat buffer.
struct FlatRange {
  int64_t offset = 0;
  int64_t size = 0;
};

// Per mesh axis (in mesh order), the ranges to average over it.
struct GradientPlan {
  std::vector<std::pair<std::string, std::vector<FlatRange>>> axes;
  // Benchmarks and tests only: reduce over an axis of one replica too (normally skipped: there
  // is nothing to average), so that one GPU runs the real collective path of a step with a
  // 1-rank NCCL group (bench/gpu_mlp --force-collectives).
  bool reduce_single_replica_axes = false;
};

// The reduction the shardings imply: each parameter is averaged over exactly the mesh axes its
// partition spec does not split it on (its replicas). `specs`: by parameter name (missing:
// replicated).
GradientPlan PlanBySharding(const std::vector<std::string>& axis_names, const FlatLayout& layout,
                            const std::map<std::string, PartitionSpec>& specs);
// Every parameter over the one axis `axis`.
GradientPlan PlanOverAxis(const std::string& axis, const FlatLayout& layout);

// Values per bucket of at most `bucket_bytes` (at least one).
int64_t BucketValues(int64_t bucket_bytes);
// `ranges` cut into buckets of at most `bucket` values: at range ends and every `bucket` values
// (ranges lie in place in the flat buffer, so a bucket is one contiguous run).
std::vector<FlatRange> CutBuckets(const std::vector<FlatRange>& ranges, int64_t bucket);

// What a reduction did, for tests and timing.
struct BucketStats {
  int64_t collectives = 0;
};

// Averages (kMean) or sums (kSum) the plan's ranges of `flat` over their axes, in buckets of at
// most `bucket_bytes`, on `context`. `fn` names the caller in errors. With `in_flight` null it
// waits for every group; otherwise it appends each axis's group handle there and returns at once
// (the caller Awaits them later: errors then surface there, annotated with fn). Errors: the
// collectives' (annotated with fn), INVALID_ARGUMENT for an axis the mesh does not have.
absl::Status ReduceFlat(MeshCommunicators& comms, const GradientPlan& plan, float* flat,
                        ReduceOp op, int64_t bucket_bytes, ExecutionContext context,
                        const char* fn, BucketStats* stats = nullptr,
                        std::vector<CollectiveEvent>* in_flight = nullptr);

// Copies between a TensorTree and a flat host buffer laid out by `layout` (whose slots name the
// tree's tensors). Errors: INVALID_ARGUMENT naming a tensor that is missing or of another size.
absl::Status PackTree(const TensorTree& tree, const FlatLayout& layout, float* flat);
absl::Status UnpackTree(const float* flat, const FlatLayout& layout, TensorTree* tree);
// The layout of a tree's tensors, in the tree's (sorted) order.
FlatLayout LayoutOfTree(const TensorTree& tree);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_GRADIENT_BUCKETS_H_
