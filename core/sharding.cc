#include "core/sharding.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace substrax {

PartitionSpec PartitionSpec::Of(const std::vector<std::string>& axis_per_dim) {
  std::vector<std::vector<std::string>> dims;
  dims.reserve(axis_per_dim.size());
  for (const std::string& axis : axis_per_dim) {
    dims.push_back(axis.empty() ? std::vector<std::string>{} : std::vector<std::string>{axis});
  }
  return PartitionSpec(std::move(dims));
}

PartitionSpec PartitionSpec::FromProto(const v1::PartitionSpec& proto) {
  std::vector<std::vector<std::string>> dims;
  for (const auto& dim : proto.dims()) dims.emplace_back(dim.axes().begin(), dim.axes().end());
  return PartitionSpec(std::move(dims));
}

v1::PartitionSpec PartitionSpec::ToProto() const {
  v1::PartitionSpec proto;
  for (const auto& dim : dims_) {
    auto* d = proto.add_dims();
    for (const std::string& axis : dim) d->add_axes(axis);
  }
  return proto;
}

std::string PartitionSpec::ToString() const {
  std::vector<std::string> parts;
  for (const auto& dim : dims_) {
    if (dim.empty()) {
      parts.push_back("None");
    } else if (dim.size() == 1) {
      parts.push_back(absl::StrCat("'", dim[0], "'"));
    } else {
      parts.push_back(absl::StrCat(
          "(", absl::StrJoin(dim, ", ", [](std::string* out, const std::string& a) {
            absl::StrAppend(out, "'", a, "'");
          }),
          ")"));
    }
  }
  if (parts.size() == 1) return absl::StrCat("(", parts[0], ",)");
  return absl::StrCat("(", absl::StrJoin(parts, ", "), ")");
}

std::vector<int64_t> ShardSlice::shape() const {
  std::vector<int64_t> s;
  s.reserve(index.size());
  for (const IndexRange& r : index) s.push_back(r.size());
  return s;
}

absl::StatusOr<ShardSlice> ShardLayout::ForDevice(int device_id) const {
  for (const ShardSlice& shard : shards) {
    if (shard.device.id == device_id) return shard;
  }
  return absl::NotFoundError(absl::StrCat("device ", device_id, " holds no shard of this layout"));
}

v1::ShardLayout ShardLayout::ToProto() const {
  v1::ShardLayout proto;
  for (int64_t d : global_shape) proto.add_global_shape(d);
  *proto.mutable_spec() = spec.ToProto();
  for (const ShardSlice& shard : shards) {
    auto* s = proto.add_shards();
    s->set_device_id(shard.device.id);
    s->set_replica_id(shard.replica_id);
    for (const IndexRange& r : shard.index) {
      auto* range = s->add_index();
      range->set_start(r.start);
      range->set_limit(r.limit);
    }
  }
  proto.set_num_replicas(num_replicas);
  return proto;
}

absl::StatusOr<NamedSharding> NamedSharding::Create(Mesh mesh, PartitionSpec spec) {
  absl::flat_hash_set<std::string> used;
  for (size_t i = 0; i < spec.dims().size(); ++i) {
    for (const std::string& axis : spec.dims()[i]) {
      if (!mesh.HasAxis(axis)) {
        return Annotate(mesh.AxisIndex(axis).status(),
                        absl::StrCat("partition spec ", spec.ToString(), ", dimension ", i));
      }
      if (!used.insert(axis).second) {
        return absl::InvalidArgumentError(absl::StrCat("partition spec ", spec.ToString(),
                                                       " uses mesh axis '", axis,
                                                       "' more than once"));
      }
    }
  }
  return NamedSharding(std::move(mesh), std::move(spec));
}

int64_t NamedSharding::num_replicas() const {
  absl::flat_hash_set<std::string> used;
  for (const auto& dim : spec_.dims()) used.insert(dim.begin(), dim.end());
  int64_t replicas = 1;
  for (int a = 0; a < mesh_.ndim(); ++a) {
    if (!used.contains(mesh_.axis_names()[a])) replicas *= mesh_.shape()[a];
  }
  return replicas;
}

absl::StatusOr<ShardLayout> NamedSharding::Layout(absl::Span<const int64_t> global_shape) const {
  const size_t rank = global_shape.size();
  if (spec_.dims().size() > rank) {
    return absl::InvalidArgumentError(absl::StrCat("partition spec ", spec_.ToString(), " has ",
                                                   spec_.dims().size(),
                                                   " dimensions but the array has shape ",
                                                   ShapeToString(global_shape)));
  }
  // Mesh axis indices each array dimension is split over, and the number of blocks along it.
  std::vector<std::vector<int>> dim_axes(rank);
  std::vector<int64_t> blocks(rank, 1);
  std::vector<bool> axis_used(mesh_.ndim(), false);
  for (size_t d = 0; d < rank; ++d) {
    if (global_shape[d] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", d, " of shape ",
                                                     ShapeToString(global_shape),
                                                     " is negative"));
    }
    if (d >= spec_.dims().size()) continue;
    for (const std::string& axis : spec_.dims()[d]) {
      SUBSTRAX_ASSIGN_OR_RETURN(int a, mesh_.AxisIndex(axis));
      dim_axes[d].push_back(a);
      axis_used[a] = true;
      blocks[d] *= mesh_.shape()[a];
    }
    if (global_shape[d] % blocks[d] != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dimension ", d, " of shape ", ShapeToString(global_shape), " has size ",
          global_shape[d], ", which does not divide evenly over mesh axes (",
          absl::StrJoin(spec_.dims()[d], ", "), ") of total size ", blocks[d]));
    }
  }

  ShardLayout layout;
  layout.global_shape.assign(global_shape.begin(), global_shape.end());
  layout.spec = spec_;
  layout.num_replicas = num_replicas();
  layout.shards.reserve(mesh_.size());
  for (int64_t i = 0; i < mesh_.size(); ++i) {
    const std::vector<int64_t> coords = mesh_.Unravel(i);
    ShardSlice shard;
    shard.device = mesh_.devices()[i];
    for (size_t d = 0; d < rank; ++d) {
      // Block index along this dimension: the coordinates on its axes, outermost first.
      int64_t block = 0;
      for (int a : dim_axes[d]) block = block * mesh_.shape()[a] + coords[a];
      const int64_t size = global_shape[d] / blocks[d];
      shard.index.push_back({block * size, (block + 1) * size});
    }
    // Replica id: the coordinates on the unused axes, row-major.
    for (int a = 0; a < mesh_.ndim(); ++a) {
      if (!axis_used[a]) shard.replica_id = shard.replica_id * mesh_.shape()[a] + coords[a];
    }
    layout.shards.push_back(std::move(shard));
  }
  return layout;
}

std::string NamedSharding::ToString() const {
  return absl::StrCat("NamedSharding(mesh=", mesh_.ShapeString(), ", spec=", spec_.ToString(),
                      ")");
}

absl::StatusOr<NamedSharding> CreateDataParallelSharding(const Mesh& mesh) {
  if (!mesh.HasAxis(kDataAxis)) {
    return Annotate(mesh.AxisIndex(kDataAxis).status(), "data-parallel sharding");
  }
  return NamedSharding::Create(mesh, PartitionSpec::Of({kDataAxis}));
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

}  // namespace substrax
