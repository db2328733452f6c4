// Metric reductions on host values: the guide's reduce_mean, reduce_sum, reduce_custom and
// collect_from_devices, applied to metrics already gathered from every device.
//
// Metrics are "stacked" as in the guide: each metric name maps to one value per device, in the
// same device order for every name. Every function checks that shape; a metric without a
// reduction, a reduction for a metric that is not there, or an unknown reduction name is an
// error, never skipped. NaN propagates through every reduction (a NaN loss must be seen).
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_METRICS_H_
#define SUBSTRAX_METRICS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace substrax {

enum class ReduceOp { kMean, kSum, kMax, kMin };

// "mean", "sum", "max", "min".
const char* ReduceOpName(ReduceOp op);
// Errors: INVALID_ARGUMENT listing the known names.
absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name);

// Metric name -> one value per device.
using StackedMetrics = std::map<std::string, std::vector<double>>;
// Metric name -> one value.
using Metrics = std::map<std::string, double>;

// Reduces one list of values. Errors: INVALID_ARGUMENT if `values` is empty.
absl::StatusOr<double> Reduce(absl::Span<const double> values, ReduceOp op);

// Mean (sum) of every metric over devices. Errors: INVALID_ARGUMENT when a metric has no values
// or metrics have different numbers of device values.
absl::StatusOr<Metrics> ReduceMean(const StackedMetrics& metrics);
absl::StatusOr<Metrics> ReduceSum(const StackedMetrics& metrics);

// Each metric reduced as `reduce_fn` says ({"loss", "mean"}, {"step", "max"}). Errors:
// INVALID_ARGUMENT when a metric has no reduction, a reduction names a metric that is not
// there, a reduction name is unknown, or the stacked shape is wrong (as ReduceMean).
absl::StatusOr<Metrics> ReduceCustom(const StackedMetrics& metrics,
                                     const std::map<std::string, std::string>& reduce_fn);
absl::StatusOr<Metrics> ReduceCustom(const StackedMetrics& metrics,
                                     const std::map<std::string, ReduceOp>& reduce_fn);

// Splits stacked metrics into one map per device. Errors: as ReduceMean.
absl::StatusOr<std::vector<Metrics>> CollectFromDevices(const StackedMetrics& metrics);

}  // namespace substrax

#endif  // SUBSTRAX_METRICS_H_
