#include "contract/command_env.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/util/json_util.h"
#include "substrax/v1/metrics.pb.h"

namespace substrax {
namespace {

// Builds the list, checking each value as it goes, so that an error names the variable and the
// field it came from.
class EnvBuilder {
 public:
  void Add(absl::string_view name, absl::string_view value, absl::string_view field) {
    if (!status_.ok()) return;
    if (value.size() > kMaxCommandEnvValueBytes) {
      status_ = absl::InvalidArgumentError(absl::StrCat(
          name, " (from ", field, ") would have ", value.size(), " bytes, more than the limit of ",
          kMaxCommandEnvValueBytes, "; shorten ", field));
      return;
    }
    for (char c : value) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) {
        status_ = absl::InvalidArgumentError(
            absl::StrCat(name, " (from ", field, ") would hold the control character 0x",
                         absl::Hex(static_cast<unsigned>(u), absl::kZeroPad2), "; ", field,
                         " must be printable text"));
        return;
      }
    }
    bytes_ += name.size() + 1 + value.size() + 1;  // NAME=value and its NUL
    vars_.push_back({std::string(name), std::string(value)});
  }
  void Fail(absl::Status status) {
    if (status_.ok()) status_ = std::move(status);
  }

  absl::StatusOr<std::vector<CommandEnvVar>> Finish() && {
    if (!status_.ok()) return status_;
    if (bytes_ > kMaxCommandEnvBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the command's environment contract would have ", bytes_,
          " bytes, more than the limit of ", kMaxCommandEnvBytes,
          "; fewer or shorter data and checkpoint roots, metric names or paths make it fit"));
    }
    return std::move(vars_);
  }

 private:
  std::vector<CommandEnvVar> vars_;
  size_t bytes_ = 0;
  absl::Status status_;
};

// Checks a rendezvous endpoint: a plain host (a name, or an IPv4 or bare IPv6 address) and a
// port. The host goes into variables that take it bare (MASTER_ADDR) and as host:port.
absl::Status CheckEndpoint(absl::string_view field, absl::string_view host, int port) {
  if (host.empty() || host.size() > kMaxCommandEnvHostBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.", field, "_host: ", host.empty() ? "empty" : "too long",
                     "; give the address process 0's agent listens on (at most ",
                     kMaxCommandEnvHostBytes, " bytes)"));
  }
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_' &&
        c != ':') {
      return absl::InvalidArgumentError(absl::StrCat(
          "options.", field, "_host: '", host,
          "' is not a host name or address (letters, digits, '.', '-', '_', ':'; an IPv6 "
          "address without brackets)"));
    }
  }
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.", field, "_port: ", port, " is not a port (1..65535)"));
  }
  return absl::OkStatus();
}

// host:port, with an IPv6 address in brackets.
std::string HostPort(absl::string_view host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

absl::Status CheckAbsolute(absl::string_view field, absl::string_view path) {
  if (absl::StartsWith(path, "/")) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": '", path,
                   "' is not an absolute path; the agent names the file it writes or "
                   "reads for the process"));
}

// A list of roots joined with ':', as PATH is.
void AddRoots(EnvBuilder& env, absl::string_view name, absl::string_view field,
              const google::protobuf::RepeatedPtrField<std::string>& roots) {
  for (const std::string& root : roots) {
    if (absl::StrContains(root, ':')) {
      env.Fail(absl::InvalidArgumentError(
          absl::StrCat(field, ": the root '", root, "' holds ':', which separates the roots in ",
                       name, "; rename it or give the agent a path without ':'")));
      return;
    }
  }
  if (!roots.empty()) env.Add(name, absl::StrJoin(roots, ":"), field);
}

// "accuracy=mean,loss=mean,step=max": names sorted, reductions as in the spec's YAML.
void AddMetrics(EnvBuilder& env, const v1::JobSpec& spec) {
  if (spec.metrics().empty()) return;
  const std::map<std::string, v1::Reduction> sorted(spec.metrics().begin(), spec.metrics().end());
  std::vector<std::string> parts;
  for (const auto& [name, reduction] : sorted) {
    if (name.empty() || absl::StrContains(name, ',') || absl::StrContains(name, '=')) {
      env.Fail(absl::InvalidArgumentError(absl::StrCat(
          "spec.metrics: the name '", name,
          "' cannot be listed in SUBSTRAX_METRICS (empty, or with ',' or '='); name metrics "
          "like identifiers")));
      return;
    }
    std::string op(absl::StripPrefix(v1::Reduction_Name(reduction), "REDUCTION_"));
    parts.push_back(absl::StrCat(name, "=", absl::AsciiStrToLower(op)));
  }
  env.Add("SUBSTRAX_METRICS", absl::StrJoin(parts, ","), "spec.metrics");
}

// Where each of the attempt's devices is in the mesh (its position, and the device).
std::map<int, int> MeshPositions(const v1::Mesh& mesh) {
  std::map<int, int> positions;
  for (int i = 0; i < mesh.devices_size(); ++i) positions.emplace(mesh.devices(i).id(), i);
  return positions;
}

// CUDA_VISIBLE_DEVICES: the worker's GPUs in local_device_ids order (cuda:LOCAL_RANK is the
// process's own), named as the driver names them for the agent; empty on CPU, so that a
// command on a CPU worker never takes a GPU it was not given.
std::string CudaVisibleDevices(const v1::Assignment& a, const std::map<int, int>& positions,
                               const CommandEnvOptions& options, EnvBuilder& env) {
  if (options.backend != CommandBackend::kCuda) return "";
  std::vector<std::string> visible;
  for (int id : a.local_device_ids()) {
    const v1::Device& device = a.mesh().devices(positions.at(id));
    const int index = device.local_index();
    if (device.kind() == v1::DEVICE_KIND_CPU) {
      env.Fail(absl::InvalidArgumentError(
          absl::StrCat("backend cuda: the mesh's device ", id, " on host ", device.host(),
                       " is a CPU device; a cuda job needs workers that offer 'cuda' devices")));
      return "";
    }
    const std::vector<std::string>& agent = options.agent_cuda_visible_devices;
    if (!agent.empty() && (index < 0 || static_cast<size_t>(index) >= agent.size())) {
      env.Fail(absl::InvalidArgumentError(absl::StrCat(
          "the mesh's device ", id, " has local_index ", index, ", but the agent sees ",
          agent.size(), " GPUs (options.agent_cuda_visible_devices: ", absl::StrJoin(agent, ","),
          "); the agent's CUDA_VISIBLE_DEVICES changed since it registered: restart it")));
      return "";
    }
    visible.push_back(agent.empty() ? absl::StrCat(index) : agent[index]);
  }
  return absl::StrJoin(visible, ",");
}

// This process's place among the command's processes.
struct Ranks {
  int rank = 0;
  int world_size = 0;
  int local_rank = 0;
  int local_world_size = 0;
  std::vector<int> device_ids;  // the mesh devices it drives
};

absl::StatusOr<Ranks> RanksOf(const v1::Assignment& a, const std::map<int, int>& positions,
                              const CommandEnvOptions& options) {
  Ranks r;
  if (options.processes == CommandProcesses::kPerWorker) {
    r.rank = a.process_index();
    r.world_size = a.num_processes();
    r.local_world_size = 1;
    r.device_ids.assign(a.local_device_ids().begin(), a.local_device_ids().end());
    return r;
  }
  const auto local =
      std::find(a.local_device_ids().begin(), a.local_device_ids().end(), options.device_id);
  if (local == a.local_device_ids().end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "options.device_id: per_device, but device ", options.device_id,
        " is not one of this worker's devices (", absl::StrJoin(a.local_device_ids(), ","),
        "); start one process per id in the assignment's local_device_ids"));
  }
  r.rank = positions.at(options.device_id);
  r.world_size = a.mesh().devices_size();
  r.local_rank = static_cast<int>(local - a.local_device_ids().begin());
  r.local_world_size = a.local_device_ids_size();
  r.device_ids = {options.device_id};
  return r;
}

absl::Status CheckAssignment(const v1::ProgramLaunch& launch, const std::map<int, int>& positions) {
  if (!launch.has_assignment()) {
    return absl::InvalidArgumentError(
        "the launch has no assignment; render the contract from the launch the agent wrote for "
        "this process");
  }
  const v1::Assignment& a = launch.assignment();
  if (a.num_processes() < 1 || a.process_index() < 0 || a.process_index() >= a.num_processes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("launch.assignment: process_index ", a.process_index(),
                     " is not in [0, num_processes ", a.num_processes(), ")"));
  }
  if (a.local_device_ids().empty()) {
    return absl::InvalidArgumentError(
        "launch.assignment.local_device_ids is empty: every process of an attempt drives at "
        "least one device");
  }
  for (int id : a.local_device_ids()) {
    if (!positions.count(id)) {
      return absl::InvalidArgumentError(absl::StrCat("launch.assignment.local_device_ids: device ",
                                                     id, " is not in the attempt's mesh"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOptions(const CommandEnvOptions& options) {
  for (auto [field, host, port] :
       {std::make_tuple("torch_master", &options.torch_master_host, options.torch_master_port),
        std::make_tuple("jax_coordinator", &options.jax_coordinator_host,
                        options.jax_coordinator_port)}) {
    if (absl::Status s = CheckEndpoint(field, *host, port); !s.ok()) return s;
  }
  for (auto [field, path] : {std::make_pair("options.mesh_file", &options.mesh_file),
                             std::make_pair("options.report_file", &options.report_file),
                             std::make_pair("options.error_file", &options.error_file)}) {
    if (absl::Status s = CheckAbsolute(field, *path); !s.ok()) return s;
  }
  if (options.restart_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("options.restart_count: ", options.restart_count, " is negative"));
  }
  return absl::OkStatus();
}

// The spec's settings, each present only when the spec gives it (the seed always: 0 is one).
void AddSpecSettings(EnvBuilder& env, const v1::JobSpec& spec, int restart_count) {
  env.Add("SUBSTRAX_SEED", absl::StrCat(spec.seed()), "spec.seed");
  if (spec.batch().global_batch_size() > 0) {
    env.Add("SUBSTRAX_GLOBAL_BATCH_SIZE", absl::StrCat(spec.batch().global_batch_size()),
            "spec.batch.global_batch_size");
  }
  if (spec.batch().per_device_batch_size() > 0) {
    env.Add("SUBSTRAX_PER_DEVICE_BATCH_SIZE", absl::StrCat(spec.batch().per_device_batch_size()),
            "spec.batch.per_device_batch_size");
  }
  if (spec.length_case() == v1::JobSpec::kSteps) {
    env.Add("SUBSTRAX_STEPS", absl::StrCat(spec.steps()), "spec.steps");
  } else if (spec.length_case() == v1::JobSpec::kEpochs) {
    env.Add("SUBSTRAX_EPOCHS", absl::StrCat(spec.epochs()), "spec.epochs");
  }
  if (spec.report_every_steps() > 0) {
    env.Add("SUBSTRAX_REPORT_EVERY_STEPS", absl::StrCat(spec.report_every_steps()),
            "spec.report_every_steps");
  }
  AddMetrics(env, spec);
  if (!spec.checkpoint().directory().empty()) {
    env.Add("SUBSTRAX_CHECKPOINT_DIR", spec.checkpoint().directory(), "spec.checkpoint.directory");
  }
  if (!spec.resume_from().empty()) {
    env.Add("SUBSTRAX_RESUME_FROM", spec.resume_from(), "spec.resume_from");
  } else if (restart_count > 0 && !spec.checkpoint().directory().empty()) {
    // A restarted attempt resumes from what the earlier ones saved, as built-in jobs do.
    env.Add("SUBSTRAX_RESUME_FROM", spec.checkpoint().directory(), "spec.checkpoint.directory");
  }
  if (!spec.tensorboard().directory().empty()) {
    env.Add("SUBSTRAX_TENSORBOARD_DIR", spec.tensorboard().directory(),
            "spec.tensorboard.directory");
  }
}

}  // namespace

absl::StatusOr<std::vector<CommandEnvVar>> RenderCommandEnv(const v1::ProgramLaunch& launch,
                                                            const CommandEnvOptions& options) {
  const v1::Assignment& a = launch.assignment();
  const std::map<int, int> positions = MeshPositions(a.mesh());
  if (absl::Status s = CheckAssignment(launch, positions); !s.ok()) return s;
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  absl::StatusOr<Ranks> ranks = RanksOf(a, positions, options);
  if (!ranks.ok()) return ranks.status();
  const v1::JobSpec& spec = a.spec();
  const std::string worker = absl::StrCat(a.process_index());
  const std::string nproc = absl::StrCat(a.local_device_ids_size());

  EnvBuilder env;
  // torchrun's worker variables, as its elastic agent sets them for each worker it starts.
  env.Add("MASTER_ADDR", options.torch_master_host, "options.torch_master_host");
  env.Add("MASTER_PORT", absl::StrCat(options.torch_master_port), "options.torch_master_port");
  env.Add("RANK", absl::StrCat(ranks->rank), "the process's rank");
  env.Add("WORLD_SIZE", absl::StrCat(ranks->world_size), "the command's process count");
  env.Add("LOCAL_RANK", absl::StrCat(ranks->local_rank), "the process's local rank");
  env.Add("LOCAL_WORLD_SIZE", absl::StrCat(ranks->local_world_size), "the worker's processes");
  env.Add("GROUP_RANK", worker, "launch.assignment.process_index");
  env.Add("NODE_RANK", worker, "launch.assignment.process_index");
  // The run id stays the same across restarts, as torchrun's --rdzv-id does.
  env.Add("TORCHELASTIC_RUN_ID", a.job_id(), "launch.assignment.job_id");
  env.Add("TORCHELASTIC_RESTART_COUNT", absl::StrCat(options.restart_count),
          "options.restart_count");
  env.Add("TORCHELASTIC_MAX_RESTARTS", absl::StrCat(spec.max_restarts()), "spec.max_restarts");
  // Where torch's @record (torch.distributed.elastic.multiprocessing.errors) writes a failed
  // process's error: the contract's error file (torchrun, when it is the command, sets its own
  // for its workers and writes theirs to this one).
  env.Add("TORCHELASTIC_ERROR_FILE", options.error_file, "options.error_file");
  // torchrun's arguments (Kubeflow Trainer's names): one node per worker, one process per local
  // device; torchrun's default rendezvous (static) then meets at the master.
  env.Add("PET_NNODES", absl::StrCat(a.num_processes()), "launch.assignment.num_processes");
  env.Add("PET_NPROC_PER_NODE", nproc, "launch.assignment.local_device_ids");
  env.Add("PET_NODE_RANK", worker, "launch.assignment.process_index");
  env.Add("PET_MASTER_ADDR", options.torch_master_host, "options.torch_master_host");
  env.Add("PET_MASTER_PORT", absl::StrCat(options.torch_master_port), "options.torch_master_port");
  // JAX reads the address itself; the other two are Kubeflow's names, passed to
  // jax.distributed.initialize by the program.
  env.Add("JAX_COORDINATOR_ADDRESS",
          HostPort(options.jax_coordinator_host, options.jax_coordinator_port),
          "options.jax_coordinator_host");
  env.Add("JAX_NUM_PROCESSES", absl::StrCat(ranks->world_size), "the command's process count");
  env.Add("JAX_PROCESS_ID", absl::StrCat(ranks->rank), "the process's rank");
  if (options.backend == CommandBackend::kCpu) {
    env.Add("JAX_NUM_CPU_DEVICES", absl::StrCat(ranks->device_ids.size()), "the process's devices");
  }
  env.Add("CUDA_VISIBLE_DEVICES", CudaVisibleDevices(a, positions, options, env),
          "launch.assignment.local_device_ids");

  env.Add("SUBSTRAX_JOB_ID", a.job_id(), "launch.assignment.job_id");
  env.Add("SUBSTRAX_ATTEMPT", absl::StrCat(a.attempt()), "launch.assignment.attempt");
  env.Add("SUBSTRAX_PROCESS_INDEX", absl::StrCat(ranks->rank), "the process's rank");
  env.Add("SUBSTRAX_NUM_PROCESSES", absl::StrCat(ranks->world_size), "the command's process count");
  env.Add("SUBSTRAX_LOCAL_DEVICE_IDS", absl::StrJoin(ranks->device_ids, ","),
          "launch.assignment.local_device_ids");
  AddSpecSettings(env, spec, options.restart_count);
  AddRoots(env, "SUBSTRAX_DATA_ROOTS", "launch.data_roots", launch.data_roots());
  AddRoots(env, "SUBSTRAX_CHECKPOINT_ROOTS", "launch.checkpoint_roots", launch.checkpoint_roots());
  env.Add("SUBSTRAX_MESH_FILE", options.mesh_file, "options.mesh_file");
  env.Add("SUBSTRAX_REPORT_FILE", options.report_file, "options.report_file");
  env.Add("SUBSTRAX_ERROR_FILE", options.error_file, "options.error_file");
  return std::move(env).Finish();
}

const std::vector<std::string>& CommandEnvNames() {
  static const auto* const kNames = new std::vector<std::string>{
      "MASTER_ADDR",
      "MASTER_PORT",
      "RANK",
      "WORLD_SIZE",
      "LOCAL_RANK",
      "LOCAL_WORLD_SIZE",
      "GROUP_RANK",
      "NODE_RANK",
      "TORCHELASTIC_RUN_ID",
      "TORCHELASTIC_RESTART_COUNT",
      "TORCHELASTIC_MAX_RESTARTS",
      "TORCHELASTIC_ERROR_FILE",
      "PET_NNODES",
      "PET_NPROC_PER_NODE",
      "PET_NODE_RANK",
      "PET_MASTER_ADDR",
      "PET_MASTER_PORT",
      "JAX_COORDINATOR_ADDRESS",
      "JAX_NUM_PROCESSES",
      "JAX_PROCESS_ID",
      "JAX_NUM_CPU_DEVICES",
      "CUDA_VISIBLE_DEVICES",
      "SUBSTRAX_JOB_ID",
      "SUBSTRAX_ATTEMPT",
      "SUBSTRAX_PROCESS_INDEX",
      "SUBSTRAX_NUM_PROCESSES",
      "SUBSTRAX_LOCAL_DEVICE_IDS",
      "SUBSTRAX_SEED",
      "SUBSTRAX_GLOBAL_BATCH_SIZE",
      "SUBSTRAX_PER_DEVICE_BATCH_SIZE",
      "SUBSTRAX_STEPS",
      "SUBSTRAX_EPOCHS",
      "SUBSTRAX_REPORT_EVERY_STEPS",
      "SUBSTRAX_METRICS",
      "SUBSTRAX_CHECKPOINT_DIR",
      "SUBSTRAX_RESUME_FROM",
      "SUBSTRAX_TENSORBOARD_DIR",
      "SUBSTRAX_DATA_ROOTS",
      "SUBSTRAX_CHECKPOINT_ROOTS",
      "SUBSTRAX_MESH_FILE",
      "SUBSTRAX_REPORT_FILE",
      "SUBSTRAX_ERROR_FILE",
  };
  return *kNames;
}

std::string EncodeMeshFile(const v1::Mesh& mesh) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  // Device 0, local_index 0, ...: a reader finds every field of every device.
  options.always_print_primitive_fields = true;
  std::string json;
  // Only fails for messages with Any fields of unknown types; Mesh has none.
  (void)google::protobuf::util::MessageToJsonString(mesh, &json, options);
  return json + "\n";
}

}  // namespace substrax
