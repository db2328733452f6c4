#include "core/metric_reductions.h"

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"

namespace substrax {
namespace {

constexpr ReduceOp kAllOps[] = {ReduceOp::kMean, ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin};

// Number of device values every metric has. Errors: a metric with none, or counts that differ.
absl::StatusOr<size_t> DeviceCount(const StackedMetrics& metrics) {
  size_t count = 0;
  const std::string* first = nullptr;
  for (const auto& [name, values] : metrics) {
    if (values.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("metric '", name, "' has no device values"));
    }
    if (first == nullptr) {
      first = &name;
      count = values.size();
    } else if (values.size() != count) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics must have one value per device for every name, but '", *first, "' has ",
          count, " values and '", name, "' has ", values.size()));
    }
  }
  return count;
}

absl::StatusOr<Metrics> ReduceAll(const StackedMetrics& metrics, ReduceOp op) {
  SUBSTRAX_RETURN_IF_ERROR(DeviceCount(metrics).status());
  Metrics out;
  for (const auto& [name, values] : metrics) {
    SUBSTRAX_ASSIGN_OR_RETURN(out[name], Reduce(values, op));
  }
  return out;
}

}  // namespace

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMean:
      return "mean";
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

absl::StatusOr<ReduceOp> ParseReduceOp(absl::string_view name) {
  for (ReduceOp op : kAllOps) {
    if (name == ReduceOpName(op)) return op;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown reduction '", name, "'; use one of mean, sum, max, min"));
}

v1::Reduction ReduceOpToProto(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMean:
      return v1::REDUCTION_MEAN;
    case ReduceOp::kSum:
      return v1::REDUCTION_SUM;
    case ReduceOp::kMax:
      return v1::REDUCTION_MAX;
    case ReduceOp::kMin:
      return v1::REDUCTION_MIN;
  }
  return v1::REDUCTION_UNSPECIFIED;
}

absl::StatusOr<ReduceOp> ReduceOpFromProto(v1::Reduction reduction) {
  switch (reduction) {
    case v1::REDUCTION_MEAN:
      return ReduceOp::kMean;
    case v1::REDUCTION_SUM:
      return ReduceOp::kSum;
    case v1::REDUCTION_MAX:
      return ReduceOp::kMax;
    case v1::REDUCTION_MIN:
      return ReduceOp::kMin;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "reduction ", v1::Reduction_Name(reduction), " does not combine values into one"));
  }
}

absl::StatusOr<double> Reduce(absl::Span<const double> values, ReduceOp op) {
  if (values.empty()) return absl::InvalidArgumentError("no values to reduce");
  double acc = op == ReduceOp::kMax   ? -std::numeric_limits<double>::infinity()
               : op == ReduceOp::kMin ? std::numeric_limits<double>::infinity()
                                      : 0.0;
  for (double v : values) {
    if (std::isnan(v)) return std::numeric_limits<double>::quiet_NaN();
    switch (op) {
      case ReduceOp::kMean:
      case ReduceOp::kSum:
        acc += v;
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
    }
  }
  if (op == ReduceOp::kMean) acc /= static_cast<double>(values.size());
  return acc;
}

absl::StatusOr<Metrics> ReduceMean(const StackedMetrics& metrics) {
  return ReduceAll(metrics, ReduceOp::kMean);
}

absl::StatusOr<Metrics> ReduceSum(const StackedMetrics& metrics) {
  return ReduceAll(metrics, ReduceOp::kSum);
}

absl::StatusOr<Metrics> ReduceCustom(const StackedMetrics& metrics,
                                     const std::map<std::string, std::string>& reduce_fn) {
  std::map<std::string, ReduceOp> ops;
  for (const auto& [name, op_name] : reduce_fn) {
    absl::StatusOr<ReduceOp> op = ParseReduceOp(op_name);
    if (!op.ok()) return Annotate(op.status(), absl::StrCat("metric '", name, "'"));
    ops[name] = *op;
  }
  return ReduceCustom(metrics, ops);
}

absl::StatusOr<Metrics> ReduceCustom(const StackedMetrics& metrics,
                                     const std::map<std::string, ReduceOp>& reduce_fn) {
  SUBSTRAX_RETURN_IF_ERROR(DeviceCount(metrics).status());
  std::vector<std::string> missing;
  for (const auto& [name, values] : metrics) {
    if (!reduce_fn.count(name)) missing.push_back(name);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("no reduction given for metric(s) ",
                                                   absl::StrJoin(missing, ", "),
                                                   "; give each one of mean, sum, max, min"));
  }
  Metrics out;
  for (const auto& [name, op] : reduce_fn) {
    auto it = metrics.find(name);
    if (it == metrics.end()) {
      std::vector<std::string> present;
      for (const auto& entry : metrics) present.push_back(entry.first);
      return absl::InvalidArgumentError(absl::StrCat(
          "reduction given for metric '", name, "', which is not among the metrics (",
          absl::StrJoin(present, ", "), ")"));
    }
    SUBSTRAX_ASSIGN_OR_RETURN(out[name], Reduce(it->second, op));
  }
  return out;
}

absl::StatusOr<std::vector<Metrics>> CollectFromDevices(const StackedMetrics& metrics) {
  SUBSTRAX_ASSIGN_OR_RETURN(size_t devices, DeviceCount(metrics));
  std::vector<Metrics> per_device(devices);
  for (const auto& [name, values] : metrics) {
    for (size_t i = 0; i < devices; ++i) per_device[i][name] = values[i];
  }
  return per_device;
}

}  // namespace substrax
