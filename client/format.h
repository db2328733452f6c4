// substraxctl: how jobs, workers, meshes and metrics are shown: aligned tables for people, JSON
// and YAML for scripts. Pure functions of the messages and FormatOptions (the clock and time
// zone are passed in, so output is deterministic in tests); thread-safe.
#ifndef SUBSTRAX_CLIENT_FORMAT_H_
#define SUBSTRAX_CLIENT_FORMAT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/args.h"
#include "core/plan.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/job_service.pb.h"
#include "substrax/v1/metrics_service.pb.h"

namespace substrax::ctl {

struct FormatOptions {
  // Ages ("5m") are measured to this time.
  absl::Time now = absl::UnixEpoch();
  // Times are printed in this zone.
  absl::TimeZone zone = absl::UTCTimeZone();
  // ANSI colours for states (only when stdout is a terminal and NO_COLOR is unset).
  bool color = false;
};

// ANSI escape sequences.
inline constexpr char kReset[] = "\x1b[0m";
inline constexpr char kRed[] = "\x1b[31m";
inline constexpr char kGreen[] = "\x1b[32m";
inline constexpr char kYellow[] = "\x1b[33m";
inline constexpr char kBlue[] = "\x1b[34m";
inline constexpr char kMagenta[] = "\x1b[35m";
inline constexpr char kCyan[] = "\x1b[36m";
inline constexpr char kGrey[] = "\x1b[90m";

// One table cell: its text and, optionally, the colour it is shown in.
struct Cell {
  Cell(std::string t) : text(std::move(t)) {}  // NOLINT: cells are written as plain strings
  Cell(const char* t) : text(t) {}              // NOLINT
  Cell(std::string t, const char* c) : text(std::move(t)), color(c) {}
  std::string text;
  const char* color = nullptr;
};

// Columns left-aligned to the widest cell, three spaces apart, no trailing spaces. Colour never
// changes the alignment.
class Table {
 public:
  explicit Table(std::vector<std::string> header);
  void AddRow(std::vector<Cell> row);
  // Every line ends with '\n'; each line starts with `indent`.
  std::string Render(bool color, absl::string_view indent = "") const;

 private:
  std::vector<std::vector<Cell>> rows_;
};

// Columns a string takes on a terminal (UTF-8 code points; escape sequences are not counted).
size_t DisplayWidth(absl::string_view text);

// "PENDING", "RUNNING", ... and the colour a state is shown in.
std::string JobStateName(v1::JobState state);
const char* JobStateColor(v1::JobState state);
bool IsTerminal(v1::JobState state);

// Durations: "42s", "3m05s", "1h02m", "2d03h". Ages (coarser, as kubectl): "42s", "5m", "3h",
// "2d". Negative durations count as zero.
std::string FormatShortDuration(absl::Duration d);
std::string FormatAge(absl::Duration d);
// "2024-05-01 12:00:00" in `zone`; "-" for an unset timestamp.
std::string FormatTimestamp(const google::protobuf::Timestamp& t, absl::TimeZone zone);
// Metric values: integers as integers, else 4 decimals ("0.8812"), tiny values in %g.
std::string FormatMetricValue(double value);
// "name=value" pairs sorted by name, "loss" first, joined by `separator`; `skip` left out.
std::string FormatMetricPairs(const google::protobuf::Map<std::string, double>& metrics,
                              absl::string_view separator, absl::string_view skip = "");
// "(data=2, model=2)"; "-" for an empty mesh.
std::string FormatMeshShape(const v1::Mesh& mesh);

// `substraxctl list`: ID, NAME, QUEUE, STATE, ATTEMPT, STEP, DEVICES, AGE.
std::string FormatJobsTable(const std::vector<v1::Job>& jobs, const FormatOptions& options);
// `substraxctl get`: the job's fields one per line, then its transitions.
std::string FormatJobDetails(const v1::Job& job, const FormatOptions& options);
// The committed checkpoints of a job, newest first: step, time, size, mesh, path.
std::string FormatCheckpointsTable(const v1::Job& job, const FormatOptions& options);
// One row per sharded array (batch, parameters): global shape, partition spec, replicas and
// shard shape.
std::string FormatShardingSummary(const v1::GetMeshResponse& response);
// The end of `watch`: "<id> SUCCEEDED after 2m13s" and the final metrics, one "name=value" a
// line.
std::string FormatJobOutcome(const v1::Job& job);
// `substraxctl workers`: WORKER, HOST, STATE, DEVICES, LAST HEARTBEAT, JOBS.
std::string FormatWorkersTable(const v1::ListWorkersResponse& workers,
                               const FormatOptions& options);
// `substraxctl queues`: QUEUE, COHORT, QUOTA, USED, BORROWED, PENDING (by priority class),
// SHARE; then the priority classes, the policy, where the configuration came from and, when the
// last reload of the queues file was refused, why.
std::string FormatQueues(const v1::ListQueuesResponse& queues, const FormatOptions& options);
// `substraxctl doctor` (format_doctor.cc; docs/diagnosis.md). Thresholds: a clock off by more
// than kDoctorClockProblem beyond the measurement's own error is a problem (a warning past
// kDoctorClockWarning); a certificate expiring within kDoctorCertificateProblem is a problem
// (a warning within kDoctorCertificateWarning); a link whose latency is kDoctorLinkFactor times
// the median of at least 3 links (and kDoctorLinkMinExcess more), or whose bandwidth is a
// kDoctorLinkFactor-th of theirs, is a problem; any link slower than kDoctorLinkSlowLatency, or
// narrower than kDoctorLinkLowBandwidth, a warning.
inline constexpr absl::Duration kDoctorClockProblem = absl::Seconds(1);
inline constexpr absl::Duration kDoctorClockWarning = absl::Milliseconds(100);
inline constexpr absl::Duration kDoctorCertificateProblem = absl::Hours(48);
inline constexpr absl::Duration kDoctorCertificateWarning = absl::Hours(24 * 14);
inline constexpr double kDoctorLinkFactor = 5;
inline constexpr absl::Duration kDoctorLinkMinExcess = absl::Milliseconds(1);
inline constexpr absl::Duration kDoctorLinkSlowLatency = absl::Milliseconds(20);
inline constexpr double kDoctorLinkLowBandwidth = 50e6;  // bytes per second
// The doctor job's links judged against each other, each pair once; `owners` gets the process
// each finding belongs to (the pair's lower one).
std::vector<v1::DoctorFinding> JudgeLinks(const v1::Job& job, std::vector<int>* owners);
// The doctor job's reports with each worker's clock and certificate (from `workers`, judged at
// `now`) and its links, judged.
v1::DoctorSummary SummarizeDoctor(const v1::Job& job, const v1::ListWorkersResponse& workers,
                                  absl::Time now);
// The table: WORKER, HOST, CHECK, RESULT, SEEN; then what to do about each problem and
// warning, the workers not tested and why, and a count of problems and warnings.
std::string FormatDoctor(const v1::DoctorSummary& summary, const FormatOptions& options);
// `substraxctl diagnose`: the job's state, how long since its last step and which rank the
// others wait for (while it runs), its error and stragglers; the processes, their devices'
// phases and their communicators' counts as relayed; the transitions about hangs and
// stragglers.
std::string FormatDiagnosis(const v1::DiagnoseJobResponse& response, const FormatOptions& options);
// What `get` shows of a job's scheduling: its queue and priority class, a preemption in
// progress, and past preemptions with the work they lost. Pairs of field name and value.
std::vector<std::pair<std::string, std::string>> SchedulingFields(const v1::Job& job,
                                                                  const FormatOptions& options);
// `substraxctl metrics`: STEP and one column per series ("loss", "loss/host-a"); a step a
// series lacks shows "-". Steps ascending. When a point is partial (some devices of its group
// have not reported the step), a last column NOTE says so: "partial (3/4 devices)", or each
// partial column's counts ("partial (loss/a 1/2, loss/b 1/2 devices)") when they differ.
std::string FormatMetricsTable(const v1::QueryMetricsResponse& response);
// `substraxctl mesh`: the device grid (DeviceMeshManager::GetMeshInfo) and the shard layouts.
std::string FormatMeshDetails(const v1::GetMeshResponse& response);

// Byte counts for people: "512 B", "17.3 KiB", "784 KiB", "2.04 MiB" (three significant digits).
std::string FormatBytes(int64_t bytes);
// `substraxctl plan`: `title` (which job on which devices), the mesh grid, every parameter's
// layout, the memory of one device and the collectives of one step. `spec` is the planned job.
std::string FormatPlan(const JobPlan& plan, const v1::JobSpec& spec, absl::string_view title);
// The plan as indented JSON (field names as in docs/cli.md; integers are plain JSON numbers),
// with a final newline. JsonToYaml gives its YAML.
std::string PlanToJson(const JobPlan& plan, const v1::JobSpec& spec);

// The message as indented JSON (proto field names, enums by name, zero values included), with a
// final newline.
std::string ToJson(const google::protobuf::Message& message);
// The message compact on one line (for streams of updates).
std::string ToJsonLine(const google::protobuf::Message& message);
// JSON text (an object) as block YAML, with a final newline. Strings that YAML would read as
// booleans or null are quoted.
std::string JsonToYaml(const std::string& json);
// The message as JSON or YAML by `format` (kTable is not handled here: it is per command).
std::string FormatMessage(const google::protobuf::Message& message, OutputFormat format);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_FORMAT_H_
