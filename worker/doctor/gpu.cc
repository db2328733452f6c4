#include "worker/doctor/gpu.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace substrax::doctor {

std::string CudaVersionText(int version) {
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

std::string NcclVersionText(int version) {
  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch.
  return absl::StrCat(version / 10000, ".", (version % 10000) / 100, ".", version % 100);
}

Finding JudgeGpu(const GpuFacts& facts) {
  if (!facts.error.empty()) {
    return Finding{"gpu", Verdict::kProblem, facts.error,
                   "check that the NVIDIA driver is loaded (nvidia-smi) and that the agent's "
                   "CUDA_VISIBLE_DEVICES names GPUs of this host"};
  }
  std::string seen = absl::StrCat(facts.names.size(), " x ",
                                  facts.names.empty() ? "none" : facts.names.front(),
                                  "; driver CUDA ", CudaVersionText(facts.driver_cuda_version),
                                  ", runtime ", CudaVersionText(facts.runtime_cuda_version));
  if (facts.nccl_version > 0) absl::StrAppend(&seen, ", NCCL ", NcclVersionText(facts.nccl_version));
  if (facts.driver_cuda_version < facts.runtime_cuda_version) {
    return Finding{"gpu", Verdict::kProblem, seen,
                   absl::StrCat("install an NVIDIA driver that supports CUDA ",
                                CudaVersionText(facts.runtime_cuda_version),
                                facts.runtime_cuda_version >= 13000 ? " (the 580 series or newer)"
                                                                    : "",
                                ", or use a substrax build for the driver's CUDA")};
  }
  return Finding{"gpu", Verdict::kOk, seen, ""};
}

}  // namespace substrax::doctor
