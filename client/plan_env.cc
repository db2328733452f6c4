#include "client/plan_env.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/strip.h"
#include "core/job_spec.h"

namespace substrax::ctl {
namespace {

// RenderCommandEnv checks real ports and absolute paths: it renders with these stand-ins, which
// are then shown as the placeholders.
constexpr int kPortStandIn = 65535;
constexpr char kAttemptDirStandIn[] = "/<attempt dir>";

// The stand-ins replaced by what the plan shows: a port variable's value, the port of an
// address, and the attempt directory a file path starts with.
void ShowPlaceholders(std::vector<CommandEnvVar>& env) {
  const std::string port = absl::StrCat(kPortStandIn);
  for (CommandEnvVar& var : env) {
    if (absl::EndsWith(var.name, "_PORT") && var.value == port) {
      var.value = kPortPickedAtLaunch;
    } else if (absl::EndsWith(var.name, "_ADDRESS") &&
               absl::EndsWith(var.value, absl::StrCat(":", port))) {
      var.value = absl::StrCat(var.value.substr(0, var.value.size() - port.size()),
                               kPortPickedAtLaunch);
    } else if (absl::StartsWith(var.value, absl::StrCat(kAttemptDirStandIn, "/"))) {
      var.value = absl::StrCat(kAttemptDir, absl::StripPrefix(var.value, kAttemptDirStandIn));
    }
  }
}

// The backend the command's devices run on: cuda when the spec says so, or for auto when the
// plan's devices are GPUs (as the scheduler resolves it).
CommandBackend BackendOf(const v1::JobSpec& spec, const Mesh& mesh) {
  if (spec.backend() == v1::BACKEND_CUDA) return CommandBackend::kCuda;
  if (spec.backend() == v1::BACKEND_CPU) return CommandBackend::kCpu;
  const bool gpus = !mesh.devices().empty() && mesh.devices().front().kind == DeviceKind::kCuda;
  return gpus ? CommandBackend::kCuda : CommandBackend::kCpu;
}

// The attempt's processes' workers, in process-index order (the coordinator's: the order in
// which the mesh's devices name them), with the devices each drives in mesh order.
std::vector<std::pair<std::string, std::vector<int>>> WorkersOf(const Mesh& mesh) {
  std::vector<std::pair<std::string, std::vector<int>>> workers;
  for (const Device& device : mesh.devices()) {
    auto it = std::find_if(workers.begin(), workers.end(),
                           [&](const auto& w) { return w.first == device.worker_id; });
    if (it == workers.end()) it = workers.insert(workers.end(), {device.worker_id, {}});
    it->second.push_back(device.id);
  }
  return workers;
}

}  // namespace

absl::StatusOr<std::vector<PlannedProcess>> PlanCommandEnv(
    const v1::JobSpec& spec, const Mesh& mesh, const std::map<std::string, PlanWorker>& workers) {
  if (!spec.has_command()) {
    return absl::InvalidArgumentError(absl::StrCat("job ", spec.name(), " has no spec.command"));
  }
  const std::vector<std::pair<std::string, std::vector<int>>> layout = WorkersOf(mesh);
  if (layout.empty()) return absl::InvalidArgumentError("--env: the planned mesh has no devices");
  const bool per_device = spec.command().processes() == v1::COMMAND_PROCESSES_PER_DEVICE;
  std::map<int, int> position;  // device id -> its position in the mesh (per_device's rank)
  for (size_t i = 0; i < mesh.devices().size(); ++i) position[mesh.devices()[i].id] = i;

  const std::string& first = layout.front().first;
  auto known = workers.find(first);
  CommandEnvOptions options;
  options.torch_master_host = options.jax_coordinator_host =
      known != workers.end() && !known->second.host.empty() ? known->second.host
                                                           : mesh.devices().front().host;
  options.torch_master_port = options.jax_coordinator_port = kPortStandIn;
  options.processes = per_device ? CommandProcesses::kPerDevice : CommandProcesses::kPerWorker;
  options.backend = BackendOf(spec, mesh);
  options.mesh_file = absl::StrCat(kAttemptDirStandIn, "/mesh.json");

  v1::ProgramLaunch launch;
  v1::Assignment& a = *launch.mutable_assignment();
  a.set_job_id(absl::StrCat(spec.name(), "-<n>"));
  a.set_attempt(1);
  *a.mutable_spec() = spec;
  *a.mutable_mesh() = mesh.ToProto();
  a.set_num_processes(static_cast<int>(layout.size()));
  std::vector<PlannedProcess> processes;
  for (size_t p = 0; p < layout.size(); ++p) {
    const auto& [worker_id, device_ids] = layout[p];
    a.set_process_index(static_cast<int>(p));
    a.mutable_local_device_ids()->Assign(device_ids.begin(), device_ids.end());
    launch.clear_data_roots();
    launch.clear_checkpoint_roots();
    if (auto w = workers.find(worker_id); w != workers.end()) {
      launch.mutable_data_roots()->Assign(w->second.data_roots.begin(),
                                          w->second.data_roots.end());
      launch.mutable_checkpoint_roots()->Assign(w->second.checkpoint_roots.begin(),
                                                w->second.checkpoint_roots.end());
    }
    // The launcher's own files, one set per process it starts on the worker.
    const size_t local_processes = per_device ? device_ids.size() : 1;
    for (size_t local = 0; local < local_processes; ++local) {
      options.device_id = per_device ? device_ids[local] : -1;
      options.report_file = absl::StrCat(kAttemptDirStandIn, "/report-", local, ".jsonl");
      options.error_file = absl::StrCat(kAttemptDirStandIn, "/error-", local, ".json");
      absl::StatusOr<std::vector<CommandEnvVar>> env = RenderCommandEnv(launch, options);
      if (!env.ok()) {
        return absl::Status(env.status().code(),
                            absl::StrCat("--env: process ", p, " (worker ", worker_id,
                                         "): ", env.status().message()));
      }
      PlannedProcess process;
      process.rank = per_device ? position.at(device_ids[local]) : static_cast<int>(p);
      process.worker_id = worker_id;
      process.device_ids = per_device ? std::vector<int>{device_ids[local]} : device_ids;
      process.env = *std::move(env);
      ShowPlaceholders(process.env);
      processes.push_back(std::move(process));
    }
  }
  std::sort(processes.begin(), processes.end(),
            [](const PlannedProcess& x, const PlannedProcess& y) { return x.rank < y.rank; });
  return processes;
}

std::string FormatPlanEnv(const std::vector<PlannedProcess>& processes, const v1::JobSpec& spec,
                          absl::string_view title) {
  std::string out = absl::StrCat(title, "\ncommand: ", CommandSpecLine(spec.command()), "; ",
                                 processes.size(),
                                 processes.size() == 1 ? " process" : " processes",
                                 " (ports and the attempt dir are picked at launch)\n");
  for (const PlannedProcess& process : processes) {
    absl::StrAppend(&out, "\nrank ", process.rank, ": worker ", process.worker_id,
                    process.device_ids.size() == 1 ? ", device " : ", devices ",
                    absl::StrJoin(process.device_ids, ", "), "\n");
    for (const CommandEnvVar& var : process.env) {
      absl::StrAppend(&out, "  ", var.name, "=", var.value, "\n");
    }
  }
  return out;
}

google::protobuf::Struct PlanEnvToStruct(const std::vector<PlannedProcess>& processes,
                                         const v1::JobSpec& spec) {
  google::protobuf::Struct out;
  auto& fields = *out.mutable_fields();
  fields["job"].set_string_value(spec.name());
  fields["command"].set_string_value(CommandSpecLine(spec.command()));
  google::protobuf::ListValue* list = fields["processes"].mutable_list_value();
  for (const PlannedProcess& process : processes) {
    auto& p = *list->add_values()->mutable_struct_value()->mutable_fields();
    p["rank"].set_number_value(process.rank);
    p["worker_id"].set_string_value(process.worker_id);
    google::protobuf::ListValue* ids = p["device_ids"].mutable_list_value();
    for (int id : process.device_ids) ids->add_values()->set_number_value(id);
    // NAME=value strings keep the contract's order, which a JSON object would not.
    google::protobuf::ListValue* env = p["env"].mutable_list_value();
    for (const CommandEnvVar& var : process.env) {
      env->add_values()->set_string_value(absl::StrCat(var.name, "=", var.value));
    }
  }
  return out;
}

std::string AddressHost(absl::string_view address) {
  if (absl::StartsWith(address, "[")) {
    const size_t close = address.find(']');
    if (close != absl::string_view::npos) return std::string(address.substr(1, close - 1));
  }
  const size_t colon = address.find(':');
  // Two colons and no brackets: a bare IPv6 address, no port.
  if (colon == absl::string_view::npos || address.find(':', colon + 1) != absl::string_view::npos) {
    return std::string(address);
  }
  return std::string(address.substr(0, colon));
}

std::string ShellLine(const std::vector<std::string>& words) {
  std::vector<std::string> quoted;
  for (const std::string& word : words) {
    const bool plain = !word.empty() && word.find_first_of(" \t\n'\"\\$`") == std::string::npos;
    quoted.push_back(plain ? word
                           : absl::StrCat("'", absl::StrReplaceAll(word, {{"'", "'\\''"}}), "'"));
  }
  return absl::StrJoin(quoted, " ");
}

std::string CommandSpecLine(const v1::CommandSpec& command) {
  std::vector<std::string> how;
  if (!command.python_env().empty()) how.push_back(absl::StrCat("python_env ", command.python_env()));
  how.push_back(command.processes() == v1::COMMAND_PROCESSES_PER_DEVICE ? "per_device"
                                                                         : "per_worker");
  return absl::StrCat(ShellLine({command.argv().begin(), command.argv().end()}), " (",
                      absl::StrJoin(how, ", "), ")");
}

}  // namespace substrax::ctl
