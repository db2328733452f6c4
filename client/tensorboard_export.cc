#include "client/tensorboard_export.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tensorboard_writer.h"
#include "rpc/proto_time.h"

namespace substrax::ctl {

std::string TensorBoardTag(const v1::MetricSeries& series, v1::GroupBy group_by) {
  if (series.group().empty()) return series.name();
  // The coordinator keeps one series per device for REDUCTION_NONE whatever the grouping.
  const bool per_device =
      series.reduction() == v1::REDUCTION_NONE || group_by != v1::GROUP_BY_HOST;
  return absl::StrCat(series.name(), per_device ? "/device_" : "/host_", series.group());
}

absl::StatusOr<TensorBoardExport> WriteTensorBoard(const v1::QueryMetricsResponse& response,
                                                   v1::GroupBy group_by, const std::string& dir,
                                                   absl::Time now) {
  struct Step {
    absl::Time wall_time = absl::InfinitePast();
    std::vector<TensorBoardScalar> scalars;
  };
  std::map<int64_t, Step> steps;
  TensorBoardExport result;
  for (const v1::MetricSeries& series : response.series()) {
    if (series.points().empty()) continue;
    ++result.series;
    const std::string tag = TensorBoardTag(series, group_by);
    for (const v1::MetricPoint& point : series.points()) {
      Step& step = steps[point.step()];
      step.scalars.push_back({tag, point.value()});
      if (!IsUnsetProtoTime(point.time())) {
        step.wall_time = std::max(step.wall_time, FromProtoTime(point.time()));
      }
    }
  }
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer = TensorBoardWriter::Create(dir, now);
  if (!writer.ok()) return writer.status();
  for (const auto& [number, step] : steps) {
    (*writer)->AddStep(number, step.wall_time == absl::InfinitePast() ? now : step.wall_time,
                       step.scalars);
  }
  absl::Status flushed = (*writer)->Flush();
  if (!flushed.ok()) return flushed;
  result.path = (*writer)->path();
  result.steps = static_cast<int>(steps.size());
  return result;
}

}  // namespace substrax::ctl
