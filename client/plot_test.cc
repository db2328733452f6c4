#include "client/plot.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "client/format.h"
#include "gtest/gtest.h"

namespace substrax::ctl {
namespace {

PlotSeries Series(const std::string& label, int n, double (*f)(int)) {
  PlotSeries s{label, {}};
  for (int i = 0; i < n; ++i) s.points.emplace_back(100 * i, f(i));
  return s;
}

std::vector<std::string> Lines(const std::string& chart) {
  std::vector<std::string> lines = absl::StrSplit(chart, '\n');
  EXPECT_EQ(lines.back(), "") << "the chart ends with a newline";
  lines.pop_back();
  return lines;
}

// The plot rows: the lines above the x-axis ("+---").
std::vector<std::string> PlotRows(const std::vector<std::string>& lines) {
  std::vector<std::string> rows;
  for (const std::string& line : lines) {
    if (absl::StrContains(line, "+--")) break;
    rows.push_back(line);
  }
  return rows;
}

// For each column right of the y-axis, the row `glyph` is drawn in (-1: none).
std::vector<int> RowPerColumn(const std::vector<std::string>& rows, char glyph) {
  const size_t axis = rows[0].find('|');
  size_t width = 0;
  for (const std::string& r : rows) width = std::max(width, r.size());
  std::vector<int> out;
  for (size_t c = axis + 1; c < width; ++c) {
    int found = -1;
    for (size_t r = 0; r < rows.size(); ++r) {
      if (c < rows[r].size() && rows[r][c] == glyph) {
        EXPECT_EQ(found, -1) << "two marks of one series in column " << c;
        found = static_cast<int>(r);
      }
    }
    out.push_back(found);
  }
  return out;
}

void ExpectSize(const std::string& chart, int width, int height) {
  const std::vector<std::string> lines = Lines(chart);
  EXPECT_EQ(lines.size(), static_cast<size_t>(height)) << chart;
  for (const std::string& line : lines) {
    EXPECT_LE(DisplayWidth(line), static_cast<size_t>(width)) << line;
    EXPECT_FALSE(absl::EndsWith(line, " ")) << "trailing space: '" << line << "'";
  }
}

TEST(RenderPlotTest, DecreasingSeriesNeverGoesUpAndSpansTheChart) {
  const std::string chart =
      RenderPlot({Series("loss", 50, [](int i) { return 2.3 * std::exp(-i / 10.0); })},
                 {60, 15, false});
  ExpectSize(chart, 60, 15);
  const std::vector<std::string> lines = Lines(chart);
  const std::vector<std::string> rows = PlotRows(lines);
  const std::vector<int> row = RowPerColumn(rows, '*');
  int previous = 0;
  for (size_t c = 0; c < row.size(); ++c) {
    ASSERT_NE(row[c], -1) << "column " << c << " has no mark:\n" << chart;
    EXPECT_GE(row[c], previous) << "column " << c << " goes up:\n" << chart;
    previous = row[c];
  }
  EXPECT_EQ(row.front(), 0) << chart;  // the largest value at the top
  EXPECT_EQ(row.back(), static_cast<int>(rows.size()) - 1) << chart;
  // y labels: the range's ends; x labels: first and last step; the legend.
  EXPECT_TRUE(absl::StartsWith(rows.front(), "2.30")) << chart;
  EXPECT_TRUE(absl::StartsWith(rows.back(), "0.02")) << chart;
  const std::string& steps = lines[rows.size() + 1];
  EXPECT_TRUE(absl::StrContains(steps, "0")) << chart;
  EXPECT_TRUE(absl::EndsWith(steps, "4900")) << chart;
  EXPECT_EQ(lines.back(), "* loss");
}

TEST(RenderPlotTest, IncreasingSeriesNeverGoesDown) {
  const std::string chart =
      RenderPlot({Series("accuracy", 7, [](int i) { return 0.1 * i * i; })}, {60, 15, false});
  ExpectSize(chart, 60, 15);
  const std::vector<int> row = RowPerColumn(PlotRows(Lines(chart)), '*');
  int previous = std::numeric_limits<int>::max();
  for (size_t c = 0; c < row.size(); ++c) {
    ASSERT_NE(row[c], -1) << "column " << c << ":\n" << chart;
    EXPECT_LE(row[c], previous) << "column " << c << ":\n" << chart;
    previous = row[c];
  }
  EXPECT_EQ(row.front(), 11) << chart;  // 15 rows: 12 plot rows, axis, steps, legend
  EXPECT_EQ(row.back(), 0) << chart;
}

TEST(RenderPlotTest, TwoSeriesWithTheirGlyphsAndLegend) {
  const std::string chart =
      RenderPlot({Series("loss/host-a", 20, [](int i) { return 1.0 / (1 + i); }),
                  Series("loss/host-b", 20, [](int i) { return 0.5 + 0.01 * i; })},
                 {60, 15, false});
  ExpectSize(chart, 60, 15);
  const std::vector<std::string> lines = Lines(chart);
  EXPECT_EQ(lines.back(), "* loss/host-a   o loss/host-b");
  const std::vector<std::string> rows = PlotRows(lines);
  int stars = 0, os = 0;
  for (const std::string& r : rows) {
    stars += std::count(r.begin(), r.end(), '*');
    os += std::count(r.begin(), r.end(), 'o');
  }
  EXPECT_GT(stars, 30) << chart;
  EXPECT_GT(os, 30) << chart;
}

TEST(RenderPlotTest, ColourOnlyWhenAsked) {
  const std::vector<PlotSeries> series = {Series("a", 5, [](int i) { return 1.0 * i; }),
                                          Series("b", 5, [](int i) { return 5.0 - i; })};
  const std::string plain = RenderPlot(series, {60, 15, false});
  EXPECT_FALSE(absl::StrContains(plain, "\x1b")) << plain;
  const std::string coloured = RenderPlot(series, {60, 15, true});
  // A run of one series' glyphs is one escape sequence; the legend's labels are not coloured.
  EXPECT_TRUE(absl::StrContains(coloured, std::string(kCyan) + "**" + kReset)) << coloured;
  EXPECT_TRUE(absl::StrContains(coloured, std::string(kYellow) + "oo" + kReset)) << coloured;
  EXPECT_TRUE(absl::StrContains(coloured, std::string(kCyan) + "*" + kReset + " a   " + kYellow +
                                              "o" + kReset + " b"))
      << coloured;
  ExpectSize(coloured, 60, 15);  // escapes take no columns
}

TEST(RenderPlotTest, DegenerateSeriesDrawWithoutCrashing) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  // One point: in the middle column, its step labelled.
  std::string chart = RenderPlot({{"loss", {{42, 0.5}}}}, {60, 15, false});
  ExpectSize(chart, 60, 15);
  std::vector<int> row = RowPerColumn(PlotRows(Lines(chart)), '*');
  EXPECT_EQ(std::count_if(row.begin(), row.end(), [](int r) { return r >= 0; }), 1) << chart;
  EXPECT_TRUE(absl::StrContains(chart, "42")) << chart;
  // Constant: a flat line across the middle.
  chart = RenderPlot({Series("loss", 10, [](int) { return 0.25; })}, {60, 15, false});
  ExpectSize(chart, 60, 15);
  row = RowPerColumn(PlotRows(Lines(chart)), '*');
  for (int r : row) EXPECT_EQ(r, 6) << chart;
  // NaN and inf are left out and counted in the legend.
  chart = RenderPlot({{"loss", {{0, 1.0}, {1, nan}, {2, inf}, {3, 0.5}}}, {"nan", {{0, nan}}}},
                     {60, 15, false});
  ExpectSize(chart, 60, 15);
  EXPECT_TRUE(absl::StrContains(chart, "* loss (2 NaN/inf left out)")) << chart;
  EXPECT_TRUE(absl::StrContains(chart, "o nan (no finite values)")) << chart;
  // Nothing at all, and a size below the minimum (raised to it).
  chart = RenderPlot({}, {1, 1, false});
  ExpectSize(chart, kMinPlotWidth, kMinPlotHeight);
  chart = RenderPlot({Series("zero", 3, [](int) { return 0.0; })}, {20, 6, false});
  ExpectSize(chart, 20, 6);
}

TEST(RenderPlotTest, ManySeriesKeepTheHeight) {
  std::vector<PlotSeries> series;
  for (int d = 0; d < 40; ++d) {
    series.push_back({"loss/device-" + std::to_string(d), {{0, 1.0 * d}, {10, 2.0 * d}}});
  }
  const std::string chart = RenderPlot(series, {60, 12, false});
  ExpectSize(chart, 60, 12);
  EXPECT_TRUE(absl::StrContains(chart, "more series")) << chart;
}

TEST(PlotSeriesOfTest, LabelsAsTheMetricsTable) {
  v1::QueryMetricsResponse response;
  v1::MetricSeries* s = response.add_series();
  s->set_name("loss");
  s->set_group("host-a");
  v1::MetricPoint* p = s->add_points();
  p->set_step(7);
  p->set_value(0.5);
  response.add_series()->set_name("accuracy");
  const std::vector<PlotSeries> series = PlotSeriesOf(response);
  ASSERT_EQ(series.size(), 2u);
  EXPECT_EQ(series[0].label, "loss/host-a");
  EXPECT_EQ(series[0].points, (std::vector<std::pair<int64_t, double>>{{7, 0.5}}));
  EXPECT_EQ(series[1].label, "accuracy");
}

// The level (0 = lowest) of each glyph of a sparkline.
std::vector<int> Levels(const std::string& line, bool unicode) {
  const std::vector<std::string> glyphs =
      unicode ? std::vector<std::string>{"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"}
              : std::vector<std::string>{"_", ".", "-", "~", "^"};
  std::vector<int> levels;
  size_t at = 0;
  while (at < line.size()) {
    bool matched = false;
    for (size_t g = 0; g < glyphs.size(); ++g) {
      if (line.compare(at, glyphs[g].size(), glyphs[g]) == 0) {
        levels.push_back(static_cast<int>(g));
        at += glyphs[g].size();
        matched = true;
        break;
      }
    }
    if (!matched) {
      ADD_FAILURE() << "unexpected glyph at " << at << " in '" << line << "'";
      break;
    }
  }
  return levels;
}

TEST(RenderSparklineTest, MonotoneInputGivesMonotoneGlyphs) {
  std::vector<double> falling;
  for (int i = 0; i < 30; ++i) falling.push_back(2.0 / (1 + i));
  for (bool unicode : {true, false}) {
    const std::string line = RenderSparkline(falling, 12, unicode);
    const std::vector<int> levels = Levels(line, unicode);
    ASSERT_EQ(levels.size(), 12u) << line;  // the last 12 values
    for (size_t i = 1; i < levels.size(); ++i) EXPECT_LE(levels[i], levels[i - 1]) << line;
    EXPECT_EQ(levels.front(), unicode ? 7 : 4) << line;
    EXPECT_EQ(levels.back(), 0) << line;
  }
  EXPECT_EQ(RenderSparkline({1, 2, 3, 4, 5, 6, 7, 8}, 20, true), "▁▂▃▄▅▆▇█");
  EXPECT_EQ(RenderSparkline({1, 2, 3, 4, 5}, 20, false), "_.-~^");
}

TEST(RenderSparklineTest, ConstantEmptyAndNonFinite) {
  EXPECT_EQ(RenderSparkline({0.3, 0.3, 0.3}, 10, true), "▅▅▅");
  EXPECT_EQ(RenderSparkline({0.3, 0.3, 0.3}, 10, false), "---");
  EXPECT_EQ(RenderSparkline({}, 10, true), "");
  EXPECT_EQ(RenderSparkline({1, 2}, 0, true), "");
  EXPECT_EQ(RenderSparkline({1, std::nan(""), 2}, 10, false), "_?^");
}

TEST(LocaleIsUtf8Test, FirstNonEmptyOfLcAllLcCtypeLang) {
  EXPECT_TRUE(LocaleIsUtf8("", "", "en_US.UTF-8"));
  EXPECT_TRUE(LocaleIsUtf8("", "C.utf8", "C"));
  EXPECT_TRUE(LocaleIsUtf8("de_DE.UTF-8@euro", "", ""));
  EXPECT_FALSE(LocaleIsUtf8("C", "", "en_US.UTF-8"));
  EXPECT_FALSE(LocaleIsUtf8("", "", ""));
  EXPECT_FALSE(LocaleIsUtf8("", "", "POSIX"));
}

}  // namespace
}  // namespace substrax::ctl
