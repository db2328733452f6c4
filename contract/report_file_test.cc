#include "contract/report_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using Kind = ParsedReportLine::Kind;

std::string TempDir() {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                 "/report_file_test.XXXXXX");
  return mkdtemp(dir.data()) ? dir : "";
}

// Appends `text` as a writing process does (O_APPEND).
void Append(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
}

std::string Types(const std::vector<ReportRecord>& records) {
  std::vector<std::string> types;
  for (const ReportRecord& r : records) types.push_back(ReportRecordType(r));
  return absl::StrJoin(types, ",");
}

// The step of the one record `poll` holds, a step record; -1 when it holds anything else.
int64_t OnlyStep(const ReportPoll& poll) {
  if (poll.records.size() != 1 || !std::holds_alternative<ReportStep>(poll.records[0])) return -1;
  return std::get<ReportStep>(poll.records[0]).step;
}

// Whether `poll` read nothing and said nothing.
bool Empty(const ReportPoll& poll) { return poll.records.empty() && poll.warnings.empty(); }

std::string Step(int64_t step, double loss) {
  return EncodeReportRecord(
      ReportStep{step, {{"loss", loss}}, std::nullopt, std::nullopt, std::nullopt});
}

std::vector<ReportRecord> EveryType() {
  return {
      ReportStep{100, {{"loss", 0.1 + 0.2}, {"accuracy", 0.97}, {"tiny", 1e-300}}, 812.5, 2, 5},
      ReportStep{0, {}, std::nullopt, std::nullopt, std::nullopt},
      ReportTotalSteps{kMaxReportInteger},
      ReportFinal{{{"test_accuracy", 0.9731}, {"nested \"quote\" \\ \x01", -3.5}}},
      ReportCheckpoint{400, "/ckpt/job/step-400", int64_t{1} << 40},
      ReportCheckpoint{0, "/ckpt/job/step-0", std::nullopt},
      ReportResumed{400, "/ckpt/job/step-400"},
      ReportResumed{0, ""},
      ReportHeartbeat{},
  };
}

TEST(ReportRecordTest, EveryTypeReadsBackAsWritten) {
  for (const ReportRecord& record : EveryType()) {
    const std::string line = EncodeReportRecord(record);
    ASSERT_TRUE(absl::EndsWith(line, "\n")) << line;
    ASSERT_EQ(line.find('\n'), line.size() - 1) << line;
    ParsedReportLine parsed = ParseReportLine(absl::StripSuffix(line, "\n"));
    ASSERT_EQ(parsed.kind, Kind::kRecord) << line << parsed.reason;
    EXPECT_EQ(parsed.type, ReportRecordType(record));
    EXPECT_EQ(parsed.record.index(), record.index());
    // Every field, doubles bit for bit: the encoding of what was read is the same line.
    EXPECT_EQ(EncodeReportRecord(parsed.record), line);
  }
}

TEST(ReportRecordTest, ReadsWhatAnotherLanguageWrites) {
  // As Python's json.dumps writes it: spaces, any field order, integers as 100.0, extra fields.
  ParsedReportLine parsed =
      ParseReportLine(R"({"metrics": {"loss": 0.5}, "step": 100.0, "type": "step", "device": null,)"
                      R"( "lr": 0.001, "samples_per_second": 12}  )"
                      "\r");
  ASSERT_EQ(parsed.kind, Kind::kRecord) << parsed.reason;
  const auto& step = std::get<ReportStep>(parsed.record);
  EXPECT_EQ(step.step, 100);
  EXPECT_EQ(step.metrics.at("loss"), 0.5);
  EXPECT_EQ(step.metrics.size(), 1u);
  EXPECT_EQ(step.samples_per_second, 12.0);
  EXPECT_FALSE(step.device.has_value());
  EXPECT_FALSE(step.process.has_value());

  parsed = ParseReportLine(R"({"type":"checkpoint","step":400,"path":"/c/step-400"})");
  ASSERT_EQ(parsed.kind, Kind::kRecord) << parsed.reason;
  EXPECT_EQ(std::get<ReportCheckpoint>(parsed.record).path, "/c/step-400");
  EXPECT_FALSE(std::get<ReportCheckpoint>(parsed.record).size_bytes.has_value());

  EXPECT_EQ(ParseReportLine("   ").kind, Kind::kBlank);
  EXPECT_EQ(ParseReportLine("").kind, Kind::kBlank);
}

TEST(ReportRecordTest, AnUnknownTypeIsNotAnError) {
  const ParsedReportLine parsed =
      ParseReportLine(R"({"type":"gpu_memory","step":"any shape","bytes":[1,2]})");
  EXPECT_EQ(parsed.kind, Kind::kUnknownType);
  EXPECT_EQ(parsed.type, "gpu_memory");
  EXPECT_TRUE(parsed.reason.empty());
}

TEST(ReportRecordTest, TheLimitsThemselvesAreAccepted) {
  std::string metrics;
  for (int i = 0; i < kMaxReportMetrics; ++i) {
    absl::StrAppend(&metrics, i == 0 ? "" : ",", "\"m", i, "\":", i);
  }
  const std::string name(kMaxReportMetricNameBytes, 'n');
  EXPECT_EQ(
      ParseReportLine(absl::StrCat(R"({"type":"step","step":1,"metrics":{)", metrics, "}}")).kind,
      Kind::kRecord);
  EXPECT_EQ(ParseReportLine(absl::StrCat(R"({"type":"final","metrics":{")", name, R"(":1}})")).kind,
            Kind::kRecord);
  EXPECT_EQ(ParseReportLine(absl::StrCat(R"({"type":"checkpoint","step":1,"path":"/)",
                                         std::string(kMaxReportPathBytes - 1, 'p'), "\"}"))
                .kind,
            Kind::kRecord);
  EXPECT_EQ(ParseReportLine(
                absl::StrCat(R"({"type":"step","step":1,"metrics":{},"device":)", INT32_MAX, "}"))
                .kind,
            Kind::kRecord);
}

struct MalformedCase {
  std::string line;
  std::string reason;  // a part of the reason
};

TEST(ReportRecordTest, EachMalformedLineSaysWhy) {
  std::string too_many;
  for (int i = 0; i <= kMaxReportMetrics; ++i) {
    absl::StrAppend(&too_many, i == 0 ? "" : ",", "\"m", i, "\":", i);
  }
  const std::vector<MalformedCase> cases = {
      {"loss=0.5 step=3", "not a JSON object"},
      {R"({"type":"step","step":1,"metrics":{"loss":)", "not a JSON object"},
      {"[1,2]", "not a JSON object"},
      {"17", "not a JSON object"},
      {R"({"type":"step","step":1,"metrics":{"loss":NaN}})", "NaN and Infinity are not JSON"},
      {R"({"type":"step","step":1,"metrics":{"loss":Infinity}})", "allow_nan=False"},
      {R"({"step":1,"metrics":{}})", "no `type`"},
      {R"({"type":5})", "`type` is a number, not a string"},
      {R"({"type":null})", "`type` is null, not a string"},
      {R"({"type":"step","metrics":{}})", "a step record: no `step`"},
      {R"({"type":"step","step":"10","metrics":{}})", "`step` is a string, not an integer"},
      {R"({"type":"step","step":1.5,"metrics":{}})", "`step` is 1.5, not an integer from 0"},
      {R"({"type":"step","step":-1,"metrics":{}})", "`step` is -1, not an integer from 0"},
      {R"({"type":"step","step":1e300,"metrics":{}})", "not an integer from 0 to 9007199254740992"},
      {R"({"type":"step","step":1})", "no `metrics`"},
      {R"({"type":"step","step":1,"metrics":[0.5]})", "`metrics` is an array, not an object"},
      {R"({"type":"step","step":1,"metrics":{"loss":"0.5"}})",
       "metric 'loss' is a string, not a finite number"},
      {R"({"type":"step","step":1,"metrics":{"loss":true}})", "metric 'loss' is a boolean"},
      {R"({"type":"step","step":1,"metrics":{"":1}})", "has 0 bytes: a name has 1 to 256"},
      {absl::StrCat(R"({"type":"step","step":1,"metrics":{")",
                    std::string(kMaxReportMetricNameBytes + 1, 'n'), R"(":1}})"),
       "has 257 bytes: a name has 1 to 256"},
      {absl::StrCat(R"({"type":"step","step":1,"metrics":{)", too_many, "}}"),
       "has 65 metrics, more than the limit of 64"},
      {R"({"type":"step","step":1,"metrics":{"samples_per_second":3}})",
       "give it as the record's `samples_per_second`"},
      {R"({"type":"step","step":1,"metrics":{"compute_seconds":3}})",
       "metric 'compute_seconds' is a field of the step's report"},
      {R"({"type":"step","step":1,"metrics":{},"samples_per_second":-2})",
       "`samples_per_second` is -2, not a finite number >= 0"},
      {R"({"type":"step","step":1,"metrics":{},"device":"gpu0"})", "`device` is a string"},
      {R"({"type":"step","step":1,"metrics":{},"device":2147483648})",
       "`device` is 2147483648, not an integer from 0 to 2147483647"},
      {R"({"type":"step","step":1,"metrics":{},"process":-1})", "`process` is -1"},
      {R"({"type":"total_steps"})", "a total_steps record: no `total_steps`"},
      {R"({"type":"total_steps","total_steps":9007199254740994})",
       "`total_steps` is 9007199254740994, not an integer from 0 to 9007199254740992"},
      {R"({"type":"final","metrics":{"acc":[1]}})", "metric 'acc' is an array"},
      {absl::StrCat(R"({"type":"final","metrics":{)", too_many, "}}"), "65 metrics"},
      {R"({"type":"checkpoint","step":4})", "a checkpoint record: no `path`"},
      {R"({"type":"checkpoint","step":4,"path":"ckpt/step-4"})",
       "'ckpt/step-4' is not an absolute path"},
      {R"({"type":"checkpoint","step":4,"path":7})", "`path` is a number, not a path"},
      {absl::StrCat(R"({"type":"checkpoint","step":4,"path":"/)",
                    std::string(kMaxReportPathBytes, 'p'), "\"}"),
       "has 4097 bytes, more than the limit of 4096"},
      {R"({"type":"checkpoint","step":4,"path":"/c","size_bytes":"1 GiB"})",
       "`size_bytes` is a string"},
      {R"({"type":"resumed"})", "a resumed record: no `step`"},
      {R"({"type":"resumed","step":3,"path":"relative"})", "not an absolute path"},
  };
  for (const MalformedCase& c : cases) {
    const ParsedReportLine parsed = ParseReportLine(c.line);
    EXPECT_EQ(parsed.kind, Kind::kMalformed) << c.line.substr(0, 200);
    EXPECT_TRUE(absl::StrContains(parsed.reason, c.reason))
        << c.line.substr(0, 200) << "\n  reason: " << parsed.reason << "\n  expected: " << c.reason;
    // A reason is one line of the job's log: it never carries a whole oversized value.
    EXPECT_LT(parsed.reason.size(), 600u) << parsed.reason;
    EXPECT_EQ(parsed.reason.find('\n'), std::string::npos) << parsed.reason;
  }
}

TEST(ReportRecordTest, ANumberTooLargeForADoubleIsRefused) {
  // Parsers differ on 1e999 (an error, or infinity): either way the line is skipped.
  const ParsedReportLine parsed =
      ParseReportLine(R"({"type":"step","step":1,"metrics":{"loss":1e999}})");
  EXPECT_EQ(parsed.kind, Kind::kMalformed) << parsed.reason;
}

class ReportFileTailerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    ASSERT_FALSE(dir_.empty());
    path_ = dir_ + "/job.report";
  }

  std::string dir_;
  std::string path_;
};

TEST_F(ReportFileTailerTest, AFileNotWrittenYetIsNotAnError) {
  ReportFileTailer tailer(path_);
  ReportPoll poll = tailer.Poll();
  EXPECT_TRUE(Empty(poll));
  Append(path_, Step(1, 0.5));
  poll = tailer.Poll();
  EXPECT_EQ(Types(poll.records), "step");
  EXPECT_TRUE(poll.warnings.empty());
}

TEST_F(ReportFileTailerTest, ReadsOnlyWhatIsNewAndCountsByType) {
  ReportFileTailer tailer(path_);
  for (const ReportRecord& record : EveryType()) Append(path_, EncodeReportRecord(record));
  ReportPoll poll = tailer.Poll();
  EXPECT_EQ(Types(poll.records),
            "step,step,total_steps,final,checkpoint,checkpoint,resumed,resumed,heartbeat");
  EXPECT_TRUE(poll.warnings.empty());
  EXPECT_TRUE(tailer.Poll().records.empty());
  Append(path_, Step(2, 0.25));
  poll = tailer.Poll();
  EXPECT_EQ(OnlyStep(poll), 2);
  const ReportCounters& counters = tailer.counters();
  EXPECT_EQ(counters.records.at("step"), 3);
  EXPECT_EQ(counters.records.at("total_steps"), 1);
  EXPECT_EQ(counters.records.at("final"), 1);
  EXPECT_EQ(counters.records.at("checkpoint"), 2);
  EXPECT_EQ(counters.records.at("resumed"), 2);
  EXPECT_EQ(counters.records.at("heartbeat"), 1);
  EXPECT_EQ(counters.skipped_unknown_type + counters.skipped_malformed + counters.skipped_oversized,
            0);
}

TEST_F(ReportFileTailerTest, UnknownTypesAreCountedMalformedLinesWarnedWithTheirNumber) {
  ReportFileTailer tailer(path_);
  Append(path_, absl::StrCat(Step(1, 0.5), R"({"type":"gpu_memory","bytes":5})", "\n", "\n",
                             "not json\n", R"({"type":"step","step":2})", "\n", Step(3, 0.1)));
  const ReportPoll poll = tailer.Poll();
  EXPECT_EQ(Types(poll.records), "step,step");
  ASSERT_EQ(poll.warnings.size(), 2u) << absl::StrJoin(poll.warnings, "\n");
  EXPECT_TRUE(absl::StartsWith(poll.warnings[0],
                               absl::StrCat("report file ", path_, " line 4: skipped: not a JSON")))
      << poll.warnings[0];
  EXPECT_TRUE(absl::StrContains(poll.warnings[1], " line 5: skipped: a step record: no `metrics`"))
      << poll.warnings[1];
  EXPECT_EQ(tailer.counters().skipped_unknown_type, 1);
  EXPECT_EQ(tailer.counters().skipped_malformed, 2);
  EXPECT_EQ(tailer.counters().records.at("step"), 2);
}

TEST_F(ReportFileTailerTest, APartialLineWaitsForItsNewline) {
  ReportFileTailer tailer(path_);
  const std::string line = Step(7, 0.5);
  Append(path_, absl::StrCat(Step(6, 0.5), line.substr(0, 10)));
  EXPECT_EQ(Types(tailer.Poll().records), "step");
  Append(path_, line.substr(10, 5));
  ReportPoll poll = tailer.Poll();
  EXPECT_TRUE(Empty(poll));
  Append(path_, line.substr(15));
  poll = tailer.Poll();
  EXPECT_EQ(OnlyStep(poll), 7);
  EXPECT_TRUE(poll.warnings.empty());
  EXPECT_EQ(tailer.counters().skipped_malformed, 0);
}

TEST_F(ReportFileTailerTest, AnOversizedLineIsSkippedWholeEvenOverSeveralPolls) {
  ReportTailerOptions options;
  options.max_line_bytes = 100;
  ReportFileTailer tailer(path_, options);
  const std::string long_line = absl::StrCat(
      R"({"type":"step","step":1,"metrics":{"loss":0.5},"pad":")", std::string(200, 'x'), "\"}\n");
  Append(path_, absl::StrCat(Step(1, 0.5), long_line, Step(2, 0.5)));
  ReportPoll poll = tailer.Poll();
  EXPECT_EQ(Types(poll.records), "step,step");
  ASSERT_EQ(poll.warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(poll.warnings[0], "line 2: skipped: longer than the limit of 100"))
      << poll.warnings[0];
  EXPECT_EQ(tailer.counters().skipped_oversized, 1);

  // One line arriving in pieces, past the cap in the second: counted once, its end dropped.
  Append(path_, long_line.substr(0, 60));
  EXPECT_TRUE(tailer.Poll().warnings.empty());
  Append(path_, long_line.substr(60, 100));
  poll = tailer.Poll();
  ASSERT_EQ(poll.warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(poll.warnings[0], "line 4: skipped")) << poll.warnings[0];
  Append(path_, long_line.substr(160));
  poll = tailer.Poll();
  EXPECT_TRUE(Empty(poll));
  Append(path_, Step(3, 0.5));
  poll = tailer.Poll();
  EXPECT_EQ(OnlyStep(poll), 3);
  EXPECT_EQ(tailer.counters().skipped_oversized, 2);
  EXPECT_EQ(tailer.counters().skipped_malformed, 0);
}

TEST_F(ReportFileTailerTest, ATruncatedFileIsReadAgainFromItsBeginning) {
  ReportFileTailer tailer(path_);
  Append(path_, absl::StrCat(Step(1, 0.5), Step(2, 0.5), Step(3, 0.5)));
  EXPECT_EQ(tailer.Poll().records.size(), 3u);
  ASSERT_EQ(truncate(path_.c_str(), 0), 0);
  Append(path_, Step(9, 0.5));
  const ReportPoll poll = tailer.Poll();
  EXPECT_EQ(OnlyStep(poll), 9);
  ASSERT_EQ(poll.warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(poll.warnings[0], "was truncated to")) << poll.warnings[0];
  EXPECT_TRUE(absl::StrContains(poll.warnings[0], "reading it again from its beginning"));
  EXPECT_EQ(tailer.offset(), static_cast<int64_t>(Step(9, 0.5).size()));
}

TEST_F(ReportFileTailerTest, AReplacedFileIsReadFromItsBeginning) {
  ReportFileTailer tailer(path_);
  Append(path_, absl::StrCat(Step(1, 0.5), Step(2, 0.5), "partial"));
  EXPECT_EQ(tailer.Poll().records.size(), 2u);
  // Another inode, longer than what was read: only its identity tells.
  ASSERT_TRUE(WriteFileAtomically(
                  path_, absl::StrCat(Step(10, 0.5), Step(11, 0.5), Step(12, 0.5), Step(13, 0.5)))
                  .ok());
  ReportPoll poll = tailer.Poll();
  EXPECT_EQ(Types(poll.records), "step,step,step,step");
  EXPECT_EQ(std::get<ReportStep>(poll.records[0]).step, 10);
  ASSERT_EQ(poll.warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(poll.warnings[0], "was replaced")) << poll.warnings[0];
  EXPECT_EQ(tailer.counters().skipped_malformed, 0);  // "partial" was forgotten

  // Removed, then written again: a new file too.
  ASSERT_EQ(unlink(path_.c_str()), 0);
  poll = tailer.Poll();
  EXPECT_TRUE(Empty(poll));
  Append(path_, Step(20, 0.5));
  poll = tailer.Poll();
  EXPECT_EQ(OnlyStep(poll), 20);
}

TEST_F(ReportFileTailerTest, ReadingStopsAtTheFileCapWithOneWarning) {
  const std::string line = Step(1, 0.5);
  ReportTailerOptions options;
  options.max_file_bytes = static_cast<int64_t>(3 * line.size() + line.size() / 2);
  ReportFileTailer tailer(path_, options);
  Append(path_, absl::StrCat(line, line, line, line, line));
  ReportPoll poll = tailer.Poll();
  EXPECT_EQ(poll.records.size(), 3u);
  ASSERT_EQ(poll.warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(poll.warnings[0],
                                absl::StrCat("reached its cap of ", options.max_file_bytes,
                                             " bytes: nothing after is read (a line was cut)")))
      << poll.warnings[0];
  EXPECT_EQ(tailer.offset(), options.max_file_bytes);
  Append(path_, line);
  poll = tailer.Poll();
  EXPECT_TRUE(Empty(poll));
  // A new file is read again.
  ASSERT_TRUE(WriteFileAtomically(path_, line).ok());
  poll = tailer.Poll();
  EXPECT_EQ(poll.records.size(), 1u);
  EXPECT_EQ(poll.warnings.size(), 1u);  // replaced
}

TEST_F(ReportFileTailerTest, ALargeFileIsReadOverSeveralPolls) {
  const std::string line = Step(1, 0.5);
  ReportTailerOptions options;
  options.max_bytes_per_poll = 2 * line.size() + 3;
  ReportFileTailer tailer(path_, options);
  for (int i = 0; i < 5; ++i) Append(path_, line);
  EXPECT_EQ(tailer.Poll().records.size(), 2u);
  EXPECT_EQ(tailer.Poll().records.size(), 2u);
  EXPECT_EQ(tailer.Poll().records.size(), 1u);
  EXPECT_EQ(tailer.Poll().records.size(), 0u);
  EXPECT_EQ(tailer.counters().records.at("step"), 5);
}

TEST_F(ReportFileTailerTest, SkippedLinesAreWarnedAboutUpToALimit) {
  ReportTailerOptions options;
  options.max_line_warnings = 2;
  ReportFileTailer tailer(path_, options);
  Append(path_, "a\nb\nc\nd\n");
  ReportPoll poll = tailer.Poll();
  ASSERT_EQ(poll.warnings.size(), 3u) << absl::StrJoin(poll.warnings, "\n");
  EXPECT_TRUE(absl::StrContains(poll.warnings[2], "further skipped lines are only counted"));
  Append(path_, "e\n");
  EXPECT_TRUE(tailer.Poll().warnings.empty());
  EXPECT_EQ(tailer.counters().skipped_malformed, 5);
}

TEST_F(ReportFileTailerTest, ASymbolicLinkIsNotFollowedAndSaidOnce) {
  const std::string target = dir_ + "/elsewhere";
  Append(target, Step(1, 0.5));
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  ReportFileTailer tailer(path_);
  ReportPoll poll = tailer.Poll();
  EXPECT_TRUE(poll.records.empty());
  ASSERT_EQ(poll.warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(poll.warnings[0], "symbolic link")) << poll.warnings[0];
  EXPECT_TRUE(tailer.Poll().warnings.empty());
  // A directory is not read either.
  ASSERT_EQ(unlink(path_.c_str()), 0);
  ASSERT_EQ(mkdir(path_.c_str(), 0755), 0);
  poll = tailer.Poll();
  ASSERT_EQ(poll.warnings.size(), 1u);
  EXPECT_TRUE(absl::StrContains(poll.warnings[0], "not a regular file")) << poll.warnings[0];
}

v1::Assignment Assignment() {
  v1::Assignment a;
  a.set_job_id("mnist");
  a.set_attempt(2);
  a.set_process_index(1);
  a.add_local_device_ids(2);
  a.add_local_device_ids(3);
  return a;
}

TEST(ReportMappingTest, AStepWithoutDeviceSpeaksForEveryDeviceOfTheProcess) {
  const ReportStep step{40, {{"loss", 0.5}}, 100.0, std::nullopt, 1};
  absl::StatusOr<std::vector<v1::StepReport>> reports = ToStepReports(step, Assignment(), 500);
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const v1::StepReport& r = (*reports)[i];
    EXPECT_EQ(r.job_id(), "mnist");
    EXPECT_EQ(r.attempt(), 2);
    EXPECT_EQ(r.process_index(), 1);
    EXPECT_EQ(r.step(), 40);
    EXPECT_EQ(r.device_id(), 2 + i);
    EXPECT_EQ(r.values().at("loss"), 0.5);
    EXPECT_EQ(r.samples_per_second(), 50.0);  // the coordinator adds them up again
    EXPECT_EQ(r.total_steps(), 500);
  }
}

TEST(ReportMappingTest, AStepOfOneDeviceGoesToThatDeviceOnly) {
  ReportStep step{40, {{"loss", 0.5}}, 100.0, 3, std::nullopt};
  absl::StatusOr<std::vector<v1::StepReport>> reports = ToStepReports(step, Assignment(), 0);
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_EQ((*reports)[0].device_id(), 3);
  EXPECT_EQ((*reports)[0].samples_per_second(), 100.0);
  EXPECT_EQ((*reports)[0].total_steps(), 0);

  step.device = 7;
  reports = ToStepReports(step, Assignment(), 0);
  EXPECT_EQ(reports.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(reports.status().message(),
                                "names device 7, not one of the process's devices (2, 3)"))
      << reports.status();
  EXPECT_EQ(ToStepReports(step, v1::Assignment(), 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ReportMappingTest, FinalMetricsMergeWithinTheLimit) {
  v1::ReportAttemptStatusRequest status;
  ASSERT_TRUE(AddFinalMetrics(ReportFinal{{{"acc", 0.5}, {"loss", 2}}}, &status).ok());
  ASSERT_TRUE(AddFinalMetrics(ReportFinal{{{"acc", 0.9}}}, &status).ok());
  EXPECT_EQ(status.final_metrics_size(), 2);
  EXPECT_EQ(status.final_metrics().at("acc"), 0.9);
  ReportFinal many;
  for (int i = 0; i < kMaxReportMetrics - 1; ++i) many.metrics[absl::StrCat("m", i)] = i;
  const absl::Status refused = AddFinalMetrics(many, &status);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(refused.message(), "65 names")) << refused;
  EXPECT_EQ(status.final_metrics_size(), 2);  // nothing of it set
}

TEST(ReportMappingTest, CheckpointsAreListedNewestFirstWithinTheCoordinatorsLimits) {
  const v1::CheckpointRecord record =
      ToCheckpointRecord(ReportCheckpoint{400, "/c/step-400", 1024}, 1700000000);
  EXPECT_EQ(record.step(), 400);
  EXPECT_EQ(record.path(), "/c/step-400");
  EXPECT_EQ(record.size_bytes(), 1024);
  EXPECT_EQ(record.time().seconds(), 1700000000);

  v1::CheckpointListing listing;
  for (int64_t step : {200, 400, 100, 300}) {
    AddCheckpoint(ToCheckpointRecord(
                      ReportCheckpoint{step, absl::StrCat("/c/step-", step), std::nullopt}, step),
                  &listing);
  }
  AddCheckpoint(ToCheckpointRecord(ReportCheckpoint{300, "/c/step-300-again", 5}, 1), &listing);
  std::vector<std::string> paths;
  for (const auto& r : listing.checkpoints()) paths.push_back(r.path());
  EXPECT_EQ(absl::StrJoin(paths, ","), "/c/step-400,/c/step-300-again,/c/step-200,/c/step-100");

  v1::CheckpointListing many;
  for (int64_t step = 0; step <= kMaxListedCheckpoints; ++step) {
    AddCheckpoint(ToCheckpointRecord(ReportCheckpoint{step, "/c", std::nullopt}, 0), &many);
  }
  ASSERT_EQ(many.checkpoints_size(), kMaxListedCheckpoints);
  EXPECT_EQ(many.checkpoints(0).step(), kMaxListedCheckpoints);
  EXPECT_EQ(many.checkpoints(kMaxListedCheckpoints - 1).step(), 1);  // the oldest went

  v1::CheckpointListing long_paths;
  for (int64_t step = 0; step < 100; ++step) {
    AddCheckpoint(
        ToCheckpointRecord(
            ReportCheckpoint{step, "/" + std::string(kMaxReportPathBytes - 1, 'p'), std::nullopt},
            0),
        &long_paths);
  }
  EXPECT_LE(long_paths.ByteSizeLong(), kMaxReportListingBytes);
  EXPECT_GT(long_paths.checkpoints_size(), 50);
  EXPECT_EQ(long_paths.checkpoints(0).step(), 99);
}

TEST(ReportMappingTest, AResumeIsTheCheckpointsResume) {
  const v1::CheckpointResume resume = ToCheckpointResume(ReportResumed{400, "/c/step-400"});
  EXPECT_EQ(resume.step(), 400);
  EXPECT_EQ(resume.path(), "/c/step-400");
  EXPECT_EQ(ToCheckpointResume(ReportResumed{}).step(), 0);
}

}  // namespace
}  // namespace substrax
