// The environment contract of command jobs (spec.command; docs/command-jobs.md is the
// reference): the variables a command's process gets so that a program written for torchrun, for
// `jax.distributed` or for Kubeflow Trainer finds its peers, its rank and its settings without
// change. One pure function from the launch contract (contract/launch.h), so that the command's
// launcher (worker/command_launcher.h), `substraxctl plan --env` and the docs cannot disagree.
//
// What it renders, in this order:
//   torchrun's worker variables  MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK,
//                                LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, TORCHELASTIC_RUN_ID,
//                                TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS,
//                                TORCHELASTIC_ERROR_FILE (the error file)
//   torchrun's own arguments     PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
//                                PET_MASTER_PORT (torchrun reads `--foo` from PET_FOO when the
//                                command line leaves it out: `torchrun train.py` works unchanged)
//   JAX                          JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID,
//                                JAX_NUM_CPU_DEVICES (CPU only)
//   the devices                  CUDA_VISIBLE_DEVICES (empty on CPU: the command sees no GPU)
//   substrax's own               SUBSTRAX_* (job, attempt, process, devices, settings, files)
//
// Ranks. per_worker (one process per worker of the attempt, the JAX way, or torchrun per
// worker): RANK = GROUP_RANK = NODE_RANK = the launch's process_index, WORLD_SIZE = its
// num_processes, LOCAL_RANK 0 of LOCAL_WORLD_SIZE 1. per_device (one process per mesh device,
// plain torch.distributed): RANK = the device's position in the mesh (row-major: rank r drives
// devices[r] of the mesh file), WORLD_SIZE = the mesh's devices, LOCAL_RANK = the device's
// position in the worker's local_device_ids, LOCAL_WORLD_SIZE = their count, GROUP_RANK =
// NODE_RANK = the worker's process_index. CUDA_VISIBLE_DEVICES lists the worker's GPUs in
// local_device_ids order in both modes, so that cuda:LOCAL_RANK is the process's own device.
//
// Never in it: the launch's transport (the coordinator, its CA, the attempt token), the
// rendezvous secret, anything of the worker's identity; no SLURM_* or OMPI_* variable. Every
// name it can produce is in CommandEnvNames(), and core/job_env.h refuses each of them in a
// spec's env (tests/launch/command_env_reserved_test.cc).
//
// Pure: no I/O, no environment read; thread-safe.
#ifndef SUBSTRAX_CONTRACT_COMMAND_ENV_H_
#define SUBSTRAX_CONTRACT_COMMAND_ENV_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "substrax/v1/program.pb.h"
#include "substrax/v1/topology.pb.h"

namespace substrax {

// The longest value of one variable (a list of roots, of devices, of metrics), and of the whole
// contract (every "NAME=value" with its terminating NUL). Linux refuses a single environment
// string over 128 KiB (MAX_ARG_STRLEN) and argv with the environment over a quarter of the
// stack limit; these leave the rest to the command's own argv and env.
inline constexpr size_t kMaxCommandEnvValueBytes = 16 * 1024;
inline constexpr size_t kMaxCommandEnvBytes = 64 * 1024;
// The longest rendezvous host (a DNS name has at most 253 bytes).
inline constexpr size_t kMaxCommandEnvHostBytes = 253;

// How many processes a worker starts for its part of the attempt (spec.command.processes).
enum class CommandProcesses {
  kPerWorker,  // one, driving every local device
  kPerDevice,  // one per local device
};

// What drives the devices (the spec's backend, with auto resolved by the caller).
enum class CommandBackend { kCpu, kCuda };

// What the launch does not hold: the caller (the agent) fills it in for each process it starts.
struct CommandEnvOptions {
  // Where torch's rendezvous is (MASTER_ADDR/PORT, PET_MASTER_ADDR/PORT): the address process
  // 0's agent picked on its listen address, and the port it published for the attempt. An IPv6
  // address is given bare ("fd00::7"); the renderer brackets it where a host:port needs it.
  std::string torch_master_host;
  int torch_master_port = 0;
  // Where JAX's coordinator is (JAX_COORDINATOR_ADDRESS), likewise.
  std::string jax_coordinator_host;
  int jax_coordinator_port = 0;
  CommandProcesses processes = CommandProcesses::kPerWorker;
  // kPerDevice: the mesh id of the device this process drives, one of the launch's
  // local_device_ids. Unused for kPerWorker.
  int device_id = -1;
  // How many times the job has been restarted before this attempt (TORCHELASTIC_RESTART_COUNT;
  // 0 for the first). The limit, TORCHELASTIC_MAX_RESTARTS, is the spec's max_restarts.
  int restart_count = 0;
  CommandBackend backend = CommandBackend::kCpu;
  // CUDA only: the agent's own CUDA_VISIBLE_DEVICES entries, in order, when it runs under one
  // (a device's local_index counts among the GPUs the agent sees, and the command's value must
  // name them as the driver does); empty when the agent sees every GPU.
  std::vector<std::string> agent_cuda_visible_devices;
  // Absolute paths of the files the agent writes or reads for this process: the attempt's mesh
  // (EncodeMeshFile), the report file the command appends to, the error file it may write.
  std::string mesh_file;
  std::string report_file;
  std::string error_file;
};

// One variable of the contract.
struct CommandEnvVar {
  std::string name;
  std::string value;
  bool operator==(const CommandEnvVar& other) const {
    return name == other.name && value == other.value;
  }
};

// The contract for one process, in the order above. Settings the spec leaves out
// (SUBSTRAX_CHECKPOINT_DIR without spec.checkpoint, SUBSTRAX_STEPS for a spec given in epochs,
// ...) are absent rather than empty; CUDA_VISIBLE_DEVICES is always present.
// Errors: INVALID_ARGUMENT saying which field to fix: a launch without an assignment, a process
// index outside [0, num_processes), no local devices or one that is not in the mesh, a
// per_device device_id that is not local, a rendezvous host that is empty, too long or not a
// plain host, a port outside 1..65535, a file path that is not absolute, a value with a control
// character, a root with ':' (the list separator), a metric name with ',' or '=', a CUDA device
// of kind CPU or a local_index outside agent_cuda_visible_devices, and a value or the whole
// past kMaxCommandEnvValueBytes / kMaxCommandEnvBytes (naming the variable and its size).
absl::StatusOr<std::vector<CommandEnvVar>> RenderCommandEnv(const v1::ProgramLaunch& launch,
                                                            const CommandEnvOptions& options);

// Every name RenderCommandEnv can produce, in its order, whatever the mode, backend and spec:
// what a spec's env may never set.
const std::vector<std::string>& CommandEnvNames();

// The mesh file's contents (SUBSTRAX_MESH_FILE): the attempt's v1::Mesh in protobuf's JSON
// mapping with the proto's field names, on one line (`{"axis_names":["data"],"shape":["4"],
// "devices":[{"id":0,"host":"h1",...},...]}`; 64-bit shape values are JSON strings, as the
// mapping has it).
std::string EncodeMeshFile(const v1::Mesh& mesh);

}  // namespace substrax

#endif  // SUBSTRAX_CONTRACT_COMMAND_ENV_H_
