#include "contract/report_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace substrax {
namespace {

using google::protobuf::Value;
using Fields = google::protobuf::Map<std::string, Value>;

// Field values are shown in reasons at most this long (a reason ends up in the job's log).
constexpr size_t kShownBytes = 64;

std::string Shown(absl::string_view text) {
  if (text.size() <= kShownBytes) return std::string(text);
  return absl::StrCat(text.substr(0, kShownBytes), "...");
}

// The shortest of 15, 16 or 17 significant digits that reads back as `value` exactly.
std::string Number(double value) {
  if (!std::isfinite(value)) return "null";
  char text[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(text, sizeof(text), "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  return text;
}

const char* KindName(const Value& value) {
  switch (value.kind_case()) {
    case Value::kNullValue:
      return "null";
    case Value::kNumberValue:
      return "a number";
    case Value::kStringValue:
      return "a string";
    case Value::kBoolValue:
      return "a boolean";
    case Value::kStructValue:
      return "an object";
    case Value::kListValue:
      return "an array";
    default:
      return "nothing";
  }
}

// Reads a record's fields, keeping the first thing wrong with them. Fields the reader is not
// asked for are ignored: a later release may add some to a record.
class FieldReader {
 public:
  explicit FieldReader(const Fields& fields) : fields_(fields) {}

  const std::string& error() const { return error_; }

  // An integer from 0 to `max`.
  std::optional<int64_t> Integer(const char* name, bool required, int64_t max) {
    const Value* value = Find(name, required);
    if (value == nullptr) return std::nullopt;
    if (value->kind_case() != Value::kNumberValue) {
      Fail(absl::StrCat("`", name, "` is ", KindName(*value), ", not an integer"));
      return std::nullopt;
    }
    const double v = value->number_value();
    if (!std::isfinite(v) || v != std::floor(v) || v < 0 || v > static_cast<double>(max)) {
      Fail(absl::StrCat("`", name, "` is ", Number(v), ", not an integer from 0 to ", max));
      return std::nullopt;
    }
    return static_cast<int64_t>(v);
  }

  // A finite number, at least 0.
  std::optional<double> Rate(const char* name) {
    const Value* value = Find(name, /*required=*/false);
    if (value == nullptr) return std::nullopt;
    if (value->kind_case() != Value::kNumberValue || !std::isfinite(value->number_value()) ||
        value->number_value() < 0) {
      Fail(absl::StrCat("`", name, "` is ", Describe(*value), ", not a finite number >= 0"));
      return std::nullopt;
    }
    return value->number_value();
  }

  // An absolute path of at most kMaxReportPathBytes.
  std::optional<std::string> Path(const char* name, bool required) {
    const Value* value = Find(name, required);
    if (value == nullptr) return std::nullopt;
    if (value->kind_case() != Value::kStringValue) {
      Fail(absl::StrCat("`", name, "` is ", KindName(*value), ", not a path"));
      return std::nullopt;
    }
    const std::string& path = value->string_value();
    if (path.size() > kMaxReportPathBytes) {
      Fail(absl::StrCat("`", name, "` has ", path.size(), " bytes, more than the limit of ",
                        kMaxReportPathBytes));
      return std::nullopt;
    }
    if (!absl::StartsWith(path, "/")) {
      Fail(absl::StrCat("`", name, "` '", Shown(path), "' is not an absolute path"));
      return std::nullopt;
    }
    return path;
  }

  // An object of metric names to finite numbers, within the coordinator's limits.
  std::map<std::string, double> Metrics(const char* name, bool step) {
    std::map<std::string, double> metrics;
    const Value* value = Find(name, /*required=*/true);
    if (value == nullptr) return metrics;
    if (value->kind_case() != Value::kStructValue) {
      Fail(absl::StrCat("`", name, "` is ", KindName(*value), ", not an object of numbers"));
      return metrics;
    }
    const Fields& fields = value->struct_value().fields();
    if (static_cast<int>(fields.size()) > kMaxReportMetrics) {
      Fail(absl::StrCat("`", name, "` has ", fields.size(), " metrics, more than the limit of ",
                        kMaxReportMetrics));
      return metrics;
    }
    for (const auto& [metric, v] : fields) {
      if (metric.empty() || metric.size() > kMaxReportMetricNameBytes) {
        Fail(absl::StrCat("metric name '", Shown(metric), "' has ", metric.size(),
                          " bytes: a name has 1 to ", kMaxReportMetricNameBytes));
        return metrics;
      }
      if (step) {
        for (const char* reserved : kReservedReportMetricNames) {
          if (metric == reserved) {
            Fail(absl::StrCat("metric '", metric, "' is a field of the step's report, not a metric",
                              metric == std::string("samples_per_second")
                                  ? ": give it as the record's `samples_per_second`"
                                  : ": name the metric otherwise"));
            return metrics;
          }
        }
      }
      if (v.kind_case() != Value::kNumberValue || !std::isfinite(v.number_value())) {
        Fail(
            absl::StrCat("metric '", Shown(metric), "' is ", Describe(v), ", not a finite number"));
        return metrics;
      }
      metrics[metric] = v.number_value();
    }
    return metrics;
  }

 private:
  const Value* Find(const char* name, bool required) {
    auto it = fields_.find(name);
    // A null field is an absent one (writers often print their unset optionals as null).
    if (it == fields_.end() || it->second.kind_case() == Value::kNullValue) {
      if (required) Fail(absl::StrCat("no `", name, "`"));
      return nullptr;
    }
    return &it->second;
  }

  static std::string Describe(const Value& value) {
    if (value.kind_case() == Value::kNumberValue) return Number(value.number_value());
    return KindName(value);
  }

  void Fail(std::string reason) {
    if (error_.empty()) error_ = std::move(reason);
  }

  const Fields& fields_;
  std::string error_;
};

// A JSON string literal of `text`.
std::string Quoted(absl::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof(escaped), "\\u%04x", static_cast<unsigned char>(c));
          out += escaped;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string MetricsObject(const std::map<std::string, double>& metrics) {
  std::vector<std::string> entries;
  for (const auto& [name, value] : metrics) {
    entries.push_back(absl::StrCat(Quoted(name), ":", Number(value)));
  }
  return absl::StrCat("{", absl::StrJoin(entries, ","), "}");
}

struct Encoder {
  std::string operator()(const ReportStep& r) const {
    std::string line = absl::StrCat("\"step\":", r.step, ",\"metrics\":", MetricsObject(r.metrics));
    if (r.samples_per_second) {
      absl::StrAppend(&line, ",\"samples_per_second\":", Number(*r.samples_per_second));
    }
    if (r.device) absl::StrAppend(&line, ",\"device\":", *r.device);
    if (r.process) absl::StrAppend(&line, ",\"process\":", *r.process);
    return line;
  }
  std::string operator()(const ReportTotalSteps& r) const {
    return absl::StrCat("\"total_steps\":", r.total_steps);
  }
  std::string operator()(const ReportFinal& r) const {
    return absl::StrCat("\"metrics\":", MetricsObject(r.metrics));
  }
  std::string operator()(const ReportCheckpoint& r) const {
    std::string line = absl::StrCat("\"step\":", r.step, ",\"path\":", Quoted(r.path));
    if (r.size_bytes) absl::StrAppend(&line, ",\"size_bytes\":", *r.size_bytes);
    return line;
  }
  std::string operator()(const ReportResumed& r) const {
    std::string line = absl::StrCat("\"step\":", r.step);
    if (!r.path.empty()) absl::StrAppend(&line, ",\"path\":", Quoted(r.path));
    return line;
  }
  std::string operator()(const ReportHeartbeat&) const { return ""; }
};

ParsedReportLine Malformed(std::string reason) {
  ParsedReportLine parsed;
  parsed.kind = ParsedReportLine::Kind::kMalformed;
  parsed.reason = std::move(reason);
  return parsed;
}

// The record of type `type` in `fields`, or why there is none (kind kMalformed, or kUnknownType).
ParsedReportLine ReadRecord(const std::string& type, const Fields& fields) {
  FieldReader read(fields);
  ReportRecord record;
  if (type == "step") {
    ReportStep step;
    step.step = read.Integer("step", true, kMaxReportInteger).value_or(0);
    step.metrics = read.Metrics("metrics", /*step=*/true);
    step.samples_per_second = read.Rate("samples_per_second");
    const auto device = read.Integer("device", false, INT32_MAX);
    if (device) step.device = static_cast<int32_t>(*device);
    const auto process = read.Integer("process", false, INT32_MAX);
    if (process) step.process = static_cast<int32_t>(*process);
    record = std::move(step);
  } else if (type == "total_steps") {
    record = ReportTotalSteps{read.Integer("total_steps", true, kMaxReportInteger).value_or(0)};
  } else if (type == "final") {
    record = ReportFinal{read.Metrics("metrics", /*step=*/false)};
  } else if (type == "checkpoint") {
    ReportCheckpoint checkpoint;
    checkpoint.step = read.Integer("step", true, kMaxReportInteger).value_or(0);
    checkpoint.path = read.Path("path", true).value_or("");
    checkpoint.size_bytes = read.Integer("size_bytes", false, kMaxReportInteger);
    record = std::move(checkpoint);
  } else if (type == "resumed") {
    ReportResumed resumed;
    resumed.step = read.Integer("step", true, kMaxReportInteger).value_or(0);
    resumed.path = read.Path("path", false).value_or("");
    record = std::move(resumed);
  } else if (type == "heartbeat") {
    record = ReportHeartbeat{};
  } else {
    ParsedReportLine parsed;
    parsed.kind = ParsedReportLine::Kind::kUnknownType;
    parsed.type = type;
    return parsed;
  }
  if (!read.error().empty()) return Malformed(absl::StrCat("a ", type, " record: ", read.error()));
  ParsedReportLine parsed;
  parsed.kind = ParsedReportLine::Kind::kRecord;
  parsed.type = type;
  parsed.record = std::move(record);
  return parsed;
}

}  // namespace

const char* ReportRecordType(const ReportRecord& record) {
  static constexpr const char* kTypes[] = {"step",       "total_steps", "final",
                                           "checkpoint", "resumed",     "heartbeat"};
  static_assert(std::size(kTypes) == std::variant_size_v<ReportRecord>);
  return kTypes[record.index()];
}

std::string EncodeReportRecord(const ReportRecord& record) {
  const std::string fields = std::visit(Encoder{}, record);
  return absl::StrCat("{\"type\":", Quoted(ReportRecordType(record)), fields.empty() ? "" : ",",
                      fields, "}\n");
}

ParsedReportLine ParseReportLine(absl::string_view line) {
  line = absl::StripSuffix(line, "\r");
  if (absl::StripAsciiWhitespace(line).empty()) return ParsedReportLine{};
  google::protobuf::Struct object;
  const auto parsed = google::protobuf::util::JsonStringToMessage(std::string(line), &object);
  if (!parsed.ok()) {
    // Python's json.dumps writes these by default; they are not JSON.
    const bool non_finite = absl::StrContains(line, "NaN") || absl::StrContains(line, "Infinity");
    // protobuf's message may go on over several lines: the first is what fits a warning.
    const std::string message(parsed.message());
    return Malformed(absl::StrCat(
        "not a JSON object (", Shown(message.substr(0, message.find('\n'))), ")",
        non_finite ? "; NaN and Infinity are not JSON: a value that is not finite cannot be "
                     "reported (Python: json.dumps(..., allow_nan=False) says so at the writer)"
                   : ""));
  }
  auto type = object.fields().find("type");
  if (type == object.fields().end()) return Malformed("no `type`");
  if (type->second.kind_case() != Value::kStringValue) {
    return Malformed(absl::StrCat("`type` is ", KindName(type->second), ", not a string"));
  }
  return ReadRecord(type->second.string_value(), object.fields());
}

ReportFileTailer::ReportFileTailer(std::string path, ReportTailerOptions options)
    : path_(std::move(path)), options_(options) {}

void ReportFileTailer::Restart() {
  offset_ = 0;
  partial_.clear();
  oversized_ = false;
  line_number_ = 1;
  capped_ = false;
}

void ReportFileTailer::WarnOnce(std::string warning, ReportPoll* poll) {
  if (warning == last_warning_) return;
  last_warning_ = warning;
  poll->warnings.push_back(std::move(warning));
}

void ReportFileTailer::WarnLine(absl::string_view reason, ReportPoll* poll) {
  if (line_warnings_ > options_.max_line_warnings) return;
  if (line_warnings_++ == options_.max_line_warnings) {
    poll->warnings.push_back(
        absl::StrCat("report file ", path_, ": ", options_.max_line_warnings,
                     " lines skipped and warned about; further skipped lines are only counted"));
    return;
  }
  poll->warnings.push_back(
      absl::StrCat("report file ", path_, " line ", line_number_, ": skipped: ", reason));
}

ReportPoll ReportFileTailer::Poll() {
  ReportPoll poll;
  // The job's process (maybe another user) made the path: a symbolic link is not followed (to a
  // file only the agent may read), nor a FIFO waited on.
  struct stat st;
  const int fd = OpenRegularFileNoFollow(path_, &st);
  if (fd < 0 && errno != 0) {
    const int error = errno;
    // Not written yet (or removed: a file that appears again is another inode, read from 0).
    if (error == ENOENT) return poll;
    WarnOnce(absl::StrCat("report file ", path_, " cannot be opened: ",
                          error == ELOOP ? "it is a symbolic link, which is not followed"
                                         : std::strerror(error),
                          "; its reports are not read until it can be"),
             &poll);
    return poll;
  }
  if (fd < 0) {
    WarnOnce(absl::StrCat("report file ", path_,
                          " is not a regular file: not read; the program must write a file there"),
             &poll);
    return poll;
  }
  last_warning_.clear();
  const std::pair<dev_t, ino_t> identity{st.st_dev, st.st_ino};
  if (identity_ && *identity_ != identity) {
    poll.warnings.push_back(absl::StrCat("report file ", path_,
                                         " was replaced by another file: reading that one from "
                                         "its beginning"));
    Restart();
  } else if (st.st_size < offset_) {
    poll.warnings.push_back(absl::StrCat(
        "report file ", path_, " was truncated to ", st.st_size, " bytes after ", offset_,
        " were read: reading it again from its beginning (its records may be forwarded twice)"));
    Restart();
  }
  identity_ = identity;
  const int64_t end = std::min<int64_t>(st.st_size, options_.max_file_bytes);
  const int64_t want =
      std::min<int64_t>(end - offset_, static_cast<int64_t>(options_.max_bytes_per_poll));
  if (want > 0) {
    std::string data(static_cast<size_t>(want), '\0');
    size_t got = 0;
    while (got < data.size()) {
      const ssize_t n = pread(fd, data.data() + got, data.size() - got, offset_ + got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        poll.warnings.push_back(absl::StrCat("report file ", path_, ": read failed at byte ",
                                             offset_ + got, ": ", std::strerror(errno),
                                             "; tried again at the next poll"));
        break;
      }
      // 0: truncated since fstat; the next poll sees it shorter.
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    data.resize(got);
    offset_ += static_cast<int64_t>(got);
    Consume(data, &poll);
  }
  close(fd);
  if (!capped_ && offset_ >= options_.max_file_bytes) {
    capped_ = true;
    poll.warnings.push_back(absl::StrCat("report file ", path_, " reached its cap of ",
                                         options_.max_file_bytes, " bytes: nothing after is read",
                                         partial_.empty() && !oversized_ ? "" : " (a line was cut)",
                                         "; report less often or with fewer metrics"));
    partial_.clear();
    oversized_ = false;
  }
  return poll;
}

void ReportFileTailer::Consume(absl::string_view data, ReportPoll* poll) {
  while (!data.empty()) {
    const size_t newline = data.find('\n');
    const absl::string_view piece = data.substr(0, newline);
    const bool ended = newline != absl::string_view::npos;
    data.remove_prefix(ended ? newline + 1 : data.size());
    if (!oversized_ && partial_.size() + piece.size() > options_.max_line_bytes) {
      // Counted and warned about when the line passes the cap, not at its end (which may never
      // come); the rest of it is dropped as it arrives.
      ++counters_.skipped_oversized;
      WarnLine(absl::StrCat("longer than the limit of ", options_.max_line_bytes, " bytes"), poll);
      partial_.clear();
      oversized_ = true;
    }
    if (!ended) {
      if (!oversized_) partial_.append(piece.data(), piece.size());
      return;
    }
    if (oversized_) {
      oversized_ = false;
    } else if (partial_.empty()) {
      ConsumeLine(piece, poll);
    } else {
      partial_.append(piece.data(), piece.size());
      ConsumeLine(partial_, poll);
      partial_.clear();
    }
    ++line_number_;
  }
}

void ReportFileTailer::ConsumeLine(absl::string_view line, ReportPoll* poll) {
  ParsedReportLine parsed = ParseReportLine(line);
  switch (parsed.kind) {
    case ParsedReportLine::Kind::kRecord:
      ++counters_.records[parsed.type];
      poll->records.push_back(std::move(parsed.record));
      break;
    case ParsedReportLine::Kind::kUnknownType:
      ++counters_.skipped_unknown_type;
      break;
    case ParsedReportLine::Kind::kMalformed:
      ++counters_.skipped_malformed;
      WarnLine(parsed.reason, poll);
      break;
    case ParsedReportLine::Kind::kBlank:
      break;
  }
}

absl::StatusOr<std::vector<v1::StepReport>> ToStepReports(const ReportStep& step,
                                                          const v1::Assignment& assignment,
                                                          int64_t total_steps) {
  const auto& devices = assignment.local_device_ids();
  const std::string who =
      absl::StrCat("job ", assignment.job_id(), " attempt ", assignment.attempt(), " process ",
                   assignment.process_index());
  if (devices.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who, " has no devices: its steps cannot be reported"));
  }
  std::vector<int32_t> targets;
  if (step.device) {
    if (std::find(devices.begin(), devices.end(), *step.device) == devices.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": a step record names device ", *step.device,
                       ", not one of the process's devices (", absl::StrJoin(devices, ", "), ")"));
    }
    targets.push_back(*step.device);
  } else {
    targets.assign(devices.begin(), devices.end());
  }
  std::vector<v1::StepReport> reports;
  for (const int32_t device : targets) {
    v1::StepReport report;
    report.set_job_id(assignment.job_id());
    report.set_attempt(assignment.attempt());
    report.set_process_index(assignment.process_index());
    report.set_step(step.step);
    report.set_device_id(device);
    report.mutable_values()->insert(step.metrics.begin(), step.metrics.end());
    if (step.samples_per_second) {
      report.set_samples_per_second(*step.samples_per_second / static_cast<double>(targets.size()));
    }
    report.set_total_steps(total_steps);
    reports.push_back(std::move(report));
  }
  return reports;
}

absl::Status AddFinalMetrics(const ReportFinal& final, v1::ReportAttemptStatusRequest* status) {
  int added = 0;
  for (const auto& [name, value] : final.metrics) {
    if (!status->final_metrics().contains(name)) ++added;
  }
  if (status->final_metrics_size() + added > kMaxReportMetrics) {
    return absl::InvalidArgumentError(
        absl::StrCat("final metrics: ", status->final_metrics_size() + added,
                     " names over the final records, more than the limit of ", kMaxReportMetrics,
                     "; report fewer final metrics"));
  }
  for (const auto& [name, value] : final.metrics) (*status->mutable_final_metrics())[name] = value;
  return absl::OkStatus();
}

v1::CheckpointRecord ToCheckpointRecord(const ReportCheckpoint& checkpoint, int64_t now_seconds) {
  v1::CheckpointRecord record;
  record.set_step(checkpoint.step);
  record.set_path(checkpoint.path);
  record.set_size_bytes(checkpoint.size_bytes.value_or(0));
  record.mutable_time()->set_seconds(now_seconds);
  return record;
}

void AddCheckpoint(const v1::CheckpointRecord& record, v1::CheckpointListing* listing) {
  auto* records = listing->mutable_checkpoints();
  for (int i = 0; i < records->size(); ++i) {
    if (records->Get(i).step() == record.step()) {
      records->DeleteSubrange(i, 1);
      break;
    }
  }
  int at = 0;
  while (at < records->size() && records->Get(at).step() > record.step()) ++at;
  *records->Add() = record;
  // Move it from the end to its place, newest first.
  for (int i = records->size() - 1; i > at; --i) records->SwapElements(i, i - 1);
  while (records->size() > kMaxListedCheckpoints ||
         (records->size() > 1 && listing->ByteSizeLong() > kMaxReportListingBytes)) {
    records->RemoveLast();
  }
}

v1::CheckpointResume ToCheckpointResume(const ReportResumed& resumed) {
  v1::CheckpointResume resume;
  resume.set_step(resumed.step);
  resume.set_path(resumed.path);
  return resume;
}

}  // namespace substrax
