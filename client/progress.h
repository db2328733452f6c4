// substraxctl watch: the progress line of a running job, as a bar redrawn in place on a terminal
// or as plain lines for logs and pipes, and the time-left estimate behind it. Pure; an
// EtaEstimator is not thread-safe (one per watch).
#ifndef SUBSTRAX_CLIENT_PROGRESS_H_
#define SUBSTRAX_CLIENT_PROGRESS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "substrax/v1/job.pb.h"

namespace substrax::ctl {

// Estimates the time left from the step rate seen since the first observation of the current
// run of steps. A step lower than the previous one (a restart from a checkpoint) starts over.
class EtaEstimator {
 public:
  void Observe(absl::Time now, int64_t step);
  // Time left to reach `total_steps`; nullopt until two observations with progress between them.
  std::optional<absl::Duration> Remaining(int64_t total_steps) const;

 private:
  bool started_ = false;
  absl::Time first_time_;
  int64_t first_step_ = 0;
  absl::Time last_time_;
  int64_t last_step_ = 0;
};

// A bar of `width` columns for `fraction` (clamped to [0, 1]): full blocks '█', one partial
// block in eighths ('▏' .. '▉') where the fill ends, spaces after it.
std::string RenderBar(double fraction, int width);

struct ProgressStyle {
  // A terminal: the bar form, fitted to `columns` (the caller redraws it in place with '\r').
  // Otherwise the plain form, one line per update.
  bool terminal = false;
  int columns = 80;
  // The loss trend in Unicode blocks; else in ASCII (client/plot.h RenderSparkline).
  bool unicode = false;
};

// How many of the latest loss reports the trend shows.
inline constexpr int kLossTrendLength = 12;

// The progress of a running job, without a line ending:
//   terminal: "|████▌     | 120/1000 12%  loss=0.5123 █▆▄▃▂▁  accuracy=0.8100  1234 samples/s  ETA 1m05s"
//   plain:    "step 120/1000 (12.0%)  loss=0.5123 trend=^~-._  accuracy=0.8100  samples/s=1234  eta 1m05s"
// `losses` are the job's latest loss reports, oldest first; with two or more, the last
// kLossTrendLength are drawn as a sparkline after the loss. On a terminal the bar narrows (to 10
// columns at least) so the line fits `columns - 1`, dropping the other metrics, the throughput
// and then the trend as needed; if even that does not fit, the bar is left out and the text cut.
std::string RenderProgress(const v1::Job& job, std::optional<absl::Duration> eta,
                           const ProgressStyle& style, const std::vector<double>& losses = {});

// A line for a change of state or attempt while watching:
// "job fashion-mnist-mlp-3 RUNNING (attempt 1): scheduled on 4 devices of 2 workers".
std::string RenderStateChange(const v1::Job& job);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_PROGRESS_H_
