#include "client/progress.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/format.h"
#include "client/plot.h"

namespace substrax::ctl {

void EtaEstimator::Observe(absl::Time now, int64_t step) {
  if (!started_ || step < last_step_) {
    started_ = true;
    first_time_ = now;
    first_step_ = step;
  }
  last_time_ = now;
  last_step_ = step;
}

std::optional<absl::Duration> EtaEstimator::Remaining(int64_t total_steps) const {
  if (!started_ || last_step_ <= first_step_ || last_time_ <= first_time_) return std::nullopt;
  const double seconds_per_step =
      absl::ToDoubleSeconds(last_time_ - first_time_) / static_cast<double>(last_step_ - first_step_);
  return absl::Seconds(seconds_per_step * static_cast<double>(std::max<int64_t>(0, total_steps - last_step_)));
}

std::string RenderBar(double fraction, int width) {
  static const char* const kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  if (width <= 0) return "";
  if (!(fraction > 0)) fraction = 0;  // also NaN
  fraction = std::min(fraction, 1.0);
  const int eighths = static_cast<int>(std::floor(fraction * width * 8));
  const int full = eighths / 8;
  const int partial = eighths % 8;
  std::string bar;
  for (int i = 0; i < full; ++i) bar += "█";
  int used = full;
  if (partial > 0) {
    bar += kEighths[partial];
    ++used;
  }
  bar.append(width - used, ' ');
  return bar;
}

std::string RenderProgress(const v1::Job& job, std::optional<absl::Duration> eta,
                           const ProgressStyle& style, const std::vector<double>& losses) {
  const v1::JobProgress& p = job.progress();
  const double fraction =
      p.total_steps() > 0 ? static_cast<double>(p.step()) / p.total_steps() : 0.0;
  const bool has_loss = p.metrics().count("loss") > 0;
  std::string trend;
  if (has_loss && losses.size() >= 2) {
    trend = RenderSparkline(losses, kLossTrendLength, style.unicode);
    if (!style.terminal) trend = "trend=" + trend;
  }
  // "loss=X", its trend after it when there is one.
  std::string loss;
  if (has_loss) {
    loss = absl::StrCat("loss=", FormatMetricValue(p.metrics().at("loss")));
    if (!trend.empty()) absl::StrAppend(&loss, " ", trend);
  }
  // The loss pair comes first; the trend goes after it.
  std::string metrics = FormatMetricPairs(p.metrics(), "  ", "step");
  if (!trend.empty()) metrics.replace(0, std::min(metrics.find("  "), metrics.size()), loss);
  if (!style.terminal) {
    std::string line = absl::StrFormat("step %d/%d (%.1f%%)", p.step(), p.total_steps(),
                                       100 * fraction);
    if (!metrics.empty()) absl::StrAppend(&line, "  ", metrics);
    if (p.samples_per_second() > 0) {
      absl::StrAppendFormat(&line, "  samples/s=%.0f", p.samples_per_second());
    }
    if (eta.has_value()) absl::StrAppend(&line, "  eta ", FormatShortDuration(*eta));
    return line;
  }
  // The text after the bar, with less in it as the terminal narrows: all metrics, then loss
  // only, then without the throughput, then without the trend.
  auto text_with = [&](bool all_metrics, bool throughput, bool with_trend) {
    std::string text =
        absl::StrFormat(" %d/%d %.0f%%", p.step(), p.total_steps(), 100 * fraction);
    if (all_metrics && !metrics.empty()) absl::StrAppend(&text, "  ", metrics);
    if (!all_metrics && has_loss) {
      absl::StrAppend(&text, "  ", with_trend ? loss : loss.substr(0, loss.find(' ')));
    }
    if (throughput && p.samples_per_second() > 0) {
      absl::StrAppendFormat(&text, "  %.0f samples/s", p.samples_per_second());
    }
    if (eta.has_value()) absl::StrAppend(&text, "  ETA ", FormatShortDuration(*eta));
    return text;
  };
  // The last column stays free: writing into it makes some terminals wrap.
  const int room = style.columns - 1;
  constexpr int kMinBar = 10;
  constexpr int kMaxBar = 30;
  struct Variant {
    bool all_metrics, throughput, trend;
  };
  for (const Variant& v : {Variant{true, true, true}, Variant{false, true, true},
                           Variant{false, false, true}, Variant{false, false, false}}) {
    const std::string text = text_with(v.all_metrics, v.throughput, v.trend);
    const int bar_width =
        std::min(kMaxBar, room - static_cast<int>(DisplayWidth(text)) - 2);  // the two '|'
    if (bar_width >= kMinBar) return absl::StrCat("|", RenderBar(fraction, bar_width), "|", text);
  }
  // Too narrow for a bar: the shortest text alone, cut to fit (it is ASCII).
  std::string plain = text_with(false, false, false).substr(1);
  if (static_cast<int>(plain.size()) > room) plain.resize(std::max(0, room));
  return plain;
}

std::string RenderStateChange(const v1::Job& job) {
  std::string line = absl::StrCat("job ", job.id(), " ", JobStateName(job.state()));
  if (job.attempt() > 0) absl::StrAppend(&line, " (attempt ", job.attempt(), ")");
  // The reason of the latest transition into this state.
  for (int i = job.transitions_size() - 1; i >= 0; --i) {
    const v1::JobTransition& t = job.transitions(i);
    if (t.to() != job.state()) continue;
    if (!t.reason().empty()) absl::StrAppend(&line, ": ", t.reason());
    break;
  }
  return line;
}

}  // namespace substrax::ctl
