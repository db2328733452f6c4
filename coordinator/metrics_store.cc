#include "coordinator/metrics_store.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/metric_reductions.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

bool Earlier(const google::protobuf::Timestamp& a, const google::protobuf::Timestamp& b) {
  return FromProtoTime(a) < FromProtoTime(b);
}

// Values combined into one point, and the latest arrival among them.
struct Accumulator {
  std::vector<double> values;
  google::protobuf::Timestamp time;

  void Add(double value, const google::protobuf::Timestamp& at) {
    if (values.empty() || Earlier(time, at)) time = at;
    values.push_back(value);
  }
};

// `reduction` is never NONE or UNSPECIFIED here (NONE combines one value: any op will do).
double ReduceValues(const std::vector<double>& values, v1::Reduction reduction) {
  const absl::StatusOr<ReduceOp> op = ReduceOpFromProto(reduction);
  // Reduce fails only on no values, and callers never pass none.
  return Reduce(values, op.ok() ? *op : ReduceOp::kMean).value();
}

}  // namespace

v1::Reduction EffectiveReduction(const std::string& name, v1::Reduction requested,
                                 const DeclaredReductions& declared) {
  if (requested != v1::REDUCTION_UNSPECIFIED) return requested;
  auto it = declared.find(name);
  if (it != declared.end() && it->second != v1::REDUCTION_UNSPECIFIED &&
      it->second != v1::REDUCTION_NONE) {
    return it->second;
  }
  return name == kSamplesPerSecond ? v1::REDUCTION_SUM : v1::REDUCTION_MEAN;
}

ExpectedDevices DevicesOf(const v1::Mesh& mesh) {
  ExpectedDevices devices;
  for (const v1::Device& device : mesh.devices()) devices[device.id()] = device.host();
  return devices;
}

void MetricsStore::Add(const v1::StepReport& report, const ExpectedDevices& expected) {
  absl::MutexLock lock(&mu_);
  Attempt& attempt = jobs_[report.job_id()][report.attempt()];
  DevicePoint& point = attempt.steps[report.step()][report.device_id()];
  point.host = report.host();
  point.time = report.time();
  point.values.clear();
  point.values.insert(report.values().begin(), report.values().end());
  point.values[kSamplesPerSecond] = report.samples_per_second();
  point.values[kDataWaitSeconds] = report.data_wait_seconds();
  point.values[kComputeSeconds] = report.compute_seconds();
  point.values[kCollectiveSeconds] = report.collective_seconds();
  attempt.devices[report.device_id()] = report.host();
  for (const auto& [name, value] : point.values) attempt.names.insert(name);
  if (keep_steps_ <= 0) return;
  JobPoints& job = jobs_[report.job_id()];
  while (job.size() > 1) job.erase(job.begin());  // only the newest attempt
  Attempt& newest = job.rbegin()->second;
  auto& steps = newest.steps;
  // Progress is the newest step every device reported, so nothing older than such a step can
  // become it. The steps after it wait for the devices that are behind (up to keep_steps: one
  // that never catches up must not grow the window).
  const size_t devices = expected.empty() ? newest.devices.size() : expected.size();
  for (auto step = steps.rbegin(); step != steps.rend(); ++step) {
    if (step->second.size() < devices) continue;
    steps.erase(steps.begin(), std::prev(step.base()));
    break;
  }
  while (static_cast<int>(steps.size()) > keep_steps_) steps.erase(steps.begin());
}

void MetricsStore::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

absl::StatusOr<v1::QueryMetricsResponse> MetricsStore::Query(
    const v1::QueryMetricsRequest& request, const DeclaredReductions& declared,
    const ExpectedDevices& expected) const {
  const v1::StepRange& range = request.steps();
  if (request.attempt() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attempt: ", request.attempt(), " is not an attempt: give 0 (the latest) or N >= 1"));
  }
  if (range.first() < 0 || range.last() < 0 || (range.last() != 0 && range.last() < range.first())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "steps: [", range.first(), ", ", range.last(),
        "] is not a step range: give 0 <= first <= last, or last 0 for \"to the latest\""));
  }
  absl::ReaderMutexLock lock(&mu_);
  auto job = jobs_.find(request.job_id());
  if (job == jobs_.end() || job->second.empty()) {
    return absl::NotFoundError(
        absl::StrCat("job ", request.job_id(), " has reported no metrics yet"));
  }
  auto chosen = job->second.rbegin()->first;
  if (request.attempt() != 0) chosen = request.attempt();
  auto found = job->second.find(chosen);
  if (found == job->second.end()) {
    std::vector<int> with_points;
    for (const auto& [number, points] : job->second) with_points.push_back(number);
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " attempt ", chosen,
                                            " reported no metrics; attempts with metrics: ",
                                            absl::StrJoin(with_points, ", ")));
  }
  const int attempt_number = found->first;
  const Attempt& attempt = found->second;

  std::vector<std::string> names(request.names().begin(), request.names().end());
  if (names.empty()) names.assign(attempt.names.begin(), attempt.names.end());
  for (const std::string& name : names) {
    if (attempt.names.count(name) == 0) {
      return absl::NotFoundError(absl::StrCat(
          "job ", request.job_id(), " (attempt ", attempt_number, ") never reported metric '",
          name, "'; it has ", absl::StrJoin(attempt.names, ", ")));
    }
  }
  const int64_t last = range.last() == 0 ? std::numeric_limits<int64_t>::max() : range.last();
  const auto begin = attempt.steps.lower_bound(range.first());
  const auto end = attempt.steps.upper_bound(last);

  v1::QueryMetricsResponse response;
  response.set_attempt(attempt_number);
  for (const std::string& name : names) {
    const v1::Reduction reduction = EffectiveReduction(name, request.reduction(), declared);
    const bool per_device =
        reduction == v1::REDUCTION_NONE || request.group_by() == v1::GROUP_BY_DEVICE;
    const bool per_host = !per_device && request.group_by() == v1::GROUP_BY_HOST;
    // Group key: a device id (per device), else a host name ("" for all devices). std::map
    // orders device ids numerically and hosts by name.
    auto group_of = [&](int device_id, const std::string& host) {
      return std::make_pair(per_device ? device_id : 0, per_host ? host : std::string());
    };
    std::map<std::pair<int, std::string>, v1::MetricSeries> series;
    std::map<std::pair<int, std::string>, int> expected_values;
    for (const auto& [device_id, host] : expected.empty() ? attempt.devices : expected) {
      ++expected_values[group_of(device_id, host)];
    }
    ExpectedDevices with_series = attempt.devices;
    with_series.insert(expected.begin(), expected.end());
    for (const auto& [device_id, host] : with_series) {
      auto key = group_of(device_id, host);
      if (series.count(key) > 0) continue;
      v1::MetricSeries& s = series[key];
      s.set_name(name);
      s.set_reduction(reduction);
      s.set_group(per_device ? absl::StrCat(device_id) : key.second);
    }
    for (auto step = begin; step != end; ++step) {
      std::map<std::pair<int, std::string>, Accumulator> groups;
      for (const auto& [device_id, point] : step->second) {
        auto value = point.values.find(name);
        if (value == point.values.end()) continue;
        groups[group_of(device_id, point.host)].Add(value->second, point.time);
      }
      for (const auto& [key, acc] : groups) {
        v1::MetricPoint* p = series[key].add_points();
        p->set_step(step->first);
        p->set_value(ReduceValues(acc.values, reduction));
        *p->mutable_time() = acc.time;
        const int32_t num_values = static_cast<int32_t>(acc.values.size());
        p->set_num_values(num_values);
        // At least the values there are (a device outside `expected` still counts).
        p->set_expected_values(std::max(num_values, expected_values[key]));
        p->set_partial(num_values < p->expected_values());
      }
    }
    for (auto& [key, s] : series) *response.add_series() = std::move(s);
  }
  return response;
}

std::optional<v1::JobProgress> MetricsStore::Latest(const std::string& job_id, int attempt,
                                                    const DeclaredReductions& declared,
                                                    const ExpectedDevices& expected) const {
  absl::ReaderMutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return std::nullopt;
  auto points = job->second.find(attempt);
  if (points == job->second.end()) return std::nullopt;
  // The newest step every expected device reported: a step only some reported would show the
  // mean of whichever processes' reports arrived first.
  const ExpectedDevices& all = expected.empty() ? points->second.devices : expected;
  const auto& steps = points->second.steps;
  auto complete = std::find_if(steps.rbegin(), steps.rend(), [&](const auto& step) {
    return std::all_of(all.begin(), all.end(),
                       [&](const auto& device) { return step.second.count(device.first) > 0; });
  });
  if (complete == steps.rend()) return std::nullopt;
  const auto& [step, devices] = *complete;

  v1::JobProgress progress;
  progress.set_step(step);
  std::map<std::string, std::vector<double>> values;
  // Throughput: every device's latest rate, even one whose report of the newest step has not
  // arrived yet (processes report on their own schedule); summing only the newest step's
  // reporters would show a fraction of the job's rate.
  double samples_per_second = 0;
  std::set<int> counted;
  for (auto it = points->second.steps.rbegin(); it != points->second.steps.rend(); ++it) {
    for (const auto& [device_id, point] : it->second) {
      if (!counted.insert(device_id).second) continue;
      auto rate = point.values.find(kSamplesPerSecond);
      if (rate != point.values.end()) samples_per_second += rate->second;
    }
  }
  for (const auto& [device_id, point] : devices) {
    for (const auto& [name, value] : point.values) {
      if (name == kSamplesPerSecond || name == kDataWaitSeconds || name == kComputeSeconds ||
          name == kCollectiveSeconds) {
        continue;
      }
      values[name].push_back(value);
    }
  }
  for (const auto& [name, list] : values) {
    // Progress shows the job's own metrics as the spec declares them; an undeclared one is
    // averaged (EffectiveReduction's samples_per_second rule does not apply: it is skipped).
    (*progress.mutable_metrics())[name] =
        ReduceValues(list, EffectiveReduction(name, v1::REDUCTION_UNSPECIFIED, declared));
  }
  progress.set_samples_per_second(samples_per_second);
  return progress;
}

}  // namespace substrax
