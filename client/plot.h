// substraxctl: metric series drawn in the terminal. `metrics --plot` draws series against the
// step as a character chart; `watch` shows the recent losses as a sparkline beside its bar. Pure
// functions of their arguments (no environment, no terminal queries); thread-safe.
#ifndef SUBSTRAX_CLIENT_PLOT_H_
#define SUBSTRAX_CLIENT_PLOT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "substrax/v1/metrics_service.pb.h"

namespace substrax::ctl {

// One line of a chart: a label for the legend and (step, value) points in any order.
struct PlotSeries {
  std::string label;
  std::vector<std::pair<int64_t, double>> points;
};

// The smallest chart RenderPlot draws; smaller sizes are raised to these.
inline constexpr int kMinPlotWidth = 20;
inline constexpr int kMinPlotHeight = 6;
// The height of a chart when the terminal's is unknown.
inline constexpr int kDefaultPlotHeight = 20;

struct PlotOptions {
  // Columns of every line at most, and lines of the chart exactly (legend included).
  int width = 80;
  int height = 20;
  // ANSI colours for the series' glyphs (a terminal, NO_COLOR unset).
  bool color = false;
};

// The series drawn against the step, as `height` lines (each ending in '\n', none wider than
// `width` columns, no trailing spaces), ASCII only, from the top:
//   the plot rows, the y-axis on the left with value labels (top: the largest value, bottom: the
//   smallest); the x-axis; the step labels (first, middle, last); the legend, one "G label" per
//   series, G its glyph ('*', 'o', 'x', '#', '@', '%', '&', '=', then letters).
// Each series is one mark per column: the mean of its points in the column, interpolated over
// columns between its points. A later series is drawn over an earlier one where they meet.
// NaN and infinite values are left out (the legend says how many); a constant series is drawn
// across the middle; a single step is drawn in the middle column.
std::string RenderPlot(const std::vector<PlotSeries>& series, const PlotOptions& options);

// The series of a QueryMetrics response, labelled as the metrics table heads its columns:
// "loss", or "loss/host-a" for a group.
std::vector<PlotSeries> PlotSeriesOf(const v1::QueryMetricsResponse& response);

// The last `width` values (fewer if there are fewer), one glyph each, scaled from the smallest
// (lowest glyph) to the largest (highest glyph) among them: Unicode blocks "▁▂▃▄▅▆▇█", or the
// ASCII "_.-~^" when `unicode` is false. Equal values take the middle glyph; NaN and infinite
// values are '?'. Empty for no values or width <= 0.
std::string RenderSparkline(const std::vector<double>& values, int width, bool unicode);

// Whether the locale the environment names is UTF-8: the first non-empty of LC_ALL, LC_CTYPE
// and LANG ends in ".UTF-8" or ".utf8" (any case, any "@modifier" after it).
bool LocaleIsUtf8(absl::string_view lc_all, absl::string_view lc_ctype, absl::string_view lang);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_PLOT_H_
