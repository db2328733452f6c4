#include "worker/collectives/shm_write_tuner.h"

namespace substrax::shm {

bool WriteTuner::Streams(size_t bytes, bool streaming) const {
  if (bytes < kMinBytes) return streaming;
  return counted_ < kTrials ? !streaming : streaming;
}

bool WriteTuner::Record(size_t bytes, bool streamed, bool streaming, absl::Duration elapsed) {
  if (bytes < kMinBytes) return streaming;
  const double seconds = absl::ToDoubleSeconds(elapsed);
  if (streamed != streaming) {
    trials_.emplace_back(bytes, seconds);
  } else {
    std::pair<double, int>& same = in_force_[bytes];
    same.first += seconds;
    same.second += 1;
  }
  if (++counted_ < kPeriod) return streaming;
  // The end of a period: each trial against the mean of the calls of its size in force.
  double ratio_sum = 0;
  int compared = 0;
  for (const auto& [trial_bytes, trial_seconds] : trials_) {
    auto it = in_force_.find(trial_bytes);
    if (it == in_force_.end() || it->second.first <= 0) continue;
    ratio_sum += trial_seconds / (it->second.first / it->second.second);
    ++compared;
  }
  counted_ = 0;
  trials_.clear();
  in_force_.clear();
  if (compared > 0 && ratio_sum / compared < 1.0 - kMargin) return !streaming;
  return streaming;
}

}  // namespace substrax::shm
