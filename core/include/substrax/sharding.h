// PartitionSpec, NamedSharding and shard layouts: which part of a global array each device of a
// mesh holds. The semantics are JAX's (jax.sharding.PartitionSpec / NamedSharding):
//  - dimension i of an array is split over the mesh axes spec.dims()[i] (outermost first), in
//    equal contiguous blocks; dimensions beyond the spec are not split;
//  - mesh axes no dimension uses replicate the array; devices that differ only along those axes
//    hold the same block and get different replica ids.
// A dimension that does not divide evenly is an error, never padded silently.
//
// All types are immutable values and thread-safe.
#ifndef SUBSTRAX_SHARDING_H_
#define SUBSTRAX_SHARDING_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "substrax/device.h"
#include "substrax/mesh.h"

namespace substrax {

// The wire form (substrax.v1 protos) is internal to substrax: the declarations that name it
// are not part of the SDK (docs/sdk.md) and need headers the SDK does not install.
namespace v1 {
class PartitionSpec;
class ShardLayout;
}  // namespace v1

class PartitionSpec {
 public:
  // Fully replicated.
  PartitionSpec() = default;
  // dims[i]: the mesh axes dimension i is split over; empty: not split.
  explicit PartitionSpec(std::vector<std::vector<std::string>> dims) : dims_(std::move(dims)) {}
  // One axis (or "" for none) per dimension: PartitionSpec::Of({"data", ""}) is ('data', None).
  static PartitionSpec Of(const std::vector<std::string>& axis_per_dim);
  static PartitionSpec FromProto(const v1::PartitionSpec& proto);
  v1::PartitionSpec ToProto() const;

  const std::vector<std::vector<std::string>>& dims() const { return dims_; }
  // JAX's notation: ('data', None), (('data', 'model'),), ().
  std::string ToString() const;

  friend bool operator==(const PartitionSpec& a, const PartitionSpec& b) {
    return a.dims_ == b.dims_;
  }
  friend std::ostream& operator<<(std::ostream& os, const PartitionSpec& s) {
    return os << s.ToString();
  }

 private:
  std::vector<std::vector<std::string>> dims_;
};

// Half-open [start, limit).
struct IndexRange {
  int64_t start = 0;
  int64_t limit = 0;
  int64_t size() const { return limit - start; }
  friend bool operator==(const IndexRange& a, const IndexRange& b) {
    return a.start == b.start && a.limit == b.limit;
  }
};

// The block of a global array one device holds.
struct ShardSlice {
  Device device;
  // One range per dimension of the global array.
  std::vector<IndexRange> index;
  // 0..num_replicas-1; devices with the same index have different replica ids.
  int64_t replica_id = 0;

  std::vector<int64_t> shape() const;
};

struct ShardLayout {
  std::vector<int64_t> global_shape;
  PartitionSpec spec;
  // One slice per mesh device, in the mesh's row-major order.
  std::vector<ShardSlice> shards;
  // Copies of each element across the mesh.
  int64_t num_replicas = 1;

  // Errors: NOT_FOUND if the device is not in the mesh.
  absl::StatusOr<ShardSlice> ForDevice(int device_id) const;
  v1::ShardLayout ToProto() const;
};

class NamedSharding {
 public:
  // Errors: INVALID_ARGUMENT when the spec names an axis the mesh lacks (the message lists the
  // mesh's axes) or uses an axis for two dimensions.
  static absl::StatusOr<NamedSharding> Create(Mesh mesh, PartitionSpec spec);

  const Mesh& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }
  // Product of the sizes of the mesh axes the spec does not use.
  int64_t num_replicas() const;

  // Where each block of an array of `global_shape` lives. Errors: INVALID_ARGUMENT when the spec
  // has more dimensions than the shape, a size is negative, or a dimension does not divide by
  // the number of blocks along it (the message names the dimension, its size and the axes).
  absl::StatusOr<ShardLayout> Layout(absl::Span<const int64_t> global_shape) const;

  // "NamedSharding(mesh=(data=4), spec=('data',))".
  std::string ToString() const;

 private:
  NamedSharding(Mesh mesh, PartitionSpec spec) : mesh_(std::move(mesh)), spec_(std::move(spec)) {}

  Mesh mesh_;
  PartitionSpec spec_;
};

// The guide's create_data_parallel_sharding(mesh): spec ('data',), so the leading (batch)
// dimension is split over the data axis and everything else is whole on each device.
// Errors: INVALID_ARGUMENT if the mesh has no "data" axis.
absl::StatusOr<NamedSharding> CreateDataParallelSharding(const Mesh& mesh);

// "(256, 784)".
std::string ShapeToString(absl::Span<const int64_t> shape);

}  // namespace substrax

#endif  // SUBSTRAX_SHARDING_H_
