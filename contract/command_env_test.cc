#include "contract/command_env.h"

#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

// A launch with every field set: worker 1 of 2 (host a, devices 11 and 10, in that order) of a
// 2x2 mesh whose row-major order is 20, 21, 11, 10, so that no rank of per_device equals one of
// per_worker by chance.
v1::ProgramLaunch FullLaunch(v1::DeviceKind kind) {
  v1::ProgramLaunch launch;
  launch.set_sdk_version_major(1);
  v1::Assignment* a = launch.mutable_assignment();
  a->set_job_id("mnist-1");
  a->set_attempt(2);
  v1::JobSpec* spec = a->mutable_spec();
  spec->set_name("mnist");
  spec->mutable_batch()->set_global_batch_size(64);
  spec->mutable_batch()->set_per_device_batch_size(16);
  spec->set_steps(500);
  spec->set_seed(42);
  (*spec->mutable_metrics())["loss"] = v1::REDUCTION_MEAN;
  (*spec->mutable_metrics())["step"] = v1::REDUCTION_MAX;
  (*spec->mutable_metrics())["accuracy"] = v1::REDUCTION_MEAN;
  spec->set_report_every_steps(10);
  spec->mutable_checkpoint()->set_directory("/ckpt/mnist-1");
  spec->mutable_checkpoint()->set_every_steps(100);
  spec->set_max_restarts(3);
  spec->set_resume_from("/ckpt/old");
  spec->mutable_tensorboard()->set_directory("/ckpt/tb");
  v1::Mesh* mesh = a->mutable_mesh();
  mesh->add_axis_names("data");
  mesh->add_axis_names("model");
  mesh->add_shape(2);
  mesh->add_shape(2);
  for (auto [id, host, local] : {std::make_tuple(20, "b", 0), std::make_tuple(21, "b", 1),
                                 std::make_tuple(11, "a", 1), std::make_tuple(10, "a", 0)}) {
    v1::Device* d = mesh->add_devices();
    d->set_id(id);
    d->set_host(host);
    d->set_worker_id(absl::StrCat("w-", host));
    d->set_local_index(local);
    d->set_kind(kind);
  }
  a->set_process_index(1);
  a->set_num_processes(2);
  a->add_local_device_ids(11);
  a->add_local_device_ids(10);
  (*a->mutable_layouts())["batch/inputs"].add_global_shape(64);
  a->set_rendezvous_prefix("/jobs/mnist-1/2/");
  a->set_rendezvous_secret("secret-rendezvous");
  a->set_checkpoint_owner_directory("alice");
  a->set_attempt_token("token-assignment");
  launch.set_coordinator("coord.example:7072");
  launch.mutable_transport()->set_ca_file("/etc/substrax/ca-x.crt");
  launch.mutable_transport()->set_server_name("coord-name");
  launch.mutable_transport()->set_attempt_token("token-transport");
  launch.mutable_transport()->mutable_reload_interval()->set_seconds(60);
  launch.set_listen_host("10.0.0.7");
  launch.mutable_collective_timeout()->set_seconds(30);
  launch.add_data_roots("/data/a");
  launch.add_data_roots("/data/b");
  launch.add_checkpoint_roots("/ckpt");
  launch.set_result_path("/work/mnist-1-attempt-2-process-1.result");
  launch.set_started_path("/work/mnist-1-attempt-2-process-1.started");
  return launch;
}

CommandEnvOptions Options(CommandProcesses processes, CommandBackend backend) {
  CommandEnvOptions o;
  o.torch_master_host = "10.0.0.9";
  o.torch_master_port = 29500;
  o.jax_coordinator_host = "10.0.0.9";
  o.jax_coordinator_port = 29600;
  o.processes = processes;
  o.device_id = 10;
  o.restart_count = 1;
  o.backend = backend;
  o.mesh_file = "/work/j/mesh.json";
  o.report_file = "/work/j/report.jsonl";
  o.error_file = "/work/j/error.json";
  return o;
}

v1::DeviceKind KindOf(CommandBackend backend) {
  return backend == CommandBackend::kCuda ? v1::DEVICE_KIND_CUDA : v1::DEVICE_KIND_CPU;
}

std::vector<CommandEnvVar> Render(const v1::ProgramLaunch& launch,
                                  const CommandEnvOptions& options) {
  absl::StatusOr<std::vector<CommandEnvVar>> env = RenderCommandEnv(launch, options);
  EXPECT_TRUE(env.ok()) << env.status();
  return env.ok() ? *env : std::vector<CommandEnvVar>{};
}

std::map<std::string, std::string> AsMap(const std::vector<CommandEnvVar>& env) {
  std::map<std::string, std::string> m;
  for (const CommandEnvVar& v : env) EXPECT_TRUE(m.emplace(v.name, v.value).second) << v.name;
  return m;
}

// What FullLaunch promises, per mode and backend, every variable with its value.
std::map<std::string, std::string> Expected(CommandProcesses processes, CommandBackend backend) {
  const bool per_device = processes == CommandProcesses::kPerDevice;
  std::map<std::string, std::string> e = {
      {"MASTER_ADDR", "10.0.0.9"},
      {"MASTER_PORT", "29500"},
      {"RANK", per_device ? "3" : "1"},  // device 10 is the mesh's 4th
      {"WORLD_SIZE", per_device ? "4" : "2"},
      {"LOCAL_RANK", per_device ? "1" : "0"},  // device 10 is the worker's 2nd
      {"LOCAL_WORLD_SIZE", per_device ? "2" : "1"},
      {"GROUP_RANK", "1"},
      {"NODE_RANK", "1"},
      {"TORCHELASTIC_RUN_ID", "mnist-1"},
      {"TORCHELASTIC_RESTART_COUNT", "1"},
      {"TORCHELASTIC_MAX_RESTARTS", "3"},
      {"TORCHELASTIC_ERROR_FILE", "/work/j/error.json"},
      {"PET_NNODES", "2"},
      {"PET_NPROC_PER_NODE", "2"},
      {"PET_NODE_RANK", "1"},
      {"PET_MASTER_ADDR", "10.0.0.9"},
      {"PET_MASTER_PORT", "29500"},
      {"JAX_COORDINATOR_ADDRESS", "10.0.0.9:29600"},
      {"JAX_NUM_PROCESSES", per_device ? "4" : "2"},
      {"JAX_PROCESS_ID", per_device ? "3" : "1"},
      // The worker's GPUs as local_device_ids orders them (11: local 1, 10: local 0).
      {"CUDA_VISIBLE_DEVICES", backend == CommandBackend::kCuda ? "1,0" : ""},
      {"SUBSTRAX_JOB_ID", "mnist-1"},
      {"SUBSTRAX_ATTEMPT", "2"},
      {"SUBSTRAX_PROCESS_INDEX", per_device ? "3" : "1"},
      {"SUBSTRAX_NUM_PROCESSES", per_device ? "4" : "2"},
      {"SUBSTRAX_LOCAL_DEVICE_IDS", per_device ? "10" : "11,10"},
      {"SUBSTRAX_SEED", "42"},
      {"SUBSTRAX_GLOBAL_BATCH_SIZE", "64"},
      {"SUBSTRAX_PER_DEVICE_BATCH_SIZE", "16"},
      {"SUBSTRAX_STEPS", "500"},
      {"SUBSTRAX_REPORT_EVERY_STEPS", "10"},
      {"SUBSTRAX_METRICS", "accuracy=mean,loss=mean,step=max"},
      {"SUBSTRAX_CHECKPOINT_DIR", "/ckpt/mnist-1"},
      {"SUBSTRAX_RESUME_FROM", "/ckpt/old"},
      {"SUBSTRAX_TENSORBOARD_DIR", "/ckpt/tb"},
      {"SUBSTRAX_DATA_ROOTS", "/data/a:/data/b"},
      {"SUBSTRAX_CHECKPOINT_ROOTS", "/ckpt"},
      {"SUBSTRAX_MESH_FILE", "/work/j/mesh.json"},
      {"SUBSTRAX_REPORT_FILE", "/work/j/report.jsonl"},
      {"SUBSTRAX_ERROR_FILE", "/work/j/error.json"},
  };
  if (backend == CommandBackend::kCpu) e["JAX_NUM_CPU_DEVICES"] = per_device ? "1" : "2";
  return e;
}

struct Case {
  CommandProcesses processes;
  CommandBackend backend;
  std::string name;
};

const std::vector<Case>& Cases() {
  static const auto* const kCases = new std::vector<Case>{
      {CommandProcesses::kPerWorker, CommandBackend::kCpu, "per_worker cpu"},
      {CommandProcesses::kPerWorker, CommandBackend::kCuda, "per_worker cuda"},
      {CommandProcesses::kPerDevice, CommandBackend::kCpu, "per_device cpu"},
      {CommandProcesses::kPerDevice, CommandBackend::kCuda, "per_device cuda"},
  };
  return *kCases;
}

TEST(CommandEnvTest, EveryPromisedFieldHasItsVariableInBothModesAndBackends) {
  for (const Case& c : Cases()) {
    const std::vector<CommandEnvVar> env =
        Render(FullLaunch(KindOf(c.backend)), Options(c.processes, c.backend));
    EXPECT_EQ(AsMap(env), Expected(c.processes, c.backend)) << c.name;
  }
}

// Where each field of the launch goes: the variable that carries it, or why the command does
// not get it. A field added to the launch or the spec fails here until it is given one or the
// other, so that the contract never silently leaves a setting behind.
const std::map<std::string, std::string>& FieldUses() {
  static const auto* const kUses = new std::map<std::string, std::string>{
      {"substrax.v1.ProgramLaunch.sdk_version_major", "no: the SDK's; a command links none"},
      {"substrax.v1.ProgramLaunch.assignment", "the fields below"},
      {"substrax.v1.ProgramLaunch.coordinator", "no: a command reports through the agent"},
      {"substrax.v1.ProgramLaunch.transport", "no: credentials never reach a command"},
      {"substrax.v1.ProgramLaunch.listen_host", "no: the rendezvous hosts are the options'"},
      {"substrax.v1.ProgramLaunch.collective_timeout", "no: the framework's collectives"},
      {"substrax.v1.ProgramLaunch.data_roots", "SUBSTRAX_DATA_ROOTS"},
      {"substrax.v1.ProgramLaunch.checkpoint_roots", "SUBSTRAX_CHECKPOINT_ROOTS"},
      {"substrax.v1.ProgramLaunch.result_path", "no: a command answers with its exit status"},
      {"substrax.v1.ProgramLaunch.started_path", "no: a command has no Init to call"},
      {"substrax.v1.ProgramLaunch.activity_path",
       "no: the launcher publishes there when each process last wrote a report line"},
      {"substrax.v1.Assignment.job_id", "SUBSTRAX_JOB_ID"},
      {"substrax.v1.Assignment.attempt", "SUBSTRAX_ATTEMPT"},
      {"substrax.v1.Assignment.spec", "the fields below"},
      {"substrax.v1.Assignment.mesh", "SUBSTRAX_MESH_FILE"},
      {"substrax.v1.Assignment.process_index", "GROUP_RANK"},
      {"substrax.v1.Assignment.num_processes", "PET_NNODES"},
      {"substrax.v1.Assignment.local_device_ids", "SUBSTRAX_LOCAL_DEVICE_IDS"},
      {"substrax.v1.Assignment.layouts", "no: the built-in trainer's shard layouts"},
      {"substrax.v1.Assignment.rendezvous_prefix",
       "no: the coordinator's store is not a command's"},
      {"substrax.v1.Assignment.rendezvous_secret", "no: a credential"},
      {"substrax.v1.Assignment.checkpoint_owner_directory", "no: the agent's check"},
      {"substrax.v1.Assignment.attempt_token", "no: a credential"},
      {"substrax.v1.JobSpec.name", "no: SUBSTRAX_JOB_ID names the job"},
      {"substrax.v1.JobSpec.model", "no: built-in jobs only"},
      {"substrax.v1.JobSpec.data", "no: built-in jobs only"},
      {"substrax.v1.JobSpec.optimizer", "no: built-in jobs only"},
      {"substrax.v1.JobSpec.mesh", "SUBSTRAX_MESH_FILE"},
      {"substrax.v1.JobSpec.batch", "the fields below"},
      {"substrax.v1.JobSpec.steps", "SUBSTRAX_STEPS"},
      {"substrax.v1.JobSpec.epochs", "SUBSTRAX_EPOCHS"},
      {"substrax.v1.JobSpec.seed", "SUBSTRAX_SEED"},
      {"substrax.v1.JobSpec.metrics", "SUBSTRAX_METRICS"},
      {"substrax.v1.JobSpec.report_every_steps", "SUBSTRAX_REPORT_EVERY_STEPS"},
      {"substrax.v1.JobSpec.backend", "CUDA_VISIBLE_DEVICES"},
      {"substrax.v1.JobSpec.checkpoint", "the fields below"},
      {"substrax.v1.JobSpec.max_restarts", "TORCHELASTIC_MAX_RESTARTS"},
      {"substrax.v1.JobSpec.command", "no: the launcher runs it (argv, its env, working dir)"},
      {"substrax.v1.ProgramLaunch.command",
       "no: the launcher's (the executable, working dir, port range, stop grace)"},
      {"substrax.v1.JobSpec.precision", "no: the framework's choice"},
      {"substrax.v1.JobSpec.max_duration_seconds", "no: the coordinator enforces it"},
      {"substrax.v1.JobSpec.progress_timeout_seconds", "no: the coordinator enforces it"},
      {"substrax.v1.JobSpec.resume_from", "SUBSTRAX_RESUME_FROM"},
      {"substrax.v1.JobSpec.program", "no: exclusive with a command"},
      {"substrax.v1.JobSpec.gradients", "no: the built-in trainer's"},
      {"substrax.v1.JobSpec.tensorboard", "the fields below"},
      {"substrax.v1.JobSpec.queue", "no: the coordinator's scheduling"},
      {"substrax.v1.JobSpec.priority_class", "no: the coordinator's scheduling"},
      {"substrax.v1.JobSpec.preemptible",
       "no: a preemption reaches the command as SIGTERM (docs/command-jobs.md, Preemption)"},
      {"substrax.v1.JobSpec.doctor", "no: a doctor job runs no command (substraxctl doctor)"},
      {"substrax.v1.BatchSpec.global_batch_size", "SUBSTRAX_GLOBAL_BATCH_SIZE"},
      {"substrax.v1.BatchSpec.per_device_batch_size", "SUBSTRAX_PER_DEVICE_BATCH_SIZE"},
      {"substrax.v1.CheckpointSpec.directory", "SUBSTRAX_CHECKPOINT_DIR"},
      {"substrax.v1.CheckpointSpec.every_steps", "no: when to save is the command's"},
      {"substrax.v1.CheckpointSpec.every_seconds", "no: when to save is the command's"},
      {"substrax.v1.CheckpointSpec.keep_last", "no: the command keeps its own"},
      {"substrax.v1.CheckpointSpec.at_end", "no: the command's"},
      {"substrax.v1.TensorBoardSpec.directory", "SUBSTRAX_TENSORBOARD_DIR"},
  };
  return *kUses;
}

TEST(CommandEnvTest, EveryFieldOfTheLaunchHasAVariableOrAReason) {
  const std::map<std::string, std::string> full =
      AsMap(Render(FullLaunch(v1::DEVICE_KIND_CPU),
                   Options(CommandProcesses::kPerWorker, CommandBackend::kCpu)));
  for (const google::protobuf::Descriptor* message :
       {v1::ProgramLaunch::descriptor(), v1::Assignment::descriptor(), v1::JobSpec::descriptor(),
        v1::BatchSpec::descriptor(), v1::CheckpointSpec::descriptor(),
        v1::TensorBoardSpec::descriptor()}) {
    for (int i = 0; i < message->field_count(); ++i) {
      const std::string field = message->field(i)->full_name();
      const auto use = FieldUses().find(field);
      if (use == FieldUses().end()) {
        ADD_FAILURE() << field << " is new: render it in RenderCommandEnv (command_env.cc) and "
                      << "add it here and to docs/command-jobs.md, or say here why a command "
                      << "does not get it";
        continue;
      }
      const std::string& variable = use->second;
      if (absl::StartsWith(variable, "no: ") || variable == "the fields below") continue;
      if (variable == "SUBSTRAX_EPOCHS") continue;  // exclusive with steps: below
      EXPECT_TRUE(full.count(variable)) << field << " -> " << variable;
    }
  }
  v1::ProgramLaunch launch = FullLaunch(v1::DEVICE_KIND_CPU);
  launch.mutable_assignment()->mutable_spec()->set_epochs(3);
  const std::map<std::string, std::string> by_epochs =
      AsMap(Render(launch, Options(CommandProcesses::kPerWorker, CommandBackend::kCpu)));
  EXPECT_EQ(by_epochs.at("SUBSTRAX_EPOCHS"), "3");
  EXPECT_FALSE(by_epochs.count("SUBSTRAX_STEPS"));
}

TEST(CommandEnvTest, NamesComeInTheListedOrderAndTheListIsExactlyWhatCanBeRendered) {
  std::set<std::string> seen;
  v1::ProgramLaunch by_epochs = FullLaunch(v1::DEVICE_KIND_CPU);
  by_epochs.mutable_assignment()->mutable_spec()->set_epochs(3);
  for (const Case& c : Cases()) {
    for (const v1::ProgramLaunch& launch : {FullLaunch(KindOf(c.backend)), by_epochs}) {
      if (launch.assignment().mesh().devices(0).kind() != KindOf(c.backend)) continue;
      const std::vector<CommandEnvVar> env = Render(launch, Options(c.processes, c.backend));
      // A subsequence of CommandEnvNames(): every name listed, in its place.
      size_t next = 0;
      for (const CommandEnvVar& v : env) {
        while (next < CommandEnvNames().size() && CommandEnvNames()[next] != v.name) ++next;
        EXPECT_LT(next, CommandEnvNames().size()) << v.name << " out of order or unlisted";
        seen.insert(v.name);
      }
    }
  }
  EXPECT_EQ(seen, std::set<std::string>(CommandEnvNames().begin(), CommandEnvNames().end()));
}

TEST(CommandEnvTest, SettingsTheSpecLeavesOutAreAbsentNotEmpty) {
  v1::ProgramLaunch launch;
  v1::Assignment* a = launch.mutable_assignment();
  a->set_job_id("j");
  a->set_num_processes(1);
  a->add_local_device_ids(0);
  a->mutable_mesh()->add_devices()->set_id(0);
  const std::map<std::string, std::string> env =
      AsMap(Render(launch, Options(CommandProcesses::kPerWorker, CommandBackend::kCpu)));
  for (const char* name :
       {"SUBSTRAX_GLOBAL_BATCH_SIZE", "SUBSTRAX_PER_DEVICE_BATCH_SIZE", "SUBSTRAX_STEPS",
        "SUBSTRAX_EPOCHS", "SUBSTRAX_REPORT_EVERY_STEPS", "SUBSTRAX_METRICS",
        "SUBSTRAX_CHECKPOINT_DIR", "SUBSTRAX_RESUME_FROM", "SUBSTRAX_TENSORBOARD_DIR",
        "SUBSTRAX_DATA_ROOTS", "SUBSTRAX_CHECKPOINT_ROOTS"}) {
    EXPECT_FALSE(env.count(name)) << name;
  }
  EXPECT_EQ(env.at("SUBSTRAX_SEED"), "0");
  EXPECT_EQ(env.at("SUBSTRAX_ATTEMPT"), "0");
  EXPECT_EQ(env.at("RANK"), "0");
  EXPECT_EQ(env.at("WORLD_SIZE"), "1");
  EXPECT_EQ(env.at("TORCHELASTIC_MAX_RESTARTS"), "0");
  EXPECT_EQ(env.at("CUDA_VISIBLE_DEVICES"), "");
  EXPECT_EQ(env.at("JAX_NUM_CPU_DEVICES"), "1");
}

TEST(CommandEnvTest, ARestartResumesFromTheCheckpointDirectoryUnlessTheSpecSaysWhere) {
  v1::ProgramLaunch launch = FullLaunch(v1::DEVICE_KIND_CPU);
  launch.mutable_assignment()->mutable_spec()->clear_resume_from();
  CommandEnvOptions options = Options(CommandProcesses::kPerWorker, CommandBackend::kCpu);
  options.restart_count = 0;
  EXPECT_FALSE(AsMap(Render(launch, options)).count("SUBSTRAX_RESUME_FROM"));
  options.restart_count = 2;
  std::map<std::string, std::string> env = AsMap(Render(launch, options));
  EXPECT_EQ(env.at("SUBSTRAX_RESUME_FROM"), "/ckpt/mnist-1");
  EXPECT_EQ(env.at("TORCHELASTIC_RESTART_COUNT"), "2");
  launch.mutable_assignment()->mutable_spec()->set_resume_from("/ckpt/old");
  EXPECT_EQ(AsMap(Render(launch, options)).at("SUBSTRAX_RESUME_FROM"), "/ckpt/old");
}

TEST(CommandEnvTest, NoCredentialOrLaunchInternalReachesTheCommand) {
  for (const Case& c : Cases()) {
    const v1::ProgramLaunch launch = FullLaunch(KindOf(c.backend));
    for (const CommandEnvVar& v : Render(launch, Options(c.processes, c.backend))) {
      for (const std::string& secret :
           {launch.assignment().rendezvous_secret(), launch.assignment().attempt_token(),
            launch.transport().attempt_token(), launch.transport().ca_file(),
            launch.transport().server_name(), launch.coordinator(),
            launch.assignment().rendezvous_prefix(), launch.result_path(), launch.started_path()}) {
        EXPECT_FALSE(absl::StrContains(v.value, secret)) << c.name << ": " << v.name;
      }
      EXPECT_FALSE(absl::StartsWith(v.name, "SLURM_") || absl::StartsWith(v.name, "OMPI_"))
          << v.name;
    }
  }
}

TEST(CommandEnvTest, CudaDevicesAreNamedAsTheAgentSeesThem) {
  CommandEnvOptions options = Options(CommandProcesses::kPerDevice, CommandBackend::kCuda);
  options.agent_cuda_visible_devices = {"GPU-aaaa", "GPU-bbbb", "GPU-cccc"};
  EXPECT_EQ(AsMap(Render(FullLaunch(v1::DEVICE_KIND_CUDA), options)).at("CUDA_VISIBLE_DEVICES"),
            "GPU-bbbb,GPU-aaaa");
  options.agent_cuda_visible_devices = {"3"};  // local_index 1 is past it
  absl::StatusOr<std::vector<CommandEnvVar>> env =
      RenderCommandEnv(FullLaunch(v1::DEVICE_KIND_CUDA), options);
  EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(env.status().message(), HasSubstr("local_index 1, but the agent sees 1 GPUs"));
}

TEST(CommandEnvTest, AnIpv6RendezvousIsBracketedOnlyInHostPort) {
  CommandEnvOptions options = Options(CommandProcesses::kPerWorker, CommandBackend::kCpu);
  options.torch_master_host = "fd00::9";
  options.jax_coordinator_host = "fd00::9";
  const std::map<std::string, std::string> env =
      AsMap(Render(FullLaunch(v1::DEVICE_KIND_CPU), options));
  EXPECT_EQ(env.at("MASTER_ADDR"), "fd00::9");
  EXPECT_EQ(env.at("PET_MASTER_ADDR"), "fd00::9");
  EXPECT_EQ(env.at("JAX_COORDINATOR_ADDRESS"), "[fd00::9]:29600");
}

TEST(CommandEnvTest, BadInputsAreRefusedNamingWhatToFix) {
  struct Bad {
    std::string name;
    std::function<void(v1::ProgramLaunch&, CommandEnvOptions&)> change;
    std::string message;
  };
  const std::vector<Bad> bads = {
      {"no assignment", [](auto& l, auto&) { l.clear_assignment(); }, "has no assignment"},
      {"process index", [](auto& l, auto&) { l.mutable_assignment()->set_process_index(2); },
       "process_index 2 is not in [0, num_processes 2)"},
      {"no devices", [](auto& l, auto&) { l.mutable_assignment()->clear_local_device_ids(); },
       "local_device_ids is empty"},
      {"device not in mesh",
       [](auto& l, auto&) { l.mutable_assignment()->add_local_device_ids(99); },
       "device 99 is not in the attempt's mesh"},
      {"per_device foreign device",
       [](auto&, auto& o) {
         o.processes = CommandProcesses::kPerDevice;
         o.device_id = 20;
       },
       "options.device_id: per_device, but device 20 is not one of this worker's devices "
       "(11,10)"},
      {"empty host", [](auto&, auto& o) { o.torch_master_host = ""; },
       "options.torch_master_host: empty"},
      {"long host", [](auto&, auto& o) { o.jax_coordinator_host = std::string(254, 'h'); },
       "options.jax_coordinator_host: too long"},
      {"bracketed host", [](auto&, auto& o) { o.torch_master_host = "[fd00::9]"; },
       "is not a host name or address"},
      {"port", [](auto&, auto& o) { o.jax_coordinator_port = 65536; },
       "options.jax_coordinator_port: 65536 is not a port"},
      {"relative file", [](auto&, auto& o) { o.report_file = "report.jsonl"; },
       "options.report_file: 'report.jsonl' is not an absolute path"},
      {"restart count", [](auto&, auto& o) { o.restart_count = -1; }, "is negative"},
      {"control character", [](auto& l, auto&) { l.mutable_assignment()->set_job_id("a\nb"); },
       "(from launch.assignment.job_id) would hold the control character 0x0a"},
      {"root with colon", [](auto& l, auto&) { l.add_checkpoint_roots("/a:b"); },
       "launch.checkpoint_roots: the root '/a:b' holds ':'"},
      {"metric with comma",
       [](auto& l, auto&) {
         (*l.mutable_assignment()->mutable_spec()->mutable_metrics())["a,b"] = v1::REDUCTION_SUM;
       },
       "the name 'a,b' cannot be listed in SUBSTRAX_METRICS"},
      {"cpu device under cuda", [](auto&, auto& o) { o.backend = CommandBackend::kCuda; },
       "backend cuda: the mesh's device 11 on host a is a CPU device"},
      {"value too long",
       [](auto& l, auto&) { l.add_data_roots("/" + std::string(kMaxCommandEnvValueBytes, 'd')); },
       absl::StrCat("SUBSTRAX_DATA_ROOTS (from launch.data_roots) would have ",
                    kMaxCommandEnvValueBytes + 17, " bytes, more than the limit of 16384")},
      {"whole too long",
       [](auto& l, auto& o) {
         const std::string part(kMaxCommandEnvValueBytes - 100, 'p');
         l.add_data_roots("/" + part);
         l.add_checkpoint_roots("/" + part);
         o.mesh_file = "/" + part;
         o.report_file = "/" + part;
       },
       "more than the limit of 65536; fewer or shorter"},
  };
  for (const Bad& bad : bads) {
    v1::ProgramLaunch launch = FullLaunch(v1::DEVICE_KIND_CPU);
    CommandEnvOptions options = Options(CommandProcesses::kPerWorker, CommandBackend::kCpu);
    bad.change(launch, options);
    absl::StatusOr<std::vector<CommandEnvVar>> env = RenderCommandEnv(launch, options);
    EXPECT_EQ(env.status().code(), absl::StatusCode::kInvalidArgument) << bad.name;
    EXPECT_THAT(env.status().message(), HasSubstr(bad.message)) << bad.name;
  }
}

TEST(CommandEnvTest, TheMeshFileIsTheMeshInJsonWithEveryField) {
  const std::string json = EncodeMeshFile(FullLaunch(v1::DEVICE_KIND_CPU).assignment().mesh());
  EXPECT_THAT(json, HasSubstr(R"("axis_names":["data","model"])"));
  EXPECT_THAT(json, HasSubstr(R"("shape":["2","2"])"));
  // Defaults are written too: device 10's local_index 0.
  EXPECT_THAT(json, HasSubstr(R"("id":10,"host":"a","worker_id":"w-a","local_index":0,)"));
  EXPECT_TRUE(absl::EndsWith(json, "}\n")) << json;
  EXPECT_EQ(json.find('\n'), json.size() - 1) << json;
}

}  // namespace
}  // namespace substrax
