// `substraxctl plan --env`: the environment each process of a command job's planned attempt
// would get, rendered by the contract's own function (contract/command_env.h RenderCommandEnv),
// so that what the plan shows is what the agent sets. What only the launch decides is shown as a
// placeholder: the ports process 0's agent picks ("<port picked at launch>"), the attempt's
// directory on each worker ("<attempt dir>/report-0.jsonl"), the job id's number
// ("NAME-<n>"). The attempt is the first (no restart).
//
// Pure: no RPC, no I/O; thread-safe.
#ifndef SUBSTRAX_CLIENT_PLAN_ENV_H_
#define SUBSTRAX_CLIENT_PLAN_ENV_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "contract/command_env.h"
#include "core/mesh.h"
#include "google/protobuf/struct.pb.h"
#include "substrax/v1/job.pb.h"

namespace substrax::ctl {

// The placeholders, as printed.
inline constexpr char kPortPickedAtLaunch[] = "<port picked at launch>";
inline constexpr char kAttemptDir[] = "<attempt dir>";

// What the plan knows of a worker beyond its devices.
struct PlanWorker {
  // The host of its listen address (where process 0's agent would publish the rendezvous).
  std::string host;
  // Its --data-root and --checkpoint-root directories (SUBSTRAX_DATA_ROOTS, ...).
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
};

// One process of the planned attempt.
struct PlannedProcess {
  int rank = 0;  // SUBSTRAX_PROCESS_INDEX: per_worker the worker's index, per_device the device's
  std::string worker_id;
  std::vector<int> device_ids;  // the mesh devices it drives
  std::vector<CommandEnvVar> env;
};

// The processes of `spec`'s first attempt on `mesh` (the plan's), in rank order, each with its
// environment. `workers` by worker id; a worker missing from it is shown with its devices' host
// and no roots. Errors: INVALID_ARGUMENT when `spec` has no command (naming --env), or
// RenderCommandEnv's (a value or the whole contract too large, a root with ':', ...).
absl::StatusOr<std::vector<PlannedProcess>> PlanCommandEnv(
    const v1::JobSpec& spec, const Mesh& mesh, const std::map<std::string, PlanWorker>& workers);

// For people: `title`, the command, then each process's variables as NAME=value, one a line.
std::string FormatPlanEnv(const std::vector<PlannedProcess>& processes, const v1::JobSpec& spec,
                          absl::string_view title);

// For -o json / yaml: {job, command, processes: [{rank, worker_id, device_ids, env:
// ["NAME=value", ...]}]}, the variables in the contract's order.
google::protobuf::Struct PlanEnvToStruct(const std::vector<PlannedProcess>& processes,
                                         const v1::JobSpec& spec);

// The host of a worker's address: "10.0.0.7" of "10.0.0.7:7000", "fd00::7" of "[fd00::7]:7000";
// an address without a port is its own host.
std::string AddressHost(absl::string_view address);

// "python train.py --lr 0.1 'two words'": a command line, arguments quoted where a shell would
// need it.
std::string ShellLine(const std::vector<std::string>& words);

// "python train.py (python_env jax, per_worker)": a command job's command, how it is found and
// laid out.
std::string CommandSpecLine(const v1::CommandSpec& command);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_PLAN_ENV_H_
