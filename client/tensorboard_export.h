// `substraxctl metrics --tensorboard DIR`: a metrics query's series as a TensorBoard event file
// (core/tensorboard_writer.h), one Event per step holding every series' value at that step.
// No RPC; thread-safe (no shared state).
#ifndef SUBSTRAX_CLIENT_TENSORBOARD_EXPORT_H_
#define SUBSTRAX_CLIENT_TENSORBOARD_EXPORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "substrax/v1/metrics.pb.h"
#include "substrax/v1/metrics_service.pb.h"

namespace substrax::ctl {

// The TensorBoard tag of `series`: its name for a series over all devices, "<name>/device_<id>"
// for one device's (GROUP_BY_DEVICE, or REDUCTION_NONE) and "<name>/host_<host>" for one host's.
std::string TensorBoardTag(const v1::MetricSeries& series, v1::GroupBy group_by);

struct TensorBoardExport {
  std::string path;  // the event file written
  int series = 0;    // series with at least one point
  int steps = 0;     // Events written (one per step)
};

// Writes the series of `response` (queried with `group_by`) to a new event file in `dir`
// (created if missing). Each step's wall time is the latest report time among its points (`now`
// where none is set). Errors: FAILED_PRECONDITION when `dir` or the file cannot be created or
// written, naming the path and the reason.
absl::StatusOr<TensorBoardExport> WriteTensorBoard(const v1::QueryMetricsResponse& response,
                                                   v1::GroupBy group_by, const std::string& dir,
                                                   absl::Time now);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_TENSORBOARD_EXPORT_H_
