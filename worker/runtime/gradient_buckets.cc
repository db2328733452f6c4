#include "worker/runtime/gradient_buckets.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace substrax {
namespace {

// Appends [offset, offset + size), merging it into the last range when they touch.
void AddRange(std::vector<FlatRange>* ranges, int64_t offset, int64_t size) {
  if (size == 0) return;
  if (!ranges->empty() && ranges->back().offset + ranges->back().size == offset) {
    ranges->back().size += size;
    return;
  }
  ranges->push_back({offset, size});
}

bool SplitsOver(const PartitionSpec& spec, const std::string& axis) {
  for (const auto& dim : spec.dims()) {
    if (std::find(dim.begin(), dim.end(), axis) != dim.end()) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<const FlatSlot*> FlatLayout::Find(const std::string& name) const {
  for (const FlatSlot& slot : slots) {
    if (slot.name == name) return &slot;
  }
  return absl::NotFoundError(absl::StrCat("no tensor '", name, "' in the flat layout"));
}

FlatLayout MakeFlatLayout(
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& shapes) {
  FlatLayout layout;
  for (const auto& [name, shape] : shapes) {
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    layout.slots.push_back({name, layout.total, size, shape});
    layout.total += size;
  }
  return layout;
}

GradientPlan PlanBySharding(const std::vector<std::string>& axis_names, const FlatLayout& layout,
                            const std::map<std::string, PartitionSpec>& specs) {
  GradientPlan plan;
  for (const std::string& axis : axis_names) {
    std::vector<FlatRange> ranges;
    for (const FlatSlot& slot : layout.slots) {
      auto spec = specs.find(slot.name);
      if (spec != specs.end() && SplitsOver(spec->second, axis)) continue;
      AddRange(&ranges, slot.offset, slot.size);
    }
    plan.axes.emplace_back(axis, std::move(ranges));
  }
  return plan;
}

GradientPlan PlanOverAxis(const std::string& axis, const FlatLayout& layout) {
  GradientPlan plan;
  std::vector<FlatRange> ranges;
  for (const FlatSlot& slot : layout.slots) AddRange(&ranges, slot.offset, slot.size);
  plan.axes.emplace_back(axis, std::move(ranges));
  return plan;
}

int64_t BucketValues(int64_t bucket_bytes) {
  return std::max<int64_t>(1, bucket_bytes / int64_t{sizeof(float)});
}

std::vector<FlatRange> CutBuckets(const std::vector<FlatRange>& ranges, int64_t bucket) {
  std::vector<FlatRange> buckets;
  for (const FlatRange& range : ranges) {
    for (int64_t start = 0; start < range.size; start += bucket) {
      buckets.push_back({range.offset + start, std::min(bucket, range.size - start)});
    }
  }
  return buckets;
}

absl::Status ReduceFlat(MeshCommunicators& comms, const GradientPlan& plan, float* flat,
                        ReduceOp op, int64_t bucket_bytes, ExecutionContext context,
                        const char* fn, BucketStats* stats,
                        std::vector<CollectiveEvent>* in_flight) {
  const int64_t bucket = BucketValues(bucket_bytes);
  std::vector<ReduceBuffer> buckets;
  for (const auto& [axis, ranges] : plan.axes) {
    SUBSTRAX_ASSIGN_OR_RETURN(Communicator * comm, comms.Axis(axis));
    // One replica along this axis: nothing to average (unless forced, to run the path).
    if (comm->size() == 1 && !plan.reduce_single_replica_axes) continue;
    buckets.clear();
    for (const FlatRange& b : CutBuckets(ranges, bucket)) {
      buckets.push_back({flat + b.offset, static_cast<size_t>(b.size)});
    }
    if (stats != nullptr) stats->collectives += static_cast<int64_t>(buckets.size());
    CollectiveEvent group = comm->AllReduceGroupAsync(buckets, DataType::kFloat32, op, context);
    if (in_flight != nullptr) {
      in_flight->push_back(std::move(group));
    } else {
      SUBSTRAX_RETURN_IF_ERROR(Annotate(group.Await(), fn));
    }
  }
  return absl::OkStatus();
}

FlatLayout LayoutOfTree(const TensorTree& tree) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& [name, tensor] : tree) shapes.emplace_back(name, tensor.shape());
  return MakeFlatLayout(shapes);
}

absl::Status PackTree(const TensorTree& tree, const FlatLayout& layout, float* flat) {
  for (const FlatSlot& slot : layout.slots) {
    auto it = tree.find(slot.name);
    if (it == tree.end() || it->second.size() != slot.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", slot.name, "' ",
          it == tree.end() ? "is missing" : absl::StrCat("has ", it->second.size(), " values"),
          "; the flat layout expects ", slot.size));
    }
    std::memcpy(flat + slot.offset, it->second.data(), slot.size * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status UnpackTree(const float* flat, const FlatLayout& layout, TensorTree* tree) {
  for (const FlatSlot& slot : layout.slots) {
    auto it = tree->find(slot.name);
    if (it == tree->end() || it->second.size() != slot.size) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", slot.name,
                                                     "' is missing or of another size than the "
                                                     "flat layout's ",
                                                     slot.size, " values"));
    }
    std::memcpy(it->second.data(), flat + slot.offset, slot.size * sizeof(float));
  }
  return absl::OkStatus();
}

}  // namespace substrax
