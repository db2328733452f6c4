// The host checks of `substraxctl doctor` (docs/diagnosis.md), as the doctor's job process runs
// them on each worker: what the kernels need of the CPU, and the space and permissions of the
// directories a job uses. Each check gives a finding: what was seen and, when something is
// wrong, what to do. Links between hosts and the clock are measured elsewhere (they need the
// other processes, or the coordinator).
#ifndef SUBSTRAX_WORKER_DOCTOR_CHECKS_H_
#define SUBSTRAX_WORKER_DOCTOR_CHECKS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace substrax::doctor {

enum class Verdict { kOk, kWarning, kProblem };

struct Finding {
  std::string check;  // "cpu", "data root /data", "checkpoint root /ckpt", "work dir /var/..."
  Verdict verdict = Verdict::kOk;
  std::string seen;   // "AVX2, FMA, F16C", "812 GiB free of 1 TiB, readable"
  std::string fix;    // what to do; empty when OK
};

// Free space under which a directory a job writes to is a warning, and a problem.
struct SpaceLimits {
  int64_t warn_below_bytes = int64_t{10} << 30;
  int64_t problem_below_bytes = int64_t{1} << 30;
};

// The CPU features the kernels are built for (contract/cpu_features.h).
Finding CheckCpu();
// A data root: a directory this process can list.
Finding CheckDataRoot(const std::string& root);
// A directory jobs write to (a checkpoint root, the work dir): a file can be created, written,
// read back and removed, and free space is above `limits`.
Finding CheckWritableDir(const std::string& what, const std::string& dir,
                         const SpaceLimits& limits = {});

// All of the above for the roots and work dir a launch names.
std::vector<Finding> CheckHost(const std::vector<std::string>& data_roots,
                               const std::vector<std::string>& checkpoint_roots,
                               const std::string& work_dir, const SpaceLimits& limits = {});

}  // namespace substrax::doctor

#endif  // SUBSTRAX_WORKER_DOCTOR_CHECKS_H_
