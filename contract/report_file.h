// The report file: how a job process that does not call the coordinator (a command job's
// program, in any language) reports its progress. The process appends JSON lines to a file; the
// command's launcher on its worker (worker/command_launcher.h) tails the file and forwards what
// it reads as the coordinator's ReportSteps, ReportCheckpoints and ReportAttemptStatus carry it.
// docs/launch.md ("The report file") is the format's reference; this is its reader, the mapping
// of its records onto those messages, and a writer for C++ programs and tests.
//
// One JSON object per line, each with a string `type`:
//   {"type":"step","step":100,"metrics":{"loss":0.31},"samples_per_second":812.5,"device":2}
//   {"type":"total_steps","total_steps":5000}
//   {"type":"final","metrics":{"test_accuracy":0.97}}
//   {"type":"checkpoint","step":400,"path":"/ckpt/job/step-400","size_bytes":1048576}
//   {"type":"resumed","step":400,"path":"/ckpt/job/step-400"}
//   {"type":"heartbeat"}
// A line of a type this release does not know is skipped and counted (so later record types
// stay compatible); fields a record does not define are ignored. A line that is not such an
// object (not JSON, a field of the wrong type, a number that is not finite, a metric name too
// long, too many metrics) or is longer than the line cap is skipped with a warning for the job's
// log, and counted.
//
// Not thread-safe: ReportFileTailer is polled by one thread (it starts none); the free functions
// may be called from any thread.
#ifndef SUBSTRAX_CONTRACT_REPORT_FILE_H_
#define SUBSTRAX_CONTRACT_REPORT_FILE_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/metrics.pb.h"

namespace substrax {

// The limits of one record, the coordinator's own (coordinator/limits.h, which the contract
// cannot include: tests/launch/report_file_limits_test checks that they agree), so that a record
// read is never refused by the rpc it becomes.
//   metric names: limits::kMaxNameBytes; metrics per record: limits::kMaxValuesPerReport (a
//   step) and limits::kMaxFinalMetrics (final); paths: limits::kMaxPathBytes; a checkpoint
//   listing's records and bytes: limits::kMaxCheckpointRecords, kMaxCheckpointListingBytes.
inline constexpr size_t kMaxReportMetricNameBytes = 256;
inline constexpr int kMaxReportMetrics = 64;
inline constexpr size_t kMaxReportPathBytes = 4096;
inline constexpr int kMaxListedCheckpoints = 1000;
inline constexpr size_t kMaxReportListingBytes = 256 * 1024;
// The largest integer a record may hold (step, total_steps, size_bytes): 2^53, the largest a
// JSON parser that reads numbers as doubles (JavaScript's, Python's for floats) holds exactly.
inline constexpr int64_t kMaxReportInteger = int64_t{1} << 53;
// The metric names a step's `metrics` may not use: the coordinator keeps StepReport's own timing
// fields as metrics of these names (coordinator/metrics_store.h), so a metric of one of them
// would be overwritten. A step says its throughput in `samples_per_second`.
inline constexpr const char* kReservedReportMetricNames[] = {
    "samples_per_second", "data_wait_seconds", "compute_seconds", "collective_seconds"};

// `{"type":"step"}`: what the process measured at one training step.
struct ReportStep {
  int64_t step = 0;
  std::map<std::string, double> metrics;
  // Examples per second over the last report interval (of `device`, or of the whole process).
  std::optional<double> samples_per_second;
  // The mesh device the values are for (one of the process's devices, SUBSTRAX's local devices);
  // absent: the record speaks for every device of the process.
  std::optional<int32_t> device;
  // The writer's process index when several processes write one file (under torchrun, its
  // RANK), for the job's log; where the values go is `device`'s to say.
  std::optional<int32_t> process;
};

// `{"type":"total_steps"}`: the steps the attempt will run, once the program knows them.
struct ReportTotalSteps {
  int64_t total_steps = 0;
};

// `{"type":"final"}`: the final evaluation ("test_accuracy"); a later one replaces earlier names'
// values.
struct ReportFinal {
  std::map<std::string, double> metrics;
};

// `{"type":"checkpoint"}`: a checkpoint the process has committed, whole, for `substraxctl
// checkpoints`.
struct ReportCheckpoint {
  int64_t step = 0;
  // Absolute: the committed directory, in the job's checkpoint directory.
  std::string path;
  std::optional<int64_t> size_bytes;
};

// `{"type":"resumed"}`: the checkpoint a (re)started attempt resumed from; step 0 and no path:
// from the beginning.
struct ReportResumed {
  int64_t step = 0;
  std::string path;
};

// `{"type":"heartbeat"}`: the process is alive between steps.
struct ReportHeartbeat {};

using ReportRecord = std::variant<ReportStep, ReportTotalSteps, ReportFinal, ReportCheckpoint,
                                  ReportResumed, ReportHeartbeat>;

// The record's `type` ("step", "total_steps", ...).
const char* ReportRecordType(const ReportRecord& record);

// `record` as one line of the file, newline included. Integers are written as JSON integers,
// numbers so that they read back exactly. A non-finite number (which the format has no way to
// write) is written as null, which the reader refuses.
std::string EncodeReportRecord(const ReportRecord& record);

// What one line is.
struct ParsedReportLine {
  enum class Kind {
    kRecord,       // `record` holds it
    kUnknownType,  // a well-formed object of a type this release does not know (`type`)
    kMalformed,    // `reason` says what is wrong, for the job's log
    kBlank,        // only white space: not a record, not an error (not counted)
  };
  Kind kind = Kind::kBlank;
  ReportRecord record;
  std::string type;
  std::string reason;
};

// Parses one line, without its newline (a trailing "\r" is ignored). The line cap is the
// tailer's to apply: any length is parsed here.
ParsedReportLine ParseReportLine(absl::string_view line);

// How the tailer reads (ReportFileTailer).
struct ReportTailerOptions {
  // A line longer than this (newline excluded) is skipped, counted and warned about, whole:
  // even when it arrives over several polls, only this much of it is held.
  size_t max_line_bytes = 64 * 1024;
  // The file is read up to this size and no further: past it, reading stops with one warning
  // (a program that writes without end cannot fill the agent's memory or the job's log).
  int64_t max_file_bytes = int64_t{256} << 20;
  // At most this many bytes are read by one Poll; the rest is read by the next ones, so that one
  // poll's records stay bounded.
  size_t max_bytes_per_poll = size_t{4} << 20;
  // Skipped lines warned about, over the tailer's life; past them, skipped lines are only counted
  // (one warning says so), so that a file of garbage cannot flood the job's log.
  int max_line_warnings = 100;
};

// How many lines of each kind a tailer has read since it was created (replacements and
// truncations included).
struct ReportCounters {
  // By `type`.
  std::map<std::string, int64_t> records;
  int64_t skipped_unknown_type = 0;
  int64_t skipped_malformed = 0;
  int64_t skipped_oversized = 0;
};

// What one Poll read.
struct ReportPoll {
  std::vector<ReportRecord> records;
  // For the job's log, one a line: "report file <path> line 12: skipped: ...". The lines of an
  // unknown type are not warned about, only counted.
  std::vector<std::string> warnings;
};

// Reads a report file while its process appends to it: each Poll returns the whole lines that
// arrived since the previous one, parsed. The file may not exist yet (nothing is read until it
// does). A line without its newline yet is kept until the newline arrives (a line the process
// ends without a newline is never read). A file replaced (another inode at the path) or
// truncated (shorter than what was read) is read again from its beginning, with a warning.
// Reading stops, with one warning, at max_file_bytes. The file is never followed through a
// symbolic link, and one that is not a regular file is not read (warned): the job's process,
// maybe another user, chose what is at the path.
//
// Not thread-safe; starts no thread: the caller polls.
class ReportFileTailer {
 public:
  explicit ReportFileTailer(std::string path, ReportTailerOptions options = {});

  // Reads what is new. Never fails: what goes wrong (the file cannot be opened, is not a
  // regular file, was truncated) is a warning, given once until it changes.
  ReportPoll Poll();

  const ReportCounters& counters() const { return counters_; }
  const std::string& path() const { return path_; }
  // Bytes of the file read so far (the current file's, since the last restart from 0).
  int64_t offset() const { return offset_; }

 private:
  // Parses the complete lines of `data` (appended to the held partial line); keeps the rest.
  void Consume(absl::string_view data, ReportPoll* poll);
  void ConsumeLine(absl::string_view line, ReportPoll* poll);
  // Warns about the current line, skipped for `reason`, while max_line_warnings allows.
  void WarnLine(absl::string_view reason, ReportPoll* poll);
  // Forgets the file read so far: the next bytes are the start of a new one.
  void Restart();
  // Adds `warning` unless it is the one given last (an error that persists is said once).
  void WarnOnce(std::string warning, ReportPoll* poll);

  std::string path_;
  ReportTailerOptions options_;
  ReportCounters counters_;
  // The file being read: its identity (once seen) and how far it was read.
  std::optional<std::pair<dev_t, ino_t>> identity_;
  int64_t offset_ = 0;
  // The line read so far (no newline yet), or, while `oversized_`, nothing: the rest of a line
  // past max_line_bytes is dropped up to its newline.
  std::string partial_;
  bool oversized_ = false;
  // The number of the next line (1-based), for warnings.
  int64_t line_number_ = 1;
  int line_warnings_ = 0;
  bool capped_ = false;
  std::string last_warning_;
};

// The step reports a step record becomes, for the process of `assignment` (its job, attempt,
// process and devices): one for `device`, or, without it, one for each of the process's devices
// with the same values and samples_per_second divided among them (the coordinator adds the
// devices' rates up). `total_steps`: the latest total_steps record's (0: none yet). Errors:
// INVALID_ARGUMENT when `device` is not one of the process's devices (the message names them),
// FAILED_PRECONDITION when the assignment has no devices.
absl::StatusOr<std::vector<v1::StepReport>> ToStepReports(const ReportStep& step,
                                                          const v1::Assignment& assignment,
                                                          int64_t total_steps);

// A final record's metrics, set in the process's attempt status (later names replace earlier
// ones'). Errors: INVALID_ARGUMENT when the status would then hold more than kMaxReportMetrics
// final metrics (those of `final` are not set).
absl::Status AddFinalMetrics(const ReportFinal& final, v1::ReportAttemptStatusRequest* status);

// A checkpoint record as the coordinator lists it (its time: `now_seconds`, Unix time; its mesh
// left empty, for the caller, who knows the attempt's).
v1::CheckpointRecord ToCheckpointRecord(const ReportCheckpoint& checkpoint, int64_t now_seconds);

// Adds `record` to `listing` (newest first; one of the same step is replaced), dropping the
// oldest past the coordinator's limits of records and bytes, so that the listing a
// ReportCheckpoints sends is always accepted on those counts.
void AddCheckpoint(const v1::CheckpointRecord& record, v1::CheckpointListing* listing);

// A resumed record as ReportCheckpoints carries it.
v1::CheckpointResume ToCheckpointResume(const ReportResumed& resumed);

}  // namespace substrax

#endif  // SUBSTRAX_CONTRACT_REPORT_FILE_H_
