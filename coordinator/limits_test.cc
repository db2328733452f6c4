#include "coordinator/limits.h"

#include <string>

#include "gtest/gtest.h"

namespace substrax {
namespace {

TEST(LimitsTest, BoundedTextCutsAtACharacterAndSaysHowMuch) {
  EXPECT_EQ(BoundedText("short", 10), "short");
  EXPECT_EQ(BoundedText("abcdefghij", 4), "abcd ... (6 more bytes)");
  // "é" is two bytes: a cut inside it backs off to before it.
  EXPECT_EQ(BoundedText("ab\xc3\xa9z", 3), "ab ... (3 more bytes)");
}

TEST(LimitsTest, ReportLimitsNameTheField) {
  v1::ReportStepsRequest request;
  for (int i = 0; i < limits::kMaxReportsPerRequest + 1; ++i) request.add_reports();
  absl::Status too_many = CheckReportLimits(request);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_many.message().find("reports: 4097 in one request"), std::string::npos)
      << too_many;

  v1::ReportStepsRequest wide;
  auto* values = wide.add_reports()->mutable_values();
  for (int i = 0; i < limits::kMaxValuesPerReport + 1; ++i) (*values)[std::to_string(i)] = 1;
  EXPECT_NE(CheckReportLimits(wide).message().find("reports[0].values: 65 metrics"),
            std::string::npos);

  v1::ReportStepsRequest long_name;
  (*long_name.add_reports()->mutable_values())[std::string(300, 'x')] = 1;
  EXPECT_EQ(CheckReportLimits(long_name).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckReportLimits(v1::ReportStepsRequest()).ok());
}

}  // namespace
}  // namespace substrax
