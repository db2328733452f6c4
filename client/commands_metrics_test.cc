// Tests of `substraxctl metrics` against the fake coordinator of commands_test_util.h: the query
// it sends, the table, TensorBoard event files and the terminal chart (--plot).
#include "client/commands.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/commands_test_util.h"
#include "client/tensorboard_export.h"
#include "core/tensorboard_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorboard/event.pb.h"

namespace substrax::ctl {
namespace {

using ::testing::HasSubstr;

TEST_F(CommandsTest, MetricsSendsTheQueryAndTabulatesSeries) {
  MetricsFlags flags;
  flags.names = {"loss,accuracy", "step"};
  flags.steps = "100:";
  flags.reduce = "max";
  flags.group_by = "host";
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "STEP   loss/local-0   loss/local-1   NOTE\n"
            "100    0.1000         0.1000\n"
            "150    0.1500         0.1500         partial (1/2 devices)\n");
  const v1::QueryMetricsRequest q = metrics_.last();
  EXPECT_EQ(q.job_id(), "demo-1");
  EXPECT_EQ(std::vector<std::string>(q.names().begin(), q.names().end()),
            (std::vector<std::string>{"loss", "accuracy", "step"}));
  EXPECT_EQ(q.steps().first(), 100);
  EXPECT_EQ(q.steps().last(), 0);
  EXPECT_EQ(q.reduction(), v1::REDUCTION_MAX);
  EXPECT_EQ(q.group_by(), v1::GROUP_BY_HOST);
  EXPECT_EQ(q.attempt(), 0);
}

TEST_F(CommandsTest, MetricsJsonCarriesTheDeviceCountsOfEveryPoint) {
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", MetricsFlags()), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("\"num_values\": 1"));
  EXPECT_THAT(out_.str(), HasSubstr("\"expected_values\": 2"));
  EXPECT_THAT(out_.str(), HasSubstr("\"partial\": true"));
  EXPECT_THAT(out_.str(), HasSubstr("\"partial\": false"));
}

TEST_F(CommandsTest, MetricsTensorBoardWritesAnEventFileWithHostTags) {
  MetricsFlags flags;
  flags.group_by = "host";
  ctx_.working_directory = ::testing::TempDir();
  flags.tensorboard = "tb/run";  // relative to the working directory, created
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), ::testing::HasSubstr("wrote 2 series over 2 steps (attempt 0) to "));
  const std::string path = out_.str().substr(out_.str().find(" to ") + 4);
  std::ifstream in(path.substr(0, path.size() - 1), std::ios::binary);
  const std::string contents((std::istreambuf_iterator<char>(in)), {});
  absl::StatusOr<std::vector<std::string>> records = ParseTfRecords(contents);
  ASSERT_TRUE(records.ok()) << records.status() << " in " << path;
  ASSERT_EQ(records->size(), 3u);  // the version, steps 100 and 150
  tensorboard::Event event;
  ASSERT_TRUE(event.ParseFromString((*records)[1]));
  EXPECT_EQ(event.step(), 100);
  ASSERT_EQ(event.summary().value_size(), 2);
  EXPECT_EQ(event.summary().value(0).tag(), "loss/host_local-0");
  EXPECT_EQ(event.summary().value(1).tag(), "loss/host_local-1");
  EXPECT_EQ(event.summary().value(1).simple_value(), 0.1f);
}

TEST_F(CommandsTest, MetricsTensorBoardRefusesADirectoryItCannotCreate) {
  MetricsFlags flags;
  flags.tensorboard = WriteFile("not-a-dir", "x") + "/sub";
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitError);
  EXPECT_EQ(out_.str(), "");
  EXPECT_THAT(err_.str(), ::testing::HasSubstr("substraxctl: --tensorboard: cannot create the "
                                               "directory " + flags.tensorboard));
}

TEST(TensorBoardTagTest, GroupsGetDeviceOrHostSuffixes) {
  v1::MetricSeries series;
  series.set_name("loss");
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_NONE), "loss");
  series.set_group("3");
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_DEVICE), "loss/device_3");
  series.set_reduction(v1::REDUCTION_NONE);  // one series per device whatever the grouping
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_HOST), "loss/device_3");
  series.set_reduction(v1::REDUCTION_MEAN);
  series.set_group("a");
  EXPECT_EQ(TensorBoardTag(series, v1::GROUP_BY_HOST), "loss/host_a");
}

TEST_F(CommandsTest, MetricsPlotDrawsTheLossPerGroupAtTheAskedSize) {
  MetricsFlags flags;
  flags.group_by = "host";
  flags.attempt = 1;
  flags.steps = "100:";
  flags.plot = true;
  flags.width = 60;
  flags.height = 15;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  const std::string out = out_.str();
  const std::vector<std::string> lines = absl::StrSplit(absl::StripSuffix(out, "\n"), '\n');
  EXPECT_EQ(lines.size(), 15u) << out;
  for (const std::string& line : lines) EXPECT_LE(DisplayWidth(line), 60u) << line;
  EXPECT_EQ(lines.back(), "* loss/local-0   o loss/local-1") << out;
  EXPECT_THAT(out, HasSubstr("0.1500 |")) << out;
  EXPECT_THAT(out, HasSubstr("100")) << out;
  EXPECT_EQ(out.find('\x1b'), std::string::npos) << "colour is off";
  // Without --name the chart is of the loss; the other flags pass through.
  const v1::QueryMetricsRequest q = metrics_.last();
  EXPECT_EQ(std::vector<std::string>(q.names().begin(), q.names().end()),
            std::vector<std::string>{"loss"});
  EXPECT_EQ(q.group_by(), v1::GROUP_BY_HOST);
  EXPECT_EQ(q.attempt(), 1);
  EXPECT_EQ(q.steps().first(), 100);

  // Sized to the terminal when no size is given, in colour when the context says so.
  out_.str("");
  ctx_.columns = 72;
  ctx_.rows = 30;
  ctx_.color = true;
  flags.width = flags.height = 0;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  const std::string sized = out_.str();
  EXPECT_EQ(std::count(sized.begin(), sized.end(), '\n'), 29) << sized;
  EXPECT_THAT(sized, HasSubstr(std::string(kYellow) + "oo")) << sized;
  std::vector<std::string> sized_lines = absl::StrSplit(sized, '\n');
  size_t widest = 0;
  for (const std::string& line : sized_lines) widest = std::max(widest, DisplayWidth(line));
  EXPECT_EQ(widest, 72u) << sized;  // the x-axis spans the terminal
  // Not a terminal and no $LINES: 20 lines.
  out_.str("");
  ctx_.rows = 0;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  const std::string unsized = out_.str();
  EXPECT_EQ(std::count(unsized.begin(), unsized.end(), '\n'), 20) << unsized;
}

TEST_F(CommandsTest, MetricsPlotFlagsThatCannotWorkAreUsageErrors) {
  MetricsFlags flags;
  flags.plot = true;
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--plot draws a chart for people and cannot be combined "
                                    "with -o json or -o yaml"));
  ctx_.format = OutputFormat::kYaml;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  ctx_.format = OutputFormat::kTable;
  err_.str("");
  flags.width = 10;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--width: 10 columns is too narrow for a chart; give at "
                                    "least 20"));
  flags.width = 0;
  flags.height = -3;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--height: -3 lines is too low"));
  flags.plot = false;
  flags.height = 20;
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--width and --height size the chart of --plot; add --plot"));
  flags.height = 0;
  flags.plot = true;
  flags.tensorboard = "tb";
  EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  EXPECT_THAT(err_.str(), HasSubstr("--plot draws the series and --tensorboard writes them"));
  EXPECT_EQ(metrics_.queries(), 0);
}

TEST_F(CommandsTest, MalformedMetricsFlagsAreUsageErrorsWithoutAnRpc) {
  for (MetricsFlags flags : {MetricsFlags{{}, "", "200:100", ""}, MetricsFlags{{}, "", "x:", ""},
                             MetricsFlags{{}, "median", "", ""},
                             MetricsFlags{{}, "", "", "rack"},
                             MetricsFlags{{}, "", "", "", -1}}) {
    EXPECT_EQ(MetricsCommand(ctx_, "demo-1", flags), kExitUsage);
  }
  EXPECT_EQ(metrics_.queries(), 0);
  EXPECT_NE(err_.str().find("substraxctl: --steps: '200:100': the range is empty"),
            std::string::npos)
      << err_.str();
}

}  // namespace
}  // namespace substrax::ctl
