#include "coordinator/submit_policy.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/data_paths.h"
#include "core/device_mesh_manager.h"
#include "core/job_env.h"
#include "core/job_spec.h"
#include "core/status.h"

namespace substrax {

namespace {

// Whether a worker can run the command job `spec`: its Python environment is one of theirs, and
// one of them runs commands at all (the programs dir is CheckProgramPathUnderDirs's).
absl::Status CheckCommandRunnable(const v1::JobSpec& spec, const WorkerOffers& offers) {
  if (!spec.has_command()) return absl::OkStatus();
  const std::string& env = spec.command().python_env();
  if (!env.empty() &&
      std::find(offers.python_envs.begin(), offers.python_envs.end(), env) ==
          offers.python_envs.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.command.python_env: no worker has a Python environment named '", env, "' (",
        offers.python_envs.empty()
            ? "no worker has registered any"
            : absl::StrCat("they have ", absl::StrJoin(offers.python_envs, ", ")),
        "); use one of theirs or start a worker daemon with --python-env ", env, "=DIR"));
  }
  if (!offers.runs_commands) {
    return absl::FailedPreconditionError(
        "spec.command: no worker runs command jobs: a command runs any code its argv names, so "
        "a worker daemon runs them only as a user of their own (--job-user USER) or when its "
        "operator allows them (--allow-command-jobs); restart the daemons with one of them");
  }
  return absl::OkStatus();
}

// A job's own variables that this cluster's allowlist refuses (ValidateJobSpec refused what no
// setting allows), one "path: why" line each.
template <typename Map>
void RefuseEnv(const Map& env, const std::string& prefix,
               const std::vector<std::string>& job_env_allow, std::vector<std::string>* refused) {
  for (const auto& [name, value] : env) {
    if (std::string why = JobEnvRefusal(name, job_env_allow); !why.empty()) {
      refused->push_back(absl::StrCat(prefix, ".", name, ": ", why));
    }
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> AdmitJobSpec(v1::JobSpec spec, const AliveDevices& alive,
                                         const WorkerOffers& offers,
                                         const std::string& checkpoint_owner_dir,
                                         const std::vector<std::string>& job_env_allow,
                                         bool refuse_jobs_that_cannot_fit) {
  for (const auto& [field, value] :
       {std::pair<const char*, int64_t>{"spec.max_duration_seconds", spec.max_duration_seconds()},
        {"spec.progress_timeout_seconds", spec.progress_timeout_seconds()}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": must be >= 0 (0: no limit / the default), got ", value));
    }
  }
  ApplyJobSpecDefaults(&spec);
  SUBSTRAX_RETURN_IF_ERROR(ValidateJobSpec(spec));
  // Data files are read only beneath the roots the workers offer (their --data-root flags);
  // the runner enforces it again when it opens them, through symlinks too.
  SUBSTRAX_RETURN_IF_ERROR(CheckDataPathsUnderRoots(spec.data(), offers.data_roots));
  // Checkpoints are written and read only beneath the workers' --checkpoint-root directories;
  // the runner checks again, on the file system, before it writes or reads one.
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCheckpointPathsUnderRoots(spec, offers.checkpoint_roots, checkpoint_owner_dir));
  // Programs and commands run only from the workers' --programs-dir directories; each daemon
  // checks again on its file system (symlinks resolved) before it starts one.
  SUBSTRAX_RETURN_IF_ERROR(CheckProgramPathUnderDirs(spec, offers.programs_dirs));
  SUBSTRAX_RETURN_IF_ERROR(CheckCommandRunnable(spec, offers));
  std::vector<std::string> refused;
  RefuseEnv(spec.program().env(), "spec.program.env", job_env_allow, &refused);
  RefuseEnv(spec.command().env(), "spec.command.env", job_env_allow, &refused);
  if (!refused.empty()) {
    std::sort(refused.begin(), refused.end());  // the map's order is not stable
    return absl::InvalidArgumentError(absl::StrJoin(refused, "\n"));
  }
  // A doctor job's workers were chosen among the alive ones with a free device.
  if (!refuse_jobs_that_cannot_fit || spec.has_doctor()) return spec;
  // A mesh the alive cluster could never hold is refused now, saying what is available, rather
  // than left waiting for workers that may never come.
  // (An elastic data axis needs only its smallest size.)
  const v1::JobSpec smallest = SpecWithDataParallelSize(spec, DataParallelSizes(spec).back());
  absl::StatusOr<Mesh> mesh =
      CreateMeshForJob(smallest.mesh(), DevicesForBackend(SchedulingBackend(spec), alive.devices));
  if (!mesh.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat(mesh.status().message(), "; the cluster has ", alive.workers,
                     alive.workers == 1 ? " alive worker" : " alive workers"));
  }
  return spec;
}

int64_t TotalSteps(const v1::JobSpec& spec) {
  if (spec.length_case() == v1::JobSpec::kSteps) return spec.steps();
  // The coordinator reads no data files (a path such as /dev/zero or a FIFO would wedge it):
  // only synthetic data says its size in the spec; for files the runners report it.
  const int64_t batch = spec.batch().global_batch_size();
  if (spec.data().format() != v1::DATA_FORMAT_SYNTHETIC || batch <= 0) return 0;
  return spec.epochs() * (spec.data().synthetic().num_train_examples() / batch);
}

}  // namespace substrax
