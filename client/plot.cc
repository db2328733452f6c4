#include "client/plot.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/format.h"

namespace substrax::ctl {
namespace {

// Glyphs that stay apart at a glance; '+', '|' and '-' are the axes'.
constexpr char kGlyphs[] = "*ox#@%&=ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
constexpr int kNumGlyphs = sizeof(kGlyphs) - 1;
const char* const kPalette[] = {kCyan, kYellow, kGreen, kMagenta, kBlue, kRed};

char GlyphOf(size_t series) { return kGlyphs[series % kNumGlyphs]; }
const char* ColorOf(size_t series) { return kPalette[series % std::size(kPalette)]; }

// A value label with as many decimals as the distance `resolution` between two rows needs,
// %g for magnitudes that would make fixed notation long.
std::string AxisLabel(double value, double resolution, double magnitude) {
  if (magnitude >= 1e6 || (magnitude > 0 && magnitude < 1e-4)) {
    return absl::StrFormat("%.3g", value);
  }
  int decimals = 0;
  if (resolution > 0) {
    decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(resolution))) + 1, 0, 6);
  }
  std::string label = absl::StrFormat("%.*f", decimals, value);
  if (absl::StartsWith(label, "-0") && label.find_first_not_of("-0.") == std::string::npos) {
    label.erase(0, 1);  // no "-0.00"
  }
  return label;
}

// One character cell of the chart and the series that drew it (-1: none, an axis or text).
struct CellMark {
  char ch = ' ';
  int series = -1;
};

// The line without trailing spaces, each series' glyph in its colour when `color`.
std::string RenderLine(const std::vector<CellMark>& cells, bool color) {
  size_t end = cells.size();
  while (end > 0 && cells[end - 1].ch == ' ') --end;
  std::string line;
  int open = -1;  // the series whose colour is on
  for (size_t i = 0; i < end; ++i) {
    const int series = color ? cells[i].series : -1;
    if (series != open) {
      if (open >= 0) line += kReset;
      if (series >= 0) line += ColorOf(series);
      open = series;
    }
    line += cells[i].ch;
  }
  if (open >= 0) line += kReset;
  return line + "\n";
}

void Put(std::vector<CellMark>* cells, size_t at, absl::string_view text, int series = -1) {
  for (size_t i = 0; i < text.size() && at + i < cells->size(); ++i) {
    (*cells)[at + i] = {text[i], series};
  }
}

// The legend: "G label" entries three spaces apart, wrapped into lines of `width`; an entry
// wider than a line is cut. At most `max_lines` lines: the last then says how many are left out.
std::vector<std::vector<CellMark>> Legend(const std::vector<std::string>& entries, size_t width,
                                          size_t max_lines) {
  std::vector<std::vector<CellMark>> lines;
  std::vector<size_t> first_entry;  // the entry each line starts with
  size_t used = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const size_t gap = used == 0 ? 0 : 3;
    if (lines.empty() || used + gap + entries[i].size() > width) {
      lines.emplace_back(width);
      first_entry.push_back(i);
      used = 0;
    } else {
      used += gap;
    }
    Put(&lines.back(), used, entries[i], static_cast<int>(i));
    // Only the glyph is coloured: the label reads the same in any colour scheme.
    for (size_t j = used + 1; j < std::min(width, used + entries[i].size()); ++j) {
      lines.back()[j].series = -1;
    }
    used = std::min(width, used + entries[i].size());
  }
  if (lines.size() > max_lines && max_lines > 0) {
    const size_t left_out = entries.size() - first_entry[max_lines - 1];
    lines.resize(max_lines);
    lines.back() = std::vector<CellMark>(width);
    Put(&lines.back(), 0, absl::StrCat("... and ", left_out, " more series"));
  }
  return lines;
}

// The finite points of each series sorted by step, the legend entries, and the ranges the
// points span (a band around a constant value; 0..1 when there are none).
struct PlotPoints {
  std::vector<std::vector<std::pair<int64_t, double>>> finite;
  std::vector<std::string> entries;
  bool any = false;
  int64_t x_lo = std::numeric_limits<int64_t>::max();
  int64_t x_hi = std::numeric_limits<int64_t>::min();
  double y_lo = std::numeric_limits<double>::infinity();
  double y_hi = -std::numeric_limits<double>::infinity();
};

PlotPoints FinitePoints(const std::vector<PlotSeries>& series) {
  PlotPoints p;
  p.finite.resize(series.size());
  for (size_t s = 0; s < series.size(); ++s) {
    for (const auto& [step, value] : series[s].points) {
      if (!std::isfinite(value)) continue;
      p.finite[s].emplace_back(step, value);
      p.x_lo = std::min(p.x_lo, step);
      p.x_hi = std::max(p.x_hi, step);
      p.y_lo = std::min(p.y_lo, value);
      p.y_hi = std::max(p.y_hi, value);
    }
    std::sort(p.finite[s].begin(), p.finite[s].end());
    std::string entry = absl::StrCat(std::string(1, GlyphOf(s)), " ", series[s].label);
    const size_t dropped = series[s].points.size() - p.finite[s].size();
    if (p.finite[s].empty()) {
      absl::StrAppend(&entry, " (no finite values)");
    } else if (dropped > 0) {
      absl::StrAppend(&entry, " (", dropped, " NaN/inf left out)");
    }
    p.entries.push_back(std::move(entry));
  }
  p.any = p.x_lo <= p.x_hi;
  if (!p.any) {
    p.x_lo = p.x_hi = 0;
    p.y_lo = 0;
    p.y_hi = 1;
  }
  if (p.y_lo == p.y_hi) {  // constant: a band around the value, the line in its middle
    const double half = p.y_lo == 0 ? 1 : std::fabs(p.y_lo) / 2;
    p.y_lo -= half;
    p.y_hi += half;
  }
  return p;
}

// The y labels of `rows` plot rows from y_hi down to y_lo: top, bottom, and every fourth row
// between while two rows from the bottom ("" elsewhere).
std::vector<std::string> YLabels(double y_lo, double y_hi, size_t rows) {
  const double resolution = (y_hi - y_lo) / static_cast<double>(rows - 1);
  const double magnitude = std::max(std::fabs(y_lo), std::fabs(y_hi));
  std::vector<std::string> labels(rows);
  for (size_t r = 0; r < rows; ++r) {
    if (r == 0 || r == rows - 1 || (r % 4 == 0 && r + 2 < rows)) {
      const double value =
          y_hi - (y_hi - y_lo) * static_cast<double>(r) / static_cast<double>(rows - 1);
      labels[r] = AxisLabel(value, resolution, magnitude);
    }
  }
  return labels;
}

// Where things go in a chart `width` wide: the label margin, the y-axis, the plot's columns and
// rows, and the cell of a point.
struct PlotFrame {
  PlotFrame(const PlotPoints& points, size_t width, size_t rows, size_t label_width)
      : x_lo(points.x_lo),
        x_hi(points.x_hi),
        y_lo(points.y_lo),
        y_hi(points.y_hi),
        rows(rows),
        label_width(label_width),
        margin(label_width + 1),  // a space before the axis
        axis(margin + 1),         // first plot column, right of '|'
        columns(width - axis) {}

  size_t ColumnOf(int64_t step) const {
    if (x_hi == x_lo) return (columns - 1) / 2;
    const double f = static_cast<double>(step - x_lo) / static_cast<double>(x_hi - x_lo);
    return static_cast<size_t>(std::llround(f * static_cast<double>(columns - 1)));
  }
  size_t RowOf(double value) const {
    const double f = (y_hi - value) / (y_hi - y_lo);
    return static_cast<size_t>(
        std::clamp<long long>(std::llround(f * static_cast<double>(rows - 1)), 0,
                              static_cast<long long>(rows - 1)));
  }

  int64_t x_lo, x_hi;
  double y_lo, y_hi;
  size_t rows;         // plot rows
  size_t label_width;  // the y labels' column width
  size_t margin;       // the y-axis' column
  size_t axis;         // first plot column
  size_t columns;      // plot columns
};

// Draws series `s`: the mean of its points in each column, then straight lines between those
// columns.
void DrawSeries(const std::vector<std::pair<int64_t, double>>& points, size_t s,
                const PlotFrame& frame, std::vector<std::vector<CellMark>>* grid) {
  std::vector<double> sum(frame.columns, 0);
  std::vector<int> count(frame.columns, 0);
  for (const auto& [step, value] : points) {
    const size_t c = frame.ColumnOf(step);
    sum[c] += value;
    ++count[c];
  }
  const CellMark mark = {GlyphOf(s), static_cast<int>(s)};
  std::optional<size_t> previous;
  for (size_t c = 0; c < frame.columns; ++c) {
    if (count[c] == 0) continue;
    const double value = sum[c] / count[c];
    if (previous.has_value()) {
      const double from = sum[*previous] / count[*previous];
      for (size_t between = *previous + 1; between < c; ++between) {
        const double f =
            static_cast<double>(between - *previous) / static_cast<double>(c - *previous);
        (*grid)[frame.RowOf(from + (value - from) * f)][frame.axis + between] = mark;
      }
    }
    (*grid)[frame.RowOf(value)][frame.axis + c] = mark;
    previous = c;
  }
}

// Step labels under their columns: the first, the last and the middle, where they fit with two
// spaces between them (none when there are no points).
std::vector<CellMark> StepLabels(const PlotFrame& frame, size_t width, bool any) {
  std::vector<CellMark> x_labels(width);
  std::vector<std::pair<size_t, size_t>> taken;  // [begin, end) of placed labels
  auto place = [&](int64_t step, size_t column) {
    const std::string text = absl::StrCat(step);
    const size_t center = frame.axis + column;
    size_t begin = center >= text.size() / 2 ? center - text.size() / 2 : 0;
    begin = std::min(begin, width - std::min(width, text.size()));
    const size_t end = begin + text.size();
    for (const auto& [b, e] : taken) {
      if (begin < e + 2 && b < end + 2) return;
    }
    taken.emplace_back(begin, end);
    Put(&x_labels, begin, text);
  };
  if (any) {
    place(frame.x_lo, frame.ColumnOf(frame.x_lo));
    if (frame.x_hi != frame.x_lo) {
      place(frame.x_hi, frame.columns - 1);
      const int64_t middle = frame.x_lo + (frame.x_hi - frame.x_lo) / 2;
      place(middle, frame.ColumnOf(middle));
    }
  }
  return x_labels;
}

}  // namespace

std::string RenderPlot(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  const size_t width = static_cast<size_t>(std::max(options.width, kMinPlotWidth));
  const size_t height = static_cast<size_t>(std::max(options.height, kMinPlotHeight));
  const PlotPoints points = FinitePoints(series);

  // Rows: the plot, the x-axis, the step labels, the legend (at least two plot rows).
  std::vector<std::vector<CellMark>> legend = Legend(points.entries, width, height - 4);
  const size_t rows = height - 2 - legend.size();
  const std::vector<std::string> labels = YLabels(points.y_lo, points.y_hi, rows);
  size_t label_width = 0;
  for (const std::string& label : labels) label_width = std::max(label_width, label.size());
  // Labels wider than half the chart are cut from the right (only absurd widths).
  const PlotFrame frame(points, width, rows, std::min(label_width, width / 2));

  std::vector<std::vector<CellMark>> grid(rows, std::vector<CellMark>(width));
  for (size_t r = 0; r < rows; ++r) {
    Put(&grid[r], frame.label_width - std::min(frame.label_width, labels[r].size()),
        labels[r].substr(0, frame.label_width));
    grid[r][frame.margin].ch = '|';
  }
  for (size_t s = 0; s < series.size(); ++s) {
    if (!points.finite[s].empty()) DrawSeries(points.finite[s], s, frame, &grid);
  }

  std::string out;
  for (const auto& line : grid) out += RenderLine(line, options.color);
  std::vector<CellMark> x_axis(width);
  x_axis[frame.margin].ch = '+';
  for (size_t c = 0; c < frame.columns; ++c) x_axis[frame.axis + c].ch = '-';
  out += RenderLine(x_axis, false);
  out += RenderLine(StepLabels(frame, width, points.any), false);
  for (const auto& line : legend) out += RenderLine(line, options.color);
  return out;
}

std::vector<PlotSeries> PlotSeriesOf(const v1::QueryMetricsResponse& response) {
  std::vector<PlotSeries> out;
  for (const v1::MetricSeries& s : response.series()) {
    PlotSeries& series = out.emplace_back();
    series.label = s.group().empty() ? s.name() : absl::StrCat(s.name(), "/", s.group());
    for (const v1::MetricPoint& p : s.points()) series.points.emplace_back(p.step(), p.value());
  }
  return out;
}

std::string RenderSparkline(const std::vector<double>& values, int width, bool unicode) {
  static const char* const kBlocks[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  static const char* const kAscii[] = {"_", ".", "-", "~", "^"};
  const char* const* levels = unicode ? kBlocks : kAscii;
  const int num_levels = unicode ? 8 : 5;
  if (width <= 0 || values.empty()) return "";
  const size_t n = std::min(values.size(), static_cast<size_t>(width));
  const std::vector<double> recent(values.end() - static_cast<std::ptrdiff_t>(n), values.end());
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  for (double v : recent) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  std::string line;
  for (double v : recent) {
    if (!std::isfinite(v)) {
      line += "?";
    } else if (hi == lo) {
      line += levels[num_levels / 2];
    } else {
      const long level = std::lround((v - lo) / (hi - lo) * (num_levels - 1));
      line += levels[std::clamp<long>(level, 0, num_levels - 1)];
    }
  }
  return line;
}

bool LocaleIsUtf8(absl::string_view lc_all, absl::string_view lc_ctype, absl::string_view lang) {
  absl::string_view locale = !lc_all.empty() ? lc_all : !lc_ctype.empty() ? lc_ctype : lang;
  locale = locale.substr(0, locale.find('@'));
  const std::string lower = absl::AsciiStrToLower(locale);
  return absl::EndsWith(lower, ".utf-8") || absl::EndsWith(lower, ".utf8");
}

}  // namespace substrax::ctl
