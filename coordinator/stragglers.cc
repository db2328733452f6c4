#include "coordinator/stragglers.h"

#include <algorithm>
#include <utility>

namespace substrax {

namespace {

double Median(std::vector<double> values) {
  const size_t n = values.size();
  std::nth_element(values.begin(), values.begin() + n / 2, values.end());
  double upper = values[n / 2];
  if (n % 2 == 1) return upper;
  const double lower = *std::max_element(values.begin(), values.begin() + n / 2);
  return (lower + upper) / 2;
}

}  // namespace

StragglerDetector::StragglerDetector(std::vector<int> devices, StragglerOptions options)
    : devices_(std::move(devices)), options_(options) {}

std::vector<StragglerChange> StragglerDetector::Add(int64_t step, int device_id,
                                                    const PhaseTimes& times) {
  if (step <= evaluated_ ||
      std::find(devices_.begin(), devices_.end(), device_id) == devices_.end()) {
    return {};
  }
  std::map<int, PhaseTimes>& at = pending_[step];
  at[device_id] = times;
  std::vector<StragglerChange> changes;
  if (at.size() == devices_.size()) {
    changes = Evaluate(step, at);
    evaluated_ = step;
    pending_.erase(pending_.begin(), pending_.upper_bound(step));
  }
  while (pending_.size() > kPendingSteps) pending_.erase(pending_.begin());
  return changes;
}

std::vector<StragglerChange> StragglerDetector::Evaluate(int64_t step,
                                                         const std::map<int, PhaseTimes>& times) {
  std::vector<StragglerChange> changes;
  if (devices_.size() < 2) return changes;
  auto push = [this](int device, const std::string& series, double value) {
    std::deque<double>& window = times_[{device, series}];
    window.push_back(value);
    while (static_cast<int>(window.size()) > options_.window) window.pop_front();
    return static_cast<int>(window.size());
  };
  auto level = [this](int device, const std::string& series) {
    const std::deque<double>& window = times_[{device, series}];
    return Median(std::vector<double>(window.begin(), window.end()));
  };
  int steps = 0;
  for (const auto& [device, t] : times) {
    push(device, "compute", t.compute_seconds);
    push(device, "data", t.data_seconds);
    steps = push(device, "total", t.compute_seconds + t.data_seconds + t.collective_seconds);
  }
  if (steps < options_.min_steps) return changes;
  std::vector<double> totals;
  for (const auto& entry : times) totals.push_back(level(entry.first, "total"));
  const double interval = Median(totals);
  for (const std::string phase : {"compute", "data"}) {
    std::map<int, double> levels;
    for (const auto& entry : times) levels[entry.first] = level(entry.first, phase);
    for (const auto& [device, mine] : levels) {
      std::vector<double> others;
      for (const auto& [other, theirs] : levels) {
        if (other != device) others.push_back(theirs);
      }
      const double reference = Median(others);
      const bool measured = mine >= options_.floor_seconds || reference >= options_.floor_seconds;
      StragglerChange change;
      change.device_id = device;
      change.phase = phase;
      change.ratio = measured ? mine / std::max(reference, options_.floor_seconds) : 1.0;
      change.steps = steps;
      change.step = step;
      const double excess = mine - reference;
      const std::pair<int, std::string> key{device, phase};
      auto flagged = flagged_.find(key);
      if (flagged == flagged_.end()) {
        if (change.ratio >= options_.threshold && excess >= options_.min_share * interval) {
          change.flagged = true;
          flagged_[key] = change;
          changes.push_back(change);
        }
      } else if (change.ratio < options_.clear_below ||
                 excess < options_.min_share / 2 * interval) {
        flagged_.erase(flagged);
        changes.push_back(change);
      } else {
        flagged->second.ratio = change.ratio;  // still flagged: its latest ratio
      }
    }
  }
  return changes;
}

}  // namespace substrax
