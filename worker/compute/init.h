// Parameter initialisation as a pure function of the seed, element by element.
//
// Every value depends only on (seed, parameter name, flat index in the parameter's global
// shape), so any block of a parameter can be generated on its own: a device that holds one shard
// of a sharded parameter initialises just that shard, and it equals the same slice of the full
// initialisation on every host, whatever its compiler or standard library (no std::hash, no std
// distributions).
//
// Schemes follow Flax's defaults for Dense layers:
//   - "…/kernel": Glorot (Xavier) uniform in [-sqrt(6 / (fan_in + fan_out)), +sqrt(...)];
//   - everything else (biases): 0.
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_WORKER_COMPUTE_INIT_H_
#define SUBSTRAX_WORKER_COMPUTE_INIT_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model_catalog.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// Value of element `flat_index` (row-major in the parameter's GLOBAL shape) of parameter `spec`.
// The Glorot scale comes from spec.fan_in and spec.fan_out (from the kernel's shape [in, out]
// when both are 0). `flat_index` is not range-checked: it only feeds the hash.
float InitValue(uint64_t seed, const ParamSpec& spec, int64_t flat_index);

// The whole parameter, in its global shape.
Tensor InitParam(uint64_t seed, const ParamSpec& spec);

// The block [start, limit) per dimension of the parameter; equal to
// InitParam(seed, spec).Slice(ranges) without materialising the whole parameter.
// Errors: INVALID_ARGUMENT naming the parameter when ranges.size() differs from the rank or a
// range is not within [0, dim].
absl::StatusOr<Tensor> InitParamSlice(uint64_t seed, const ParamSpec& spec,
                                      absl::Span<const std::pair<int64_t, int64_t>> ranges);

// Every parameter of `specs`, keyed by name.
TensorTree InitParams(uint64_t seed, const std::vector<ParamSpec>& specs);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMPUTE_INIT_H_
