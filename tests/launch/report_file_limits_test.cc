// The report file's limits (contract/report_file.h) are the coordinator's (coordinator/limits.h):
// the contract cannot include the coordinator's header, so this test, which may see both, holds
// them together. A record the reader accepts must never be refused by the rpc it becomes.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "contract/report_file.h"
#include "coordinator/limits.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

TEST(ReportFileLimitsTest, AreTheCoordinatorsOwn) {
  EXPECT_EQ(kMaxReportMetricNameBytes, limits::kMaxNameBytes);
  EXPECT_EQ(kMaxReportMetrics, limits::kMaxValuesPerReport);
  EXPECT_EQ(kMaxReportMetrics, limits::kMaxFinalMetrics);
  EXPECT_EQ(kMaxReportPathBytes, limits::kMaxPathBytes);
  EXPECT_EQ(kMaxListedCheckpoints, limits::kMaxCheckpointRecords);
  EXPECT_EQ(kMaxReportListingBytes, limits::kMaxCheckpointListingBytes);
}

TEST(ReportFileLimitsTest, TheLargestStepTheReaderAcceptsIsAReportTheCoordinatorAccepts) {
  std::string metrics;
  for (int i = 0; i < kMaxReportMetrics; ++i) {
    absl::StrAppend(&metrics, i == 0 ? "" : ",", "\"",
                    std::string(kMaxReportMetricNameBytes - 3, 'm'), 100 + i, "\":", i);
  }
  const ParsedReportLine parsed =
      ParseReportLine(absl::StrCat(R"({"type":"step","step":1,"metrics":{)", metrics, "}}"));
  ASSERT_EQ(parsed.kind, ParsedReportLine::Kind::kRecord) << parsed.reason;
  v1::Assignment assignment;
  assignment.set_job_id("j");
  assignment.add_local_device_ids(0);
  absl::StatusOr<std::vector<v1::StepReport>> reports =
      ToStepReports(std::get<ReportStep>(parsed.record), assignment, 0);
  ASSERT_TRUE(reports.ok()) << reports.status();
  v1::ReportStepsRequest request;
  for (v1::StepReport& report : *reports) *request.add_reports() = std::move(report);
  ASSERT_EQ(request.reports(0).values_size(), kMaxReportMetrics);
  EXPECT_TRUE(CheckReportLimits(request).ok()) << CheckReportLimits(request);
}

}  // namespace
}  // namespace substrax
