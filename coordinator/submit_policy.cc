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

absl::StatusOr<v1::JobSpec> AdmitJobSpec(v1::JobSpec spec, const AliveDevices& alive,
                                         const std::vector<std::string>& data_roots,
                                         const std::vector<std::string>& checkpoint_roots,
                                         const std::string& checkpoint_owner_dir,
                                         const std::vector<std::string>& programs_dirs,
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
  SUBSTRAX_RETURN_IF_ERROR(CheckDataPathsUnderRoots(spec.data(), data_roots));
  // Checkpoints are written and read only beneath the workers' --checkpoint-root directories;
  // the runner checks again, on the file system, before it writes or reads one.
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCheckpointPathsUnderRoots(spec, checkpoint_roots, checkpoint_owner_dir));
  // Programs run only from the workers' --programs-dir directories; each daemon checks again on
  // its file system (symlinks resolved) before it starts one.
  SUBSTRAX_RETURN_IF_ERROR(CheckProgramPathUnderDirs(spec, programs_dirs));
  // ValidateJobSpec refused what no setting allows; the allowlist is this cluster's.
  std::vector<std::string> refused;
  for (const auto& [name, value] : spec.program().env()) {
    if (std::string why = JobEnvRefusal(name, job_env_allow); !why.empty()) {
      refused.push_back(absl::StrCat("spec.program.env.", name, ": ", why));
    }
  }
  if (!refused.empty()) {
    std::sort(refused.begin(), refused.end());  // the map's order is not stable
    return absl::InvalidArgumentError(absl::StrJoin(refused, "\n"));
  }
  if (!refuse_jobs_that_cannot_fit) return spec;
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
