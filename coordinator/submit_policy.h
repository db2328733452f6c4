// The coordinator's submit policy: what Cluster::SubmitJob decides about a spec before the job
// is queued (defaults, validation, refusals, whether the cluster could ever hold it). Apart from
// the state machine so that it reads and is tested on its own. Pure: no locks, no RPC.
#ifndef SUBSTRAX_COORDINATOR_SUBMIT_POLICY_H_
#define SUBSTRAX_COORDINATOR_SUBMIT_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/device.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

// The devices of the alive workers, busy or not: what the cluster could hold when idle.
struct AliveDevices {
  std::vector<Device> devices;
  size_t workers = 0;
};

// What the known workers offer jobs (alive or not: a dead worker may come back, and a job that
// needs it waits for it like one that waits for devices), each list without repeats.
struct WorkerOffers {
  // Their --data-root, --checkpoint-root and --programs-dir directories.
  std::vector<std::string> data_roots;
  std::vector<std::string> checkpoint_roots;
  std::vector<std::string> programs_dirs;
  // The names of their Python environments (--python-env NAME=DIR).
  std::vector<std::string> python_envs;
  // Whether any of them runs command jobs (RegisterWorkerRequest.runs_commands).
  bool runs_commands = false;
};

// Applies the spec's defaults and admits it, or says why not. Errors, checked in this order:
// INVALID_ARGUMENT (a negative max_duration_seconds or progress_timeout_seconds; then
// ValidateJobSpec's message: one "path: problem" per line; then a data path that is not
// absolute and normalized or not under one of `offers.data_roots`: CheckDataPathsUnderRoots in
// core/data_paths.h, by the path string alone; then a checkpoint directory, resume_from or
// TensorBoard directory not under one of `offers.checkpoint_roots`, or, when
// `checkpoint_owner_dir` is not empty, not in that directory of one:
// CheckCheckpointPathsUnderRoots; then a program job's spec.program.path, or a command job's
// spec.command.argv[0] without python_env, not under one of `offers.programs_dirs`:
// CheckProgramPathUnderDirs; then a spec.command.python_env that no known worker has, listing
// those they have; then a spec.program.env or spec.command.env variable that core/job_env.h
// refuses with `job_env_allow`, the administrator's --job-env-allow patterns added to the
// default allowlist: one "spec.program.env.NAME: not allowed: ..." line each),
// FAILED_PRECONDITION (a command job when no known worker runs command jobs: their daemons need
// --job-user or --allow-command-jobs), and, when `refuse_jobs_that_cannot_fit`,
// RESOURCE_EXHAUSTED (even idle, `alive` could not hold the job's smallest mesh on the devices
// of its SchedulingBackend, CPU devices for a program job; the message is CreateMeshForJob's and
// says how many alive workers there are). A job that fits but finds the devices busy is
// admitted: it waits, PENDING.
absl::StatusOr<v1::JobSpec> AdmitJobSpec(v1::JobSpec spec, const AliveDevices& alive,
                                         const WorkerOffers& offers,
                                         const std::string& checkpoint_owner_dir,
                                         const std::vector<std::string>& job_env_allow,
                                         bool refuse_jobs_that_cannot_fit);

// Steps an admitted job will run: spec.steps, or epochs x steps per epoch for synthetic data;
// 0 when only the data files could say (the runners report it: StepReport.total_steps). Reads
// no file.
int64_t TotalSteps(const v1::JobSpec& spec);

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_SUBMIT_POLICY_H_
