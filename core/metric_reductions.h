// Metric reductions on host values: the public declarations are in substrax/metrics.h (part of the SDK, docs/sdk.md); this
// header adds the substrax-internal ones that name the wire form (substrax.v1 protos).
#ifndef SUBSTRAX_CORE_METRIC_REDUCTIONS_H_
#define SUBSTRAX_CORE_METRIC_REDUCTIONS_H_

#include "absl/status/statusor.h"
#include "substrax/metrics.h"
#include "substrax/v1/metrics.pb.h"

namespace substrax {

v1::Reduction ReduceOpToProto(ReduceOp op);
// Errors: INVALID_ARGUMENT for REDUCTION_UNSPECIFIED and REDUCTION_NONE.
absl::StatusOr<ReduceOp> ReduceOpFromProto(v1::Reduction reduction);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_METRIC_REDUCTIONS_H_
