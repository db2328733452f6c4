#include "client/format.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/plan_env.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "core/mesh.h"
#include "core/plan.h"
#include "core/sharding.h"
#include "rpc/proto_time.h"
#include "google/protobuf/util/json_util.h"
#include "yaml-cpp/yaml.h"

namespace substrax::ctl {

size_t DisplayWidth(absl::string_view text) {
  size_t width = 0;
  bool in_escape = false;
  for (char ch : text) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (in_escape) {
      if (c >= 0x40 && c <= 0x7e && c != '[') in_escape = false;
      continue;
    }
    if (c == 0x1b) {
      in_escape = true;
      continue;
    }
    if ((c & 0xC0) != 0x80) ++width;  // not a UTF-8 continuation byte
  }
  return width;
}

Table::Table(std::vector<std::string> header) {
  std::vector<Cell> row;
  for (std::string& h : header) row.emplace_back(std::move(h));
  rows_.push_back(std::move(row));
}

void Table::AddRow(std::vector<Cell> row) { rows_.push_back(std::move(row)); }

std::string Table::Render(bool color, absl::string_view indent) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], DisplayWidth(row[i].text));
    }
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line(indent);
    for (size_t i = 0; i < row.size(); ++i) {
      const Cell& cell = row[i];
      if (color && cell.color != nullptr) {
        absl::StrAppend(&line, cell.color, cell.text, kReset);
      } else {
        absl::StrAppend(&line, cell.text);
      }
      if (i + 1 < row.size()) {
        line.append(widths[i] - DisplayWidth(cell.text) + 3, ' ');
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string JobStateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  constexpr absl::string_view kPrefix = "JOB_STATE_";
  if (absl::StartsWith(name, kPrefix)) name = name.substr(kPrefix.size());
  return name.empty() ? absl::StrCat("STATE_", static_cast<int>(state)) : name;
}

const char* JobStateColor(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING:
      return kYellow;
    case v1::JOB_STATE_RUNNING:
      return kCyan;
    case v1::JOB_STATE_SUCCEEDED:
      return kGreen;
    case v1::JOB_STATE_FAILED:
      return kRed;
    case v1::JOB_STATE_CANCELLED:
      return kGrey;
    default:
      return nullptr;
  }
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

std::string FormatShortDuration(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s >= 86400) return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

std::string FormatAge(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s < 120) return absl::StrCat(s, "s");
  if (s < 2 * 3600) return absl::StrCat(s / 60, "m");
  if (s < 48 * 3600) return absl::StrCat(s / 3600, "h");
  return absl::StrCat(s / 86400, "d");
}

std::string FormatTimestamp(const google::protobuf::Timestamp& t, absl::TimeZone zone) {
  if (IsUnsetProtoTime(t)) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S", FromProtoTime(t), zone);
}

std::string FormatMetricValue(double value) {
  if (std::isfinite(value) && value == std::trunc(value) && std::fabs(value) < 1e15) {
    return absl::StrFormat("%.0f", value);
  }
  if (!std::isfinite(value) || std::fabs(value) >= 1e-3) return absl::StrFormat("%.4f", value);
  return absl::StrFormat("%.4g", value);
}

std::string FormatMetricPairs(const google::protobuf::Map<std::string, double>& metrics,
                              absl::string_view separator, absl::string_view skip) {
  std::vector<std::pair<std::string, double>> sorted(metrics.begin(), metrics.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    if ((a.first == "loss") != (b.first == "loss")) return a.first == "loss";
    return a.first < b.first;
  });
  std::vector<std::string> parts;
  for (const auto& [name, value] : sorted) {
    if (name == skip) continue;
    parts.push_back(absl::StrCat(name, "=", FormatMetricValue(value)));
  }
  return absl::StrJoin(parts, separator);
}

std::string FormatMeshShape(const v1::Mesh& mesh) {
  if (mesh.shape().empty()) return "-";
  std::vector<std::string> dims;
  for (int i = 0; i < mesh.shape_size(); ++i) {
    const std::string name = i < mesh.axis_names_size() ? mesh.axis_names(i) : "?";
    dims.push_back(absl::StrCat(name, "=", mesh.shape(i)));
  }
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

namespace {

Cell StateCell(v1::JobState state) { return Cell(JobStateName(state), JobStateColor(state)); }

std::string StepCell(const v1::JobProgress& p) {
  if (p.total_steps() <= 0) return p.step() > 0 ? absl::StrCat(p.step()) : "-";
  return absl::StrCat(p.step(), "/", p.total_steps());
}

// "/opt/p/train --lr 0.1 'two words'": a program job's command line.
std::string ProgramLine(const v1::ProgramSpec& program) {
  std::vector<std::string> words = {program.path()};
  words.insert(words.end(), program.args().begin(), program.args().end());
  return ShellLine(words);
}

std::string SpecSummary(const v1::JobSpec& spec) {
  std::vector<std::string> parts;
  if (spec.has_doctor()) {
    return absl::StrCat("doctor of ", spec.doctor().workers_size(),
                        spec.doctor().workers_size() == 1 ? " worker" : " workers",
                        "; `substraxctl doctor --job` with its id shows its report");
  }
  if (RunsUserCode(spec)) {
    // The program or command defines its model, optimizer and data: what the spec gives it.
    if (spec.batch().global_batch_size() > 0) {
      parts.push_back(absl::StrCat("batch ", spec.batch().global_batch_size()));
    }
    if (spec.has_steps()) parts.push_back(absl::StrCat(spec.steps(), " steps"));
    if (spec.has_epochs()) parts.push_back(absl::StrCat(spec.epochs(), " epochs"));
    return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
  }
  std::string model = ModelTypeName(spec.model().type());
  if (!spec.model().hidden_sizes().empty()) {
    absl::StrAppend(&model, " [", absl::StrJoin(spec.model().hidden_sizes(), ", "), "]");
  }
  parts.push_back(model);
  parts.push_back(absl::StrCat(spec.optimizer().type(), " lr=",
                               FormatMetricValue(spec.optimizer().learning_rate())));
  parts.push_back(absl::StrCat(DataFormatName(spec.data().format()), " data"));
  if (spec.batch().global_batch_size() > 0) {
    parts.push_back(absl::StrCat("batch ", spec.batch().global_batch_size()));
  }
  if (spec.has_steps()) parts.push_back(absl::StrCat(spec.steps(), " steps"));
  if (spec.has_epochs()) parts.push_back(absl::StrCat(spec.epochs(), " epochs"));
  return absl::StrJoin(parts, ", ");
}

std::string MeshLine(const v1::Mesh& mesh) {
  if (mesh.devices().empty()) return "-";
  std::vector<std::string> hosts;
  for (const v1::Device& d : mesh.devices()) {
    if (std::find(hosts.begin(), hosts.end(), d.host()) == hosts.end()) hosts.push_back(d.host());
  }
  return absl::StrCat(FormatMeshShape(mesh), " on ", mesh.devices_size(), " devices of ",
                      hosts.size(), hosts.size() == 1 ? " host (" : " hosts (",
                      absl::StrJoin(hosts, ", "), ")");
}

}  // namespace

std::string FormatJobsTable(const std::vector<v1::Job>& jobs, const FormatOptions& options) {
  Table table({"ID", "NAME", "QUEUE", "STATE", "ATTEMPT", "STEP", "DEVICES", "AGE"});
  for (const v1::Job& job : jobs) {
    const int64_t devices = job.mesh().devices_size();
    table.AddRow({job.id(), job.spec().name(), job.queue().empty() ? "-" : job.queue(),
                  StateCell(job.state()),
                  absl::StrCat(job.attempt()), StepCell(job.progress()),
                  devices > 0 ? absl::StrCat(devices) : "-",
                  job.has_create_time() ? FormatAge(options.now - FromProtoTime(job.create_time()))
                                        : "-"});
  }
  return table.Render(options.color);
}

std::string FormatJobDetails(const v1::Job& job, const FormatOptions& options) {
  std::vector<std::pair<std::string, std::string>> fields;
  auto timestamp = [&](const google::protobuf::Timestamp& t) {
    if (IsUnsetProtoTime(t)) return std::string("-");
    return absl::StrCat(FormatTimestamp(t, options.zone), " (",
                        FormatAge(options.now - FromProtoTime(t)), " ago)");
  };
  const v1::JobProgress& p = job.progress();
  std::string state = JobStateName(job.state());
  if (options.color && JobStateColor(job.state()) != nullptr) {
    state = absl::StrCat(JobStateColor(job.state()), state, kReset);
  }
  fields.emplace_back("ID", job.id());
  fields.emplace_back("Name", job.spec().name());
  fields.emplace_back("State", state);
  fields.emplace_back("Attempt", absl::StrCat(job.attempt()));
  for (auto& field : SchedulingFields(job, options)) fields.push_back(std::move(field));
  if (job.has_next_attempt_time()) {
    // A failed attempt's restart waits out its backoff.
    fields.emplace_back("Next try", absl::StrCat("attempt ", job.attempt() + 1, " not before ",
                                                 timestamp(job.next_attempt_time())));
  }
  fields.emplace_back("Created", timestamp(job.create_time()));
  fields.emplace_back("Updated", timestamp(job.update_time()));
  if (job.spec().has_program()) fields.emplace_back("Program", ProgramLine(job.spec().program()));
  if (job.spec().has_command()) fields.emplace_back("Command", CommandSpecLine(job.spec().command()));
  fields.emplace_back("Spec", SpecSummary(job.spec()));
  fields.emplace_back("Mesh", MeshLine(job.mesh()));
  std::string progress = "-";
  if (p.total_steps() > 0) {
    progress = absl::StrFormat("step %d/%d (%.1f%%)", p.step(), p.total_steps(),
                               100.0 * p.step() / p.total_steps());
    if (p.samples_per_second() > 0) {
      absl::StrAppendFormat(&progress, ", %.0f samples/s", p.samples_per_second());
    }
  }
  if (job.state() == v1::JOB_STATE_RUNNING && job.spec().has_command() && p.step() == 0 &&
      p.metrics().empty()) {
    // Not every command reports; one that does not is never failed as stalled.
    progress = "no report yet: the command reports through $SUBSTRAX_REPORT_FILE "
               "(docs/command-jobs.md)";
  }
  fields.emplace_back("Progress", progress);
  const std::string metrics = FormatMetricPairs(p.metrics(), "  ", "step");
  fields.emplace_back("Metrics", metrics.empty() ? "-" : metrics);
  if (!p.final_metrics().empty()) {
    fields.emplace_back("Final", FormatMetricPairs(p.final_metrics(), "  "));
  }
  if (job.resumed_from_step() > 0) {
    fields.emplace_back("Resumed", absl::StrCat("attempt ", job.attempt(),
                                                " from the checkpoint of step ",
                                                job.resumed_from_step()));
  }
  if (job.checkpoints_size() > 0) {
    const v1::CheckpointRecord& newest = job.checkpoints(0);
    fields.emplace_back("Saved",
                        absl::StrCat("checkpoint of step ", newest.step(), " (", newest.path(), "); ",
                                     job.checkpoints_size(), " kept: substraxctl checkpoints ",
                                     job.id()));
  }
  if (!job.error().empty()) fields.emplace_back("Error", job.error());

  std::string out;
  for (const auto& [name, value] : fields) {
    absl::StrAppend(&out, absl::StrFormat("%-10s", absl::StrCat(name, ":")), value, "\n");
  }
  absl::StrAppend(&out, "Transitions:\n");
  Table transitions({"TIME", "FROM", "TO", "ATTEMPT", "REASON"});
  for (const v1::JobTransition& t : job.transitions()) {
    transitions.AddRow({FormatTimestamp(t.time(), options.zone),
                        t.from() == v1::JOB_STATE_UNSPECIFIED ? "-" : JobStateName(t.from()),
                        StateCell(t.to()), absl::StrCat(t.attempt()), t.reason()});
  }
  absl::StrAppend(&out, transitions.Render(options.color, "  "));
  return out;
}

std::string FormatCheckpointsTable(const v1::Job& job, const FormatOptions& options) {
  Table table({"STEP", "TIME", "SIZE", "MESH", "PATH"});
  for (const v1::CheckpointRecord& c : job.checkpoints()) {
    table.AddRow({absl::StrCat(c.step()),
                  IsUnsetProtoTime(c.time()) ? "-" : FormatTimestamp(c.time(), options.zone),
                  FormatBytes(c.size_bytes()), c.mesh(), c.path()});
  }
  return table.Render(options.color);
}

std::string FormatJobOutcome(const v1::Job& job) {
  std::string out = absl::StrCat(job.id(), " ", JobStateName(job.state()));
  if (job.has_create_time() && job.has_update_time()) {
    const absl::Duration took = FromProtoTime(job.update_time()) - FromProtoTime(job.create_time());
    absl::StrAppend(&out, " after ", FormatShortDuration(took));
  }
  if (job.progress().total_steps() > 0) {
    absl::StrAppend(&out, " at step ", job.progress().step(), "/", job.progress().total_steps());
  }
  absl::StrAppend(&out, "\n");
  const std::string final_metrics = FormatMetricPairs(job.progress().final_metrics(), "\n");
  if (!final_metrics.empty()) absl::StrAppend(&out, final_metrics, "\n");
  return out;
}

std::string FormatWorkersTable(const v1::ListWorkersResponse& workers,
                               const FormatOptions& options) {
  Table table({"WORKER", "HOST", "STATE", "DEVICES", "COMMANDS", "PYTHON ENVS", "LAST HEARTBEAT",
               "JOBS"});
  for (const v1::Worker& w : workers.workers()) {
    // "2 cpu", "8 NVIDIA H200", "2 cpu, 1 NVIDIA H200": devices counted by model name.
    std::vector<std::pair<std::string, int>> kinds;
    for (const v1::Device& d : w.devices()) {
      std::string name = d.name();
      if (name.empty()) name = d.kind() == v1::DEVICE_KIND_CUDA ? "cuda" : "cpu";
      auto it = std::find_if(kinds.begin(), kinds.end(),
                             [&](const auto& k) { return k.first == name; });
      if (it == kinds.end()) {
        kinds.emplace_back(name, 1);
      } else {
        ++it->second;
      }
    }
    std::vector<std::string> devices;
    for (const auto& [name, count] : kinds) devices.push_back(absl::StrCat(count, " ", name));
    const double s = w.seconds_since_heartbeat();
    const std::string heartbeat = s < 10 ? absl::StrFormat("%.1fs ago", std::max(0.0, s))
                                         : absl::StrCat(FormatAge(absl::Seconds(s)), " ago");
    Cell state("-");
    if (w.state() == v1::WORKER_STATE_ALIVE) state = Cell("ALIVE", kGreen);
    if (w.state() == v1::WORKER_STATE_DEAD) state = Cell("DEAD", kRed);
    table.AddRow({w.worker_id(), w.host(), state,
                  devices.empty() ? "0" : absl::StrJoin(devices, ", "),
                  w.runs_commands() ? "yes" : "no",
                  w.python_envs().empty() ? "-" : absl::StrJoin(w.python_envs(), ","), heartbeat,
                  w.job_ids().empty() ? "-" : absl::StrJoin(w.job_ids(), ",")});
  }
  return table.Render(options.color);
}

std::string FormatMetricsTable(const v1::QueryMetricsResponse& response) {
  std::vector<std::string> header = {"STEP"};
  std::set<int64_t> steps;
  std::vector<std::map<int64_t, double>> columns;
  // step -> "column n/m" of each partial point, and the distinct "n/m" among them.
  std::map<int64_t, std::vector<std::string>> partial_columns;
  std::map<int64_t, std::set<std::string>> partial_counts;
  for (const v1::MetricSeries& series : response.series()) {
    header.push_back(series.group().empty() ? series.name()
                                            : absl::StrCat(series.name(), "/", series.group()));
    std::map<int64_t, double>& column = columns.emplace_back();
    for (const v1::MetricPoint& point : series.points()) {
      column[point.step()] = point.value();
      steps.insert(point.step());
      if (!point.partial()) continue;
      const std::string counts = absl::StrCat(point.num_values(), "/", point.expected_values());
      partial_columns[point.step()].push_back(absl::StrCat(header.back(), " ", counts));
      partial_counts[point.step()].insert(counts);
    }
  }
  const bool notes = !partial_counts.empty();
  if (notes) header.push_back("NOTE");
  Table table(std::move(header));
  for (int64_t step : steps) {
    std::vector<Cell> row = {absl::StrCat(step)};
    for (const auto& column : columns) {
      auto it = column.find(step);
      row.emplace_back(it == column.end() ? "-" : FormatMetricValue(it->second));
    }
    if (notes) {
      auto counts = partial_counts.find(step);
      if (counts == partial_counts.end()) {
        row.emplace_back("");
      } else {
        const std::string which = counts->second.size() == 1
                                      ? *counts->second.begin()
                                      : absl::StrJoin(partial_columns[step], ", ");
        row.emplace_back(absl::StrCat("partial (", which, " devices)"));
      }
    }
    table.AddRow(std::move(row));
  }
  return table.Render(false);
}

std::string FormatShardingSummary(const v1::GetMeshResponse& response) {
  std::vector<std::string> names;
  for (const auto& entry : response.layouts()) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  Table summary({"ARRAY", "GLOBAL SHAPE", "SPEC", "REPLICAS", "SHARD SHAPE"});
  for (const std::string& name : names) {
    const v1::ShardLayout& layout = response.layouts().at(name);
    std::string shard_shape = "-";
    if (!layout.shards().empty()) {
      std::vector<int64_t> shape;
      for (const v1::IndexRange& r : layout.shards(0).index()) shape.push_back(r.limit() - r.start());
      shard_shape = ShapeToString(shape);
    }
    summary.AddRow({name, ShapeToString(layout.global_shape()),
                    PartitionSpec::FromProto(layout.spec()).ToString(),
                    absl::StrCat(layout.num_replicas()), shard_shape});
  }
  return summary.Render(false, "  ");
}

std::string FormatMeshDetails(const v1::GetMeshResponse& response) {
  std::string out;
  absl::StatusOr<Mesh> mesh = Mesh::FromProto(response.mesh());
  if (mesh.ok()) {
    out = DeviceMeshManager::GetMeshInfo(*mesh).ToString();
  } else {
    // Still show what arrived; the coordinator should never send this.
    out = absl::StrCat("mesh ", FormatMeshShape(response.mesh()), " (cannot be shown: ",
                       mesh.status().message(), ")\n");
  }
  if (response.layouts().empty()) return out;
  std::vector<std::string> names;
  for (const auto& entry : response.layouts()) names.push_back(entry.first);
  std::sort(names.begin(), names.end());
  absl::StrAppend(&out, "\nlayouts:\n", FormatShardingSummary(response));
  for (const std::string& name : names) {
    const v1::ShardLayout& layout = response.layouts().at(name);
    absl::StrAppend(&out, "\n", name, ":\n");
    Table shards({"DEVICE", "SLICE", "REPLICA"});
    for (const v1::ShardSlice& s : layout.shards()) {
      std::vector<std::string> ranges;
      for (const v1::IndexRange& r : s.index()) {
        ranges.push_back(absl::StrCat(r.start(), ":", r.limit()));
      }
      shards.AddRow({absl::StrCat("d", s.device_id()),
                     absl::StrCat("[", absl::StrJoin(ranges, ", "), "]"),
                     absl::StrCat(s.replica_id())});
    }
    absl::StrAppend(&out, shards.Render(false, "  "));
  }
  return out;
}

namespace {

std::string ToJsonWith(const google::protobuf::Message& message, bool whitespace) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = whitespace;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Serialising a valid message to JSON cannot fail (no Any fields with unknown types here).
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

// Plain scalars YAML 1.1 readers take for booleans or null.
bool ReadsAsNonString(const std::string& s) {
  static const std::set<std::string>* const kWords = new std::set<std::string>{
      "true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"};
  return kWords->count(absl::AsciiStrToLower(s)) > 0;
}

void EmitYaml(YAML::Emitter& out, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      if (node.size() == 0) {
        out << YAML::Flow << YAML::BeginMap << YAML::EndMap;
        return;
      }
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        out << YAML::Key << entry.first.Scalar() << YAML::Value;
        EmitYaml(out, entry.second);
      }
      out << YAML::EndMap;
      return;
    case YAML::NodeType::Sequence:
      if (node.size() == 0) {
        out << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
        return;
      }
      out << YAML::BeginSeq;
      for (const auto& item : node) EmitYaml(out, item);
      out << YAML::EndSeq;
      return;
    case YAML::NodeType::Scalar:
      // A JSON string (tag "!") that YAML would read as a boolean or null stays a string.
      if (node.Tag() == "!" && ReadsAsNonString(node.Scalar())) {
        out << YAML::DoubleQuoted << node.Scalar();
      } else {
        out << node.Scalar();
      }
      return;
    default:
      out << YAML::Null;
  }
}

}  // namespace

std::string ToJson(const google::protobuf::Message& message) {
  std::string json = ToJsonWith(message, true);
  if (json.empty() || json.back() != '\n') json.push_back('\n');
  return json;
}

std::string ToJsonLine(const google::protobuf::Message& message) {
  return ToJsonWith(message, false) + "\n";
}

std::string JsonToYaml(const std::string& json) {
  YAML::Emitter out;
  EmitYaml(out, YAML::Load(json));
  return absl::StrCat(out.c_str(), "\n");
}

std::string FormatMessage(const google::protobuf::Message& message, OutputFormat format) {
  if (format == OutputFormat::kYaml) return JsonToYaml(ToJsonWith(message, false));
  return ToJson(message);
}

std::string FormatBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  const char* format = value >= 99.95 ? "%.0f %s" : value >= 9.995 ? "%.1f %s" : "%.2f %s";
  return absl::StrFormat(format, value, kUnits[unit]);
}

namespace {

// Indented JSON written in order (a protobuf Struct would sort or shuffle the keys). Values after
// a Key go on its line; other values and keys each start a new line.
class JsonWriter {
 public:
  JsonWriter& Key(absl::string_view key) {
    NewItem();
    absl::StrAppend(&out_, Quote(key), ": ");
    after_key_ = true;
    return *this;
  }
  JsonWriter& Open(char bracket) {
    Raw(std::string(1, bracket));
    first_.push_back(true);
    return *this;
  }
  JsonWriter& Close(char bracket) {
    const bool empty = first_.back();
    first_.pop_back();
    if (!empty) absl::StrAppend(&out_, "\n", std::string(2 * first_.size(), ' '));
    out_.push_back(bracket);
    return *this;
  }
  JsonWriter& String(absl::string_view s) { return Raw(Quote(s)); }
  JsonWriter& Int(int64_t v) { return Raw(absl::StrCat(v)); }
  // A list of integers on one line: [784, 512].
  JsonWriter& Ints(absl::Span<const int64_t> values) {
    return Raw(absl::StrCat("[", absl::StrJoin(values, ", "), "]"));
  }
  JsonWriter& Strings(absl::Span<const std::string> values) {
    std::vector<std::string> quoted;
    for (const std::string& v : values) quoted.push_back(Quote(v));
    return Raw(absl::StrCat("[", absl::StrJoin(quoted, ", "), "]"));
  }
  std::string Finish() { return out_ + "\n"; }

 private:
  static std::string Quote(absl::string_view s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
        out.push_back(c);
      } else if (static_cast<unsigned char>(c) < 0x20) {
        absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
      } else {
        out.push_back(c);
      }
    }
    return out + "\"";
  }
  void NewItem() {
    if (first_.empty()) return;
    if (!first_.back()) out_.push_back(',');
    first_.back() = false;
    absl::StrAppend(&out_, "\n", std::string(2 * first_.size(), ' '));
  }
  JsonWriter& Raw(const std::string& text) {
    if (!after_key_) NewItem();
    after_key_ = false;
    out_ += text;
    return *this;
  }

  std::string out_;
  std::vector<bool> first_;  // per open bracket: nothing written in it yet
  bool after_key_ = false;
};

// "784 -> 512 -> 256 -> 10": the input and every dense layer's output.
std::string LayerChain(const JobPlan& plan) {
  std::vector<int64_t> widths = {plan.num_features};
  for (const ParamPlan& p : plan.params) {
    if (p.param.shape.size() == 2) widths.push_back(p.param.shape[1]);  // kernels
  }
  return absl::StrJoin(widths, " -> ");
}

int64_t OptimizerMultiple(const JobPlan& plan) {
  return plan.memory.parameters == 0 ? 0
                                     : plan.memory.optimizer_state / plan.memory.parameters;
}

}  // namespace

std::string FormatPlan(const JobPlan& plan, const v1::JobSpec& spec, absl::string_view title) {
  if (RunsUserCode(spec)) {
    // The program or command defines its model: its plan is the mesh and the batch it is given.
    const char* what = spec.has_program() ? "program" : "command";
    return absl::StrCat(
        title, "\n", what, ": ",
        spec.has_program() ? ProgramLine(spec.program()) : CommandSpecLine(spec.command()), "; ",
        plan.per_device_batch > 0
            ? absl::StrCat(plan.per_device_batch, " examples per device per step")
            : absl::StrCat("no batch given (the ", what, " chooses)"),
        "\n\n", plan.mesh_info.ToString(), "\n  parameters, memory and collectives: the ", what,
        "'s own (not planned)\n");
  }
  const std::string optimizer = spec.optimizer().type();
  std::string out = absl::StrCat(
      title, "\nmodel: ", ModelTypeName(spec.model().type()), " ", LayerChain(plan), " (",
      plan.model_param_bytes / kBytesPerValue, " parameters, ",
      FormatBytes(plan.model_param_bytes), "), ", optimizer, "; ", plan.per_device_batch,
      " examples per device per step\n\n", plan.mesh_info.ToString());

  Table params({"PARAMETER", "GLOBAL SHAPE", "SPEC", "SHARD SHAPE", "SHARD BYTES", "REPLICAS",
                "GRADIENT REDUCED OVER"});
  for (const ParamPlan& p : plan.params) {
    params.AddRow({p.param.name, ShapeToString(p.param.shape), p.param.partition.ToString(),
                   ShapeToString(p.shard_shape), FormatBytes(p.shard_bytes),
                   absl::StrCat(p.replicas),
                   p.gradient_axes.empty() ? "-" : absl::StrJoin(p.gradient_axes, ", ")});
  }
  absl::StrAppend(&out, "\n", params.Render(false, "  "));

  const DeviceMemory& m = plan.memory;
  Table memory({"MEMORY PER DEVICE", "BYTES", "HOW"});
  memory.AddRow({"parameters", FormatBytes(m.parameters), "this device's blocks, float32"});
  memory.AddRow({"gradients", FormatBytes(m.gradients), "as parameters"});
  memory.AddRow({"optimizer state", FormatBytes(m.optimizer_state),
                 absl::StrCat(optimizer, ": ", OptimizerMultiple(plan), " x parameters")});
  memory.AddRow({"activations", FormatBytes(m.activations),
                 absl::StrCat("2 x batch ", plan.per_device_batch, " x (",
                              absl::StrJoin(plan.local_layer_widths, " + "),
                              ") x 4 B, forward and backward")});
  memory.AddRow({"total", FormatBytes(m.total()), ""});
  absl::StrAppend(&out, "\n", memory.Render(false, "  "));

  absl::StrAppend(&out, "\n");
  if (plan.collectives.empty()) {
    absl::StrAppend(&out, "  no collectives: one device holds the whole step\n");
    return out;
  }
  Table collectives({"AXIS", "GROUP", "ALL-REDUCE PER STEP", "COUNT", "BYTES PER DEVICE"});
  for (const Collective& c : plan.collectives) {
    collectives.AddRow({c.axis, absl::StrCat(c.group_size), c.what, absl::StrCat(c.count),
                        FormatBytes(c.bytes)});
  }
  absl::StrAppend(&out, collectives.Render(false, "  "));
  return out;
}

std::string PlanToJson(const JobPlan& plan, const v1::JobSpec& spec) {
  JsonWriter w;
  w.Open('{');
  w.Key("job").String(spec.name());
  if (spec.has_program()) w.Key("program").String(ProgramLine(spec.program()));
  if (spec.has_command()) w.Key("command").String(CommandSpecLine(spec.command()));
  w.Key("mesh").Open('{');
  w.Key("axis_names").Strings(plan.mesh_info.axis_names);
  w.Key("shape").Ints(plan.mesh_info.shape);
  w.Key("hosts").Strings(plan.mesh_info.hosts);
  w.Key("devices").Open('[');
  for (const Device& d : plan.mesh_info.devices) {
    w.Open('{');
    w.Key("id").Int(d.id);
    w.Key("host").String(d.host);
    w.Key("worker_id").String(d.worker_id);
    w.Key("local_index").Int(d.local_index);
    w.Key("kind").String(DeviceKindName(d.kind));
    w.Close('}');
  }
  w.Close(']').Close('}');
  w.Key("num_features").Int(plan.num_features);
  w.Key("per_device_batch_size").Int(plan.per_device_batch);
  w.Key("model_param_bytes").Int(plan.model_param_bytes);
  w.Key("params").Open('[');
  for (const ParamPlan& p : plan.params) {
    w.Open('{');
    w.Key("name").String(p.param.name);
    w.Key("global_shape").Ints(p.param.shape);
    w.Key("partition_spec").String(p.param.partition.ToString());
    w.Key("shard_shape").Ints(p.shard_shape);
    w.Key("shard_bytes").Int(p.shard_bytes);
    w.Key("replicas").Int(p.replicas);
    w.Key("gradient_axes").Strings(p.gradient_axes);
    w.Close('}');
  }
  w.Close(']');
  w.Key("local_layer_widths").Ints(plan.local_layer_widths);
  const DeviceMemory& m = plan.memory;
  w.Key("memory_per_device").Open('{');
  w.Key("parameters").Int(m.parameters);
  w.Key("gradients").Int(m.gradients);
  w.Key("optimizer_state").Int(m.optimizer_state);
  w.Key("activations").Int(m.activations);
  w.Key("total").Int(m.total());
  w.Close('}');
  w.Key("collectives").Open('[');
  for (const Collective& c : plan.collectives) {
    w.Open('{');
    w.Key("axis").String(c.axis);
    w.Key("group_size").Int(c.group_size);
    w.Key("all_reduce").String(c.what);
    w.Key("count").Int(c.count);
    w.Key("bytes").Int(c.bytes);
    w.Close('}');
  }
  w.Close(']');
  w.Close('}');
  return w.Finish();
}

}  // namespace substrax::ctl
