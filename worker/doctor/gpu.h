// The GPU check of `substraxctl doctor` (docs/diagnosis.md): the GPUs this process sees, the
// driver's CUDA version against the runtime's substrax is built with, and NCCL's version.
#ifndef SUBSTRAX_WORKER_DOCTOR_GPU_H_
#define SUBSTRAX_WORKER_DOCTOR_GPU_H_

#include <optional>
#include <string>
#include <vector>

#include "worker/doctor/checks.h"

namespace substrax::doctor {

// What a CUDA build finds (versions as CUDA and NCCL encode them: 13000 is 13.0, 22703 is
// NCCL 2.27.3).
struct GpuFacts {
  // Empty: the runtime found none (`error` says why, when it failed).
  std::vector<std::string> names;
  std::string error;
  int driver_cuda_version = 0;
  int runtime_cuda_version = 0;
  int nccl_version = 0;
};

// The finding for `facts`: a driver older than the runtime is a problem (CUDA calls fail), as is
// a runtime error when there are GPUs.
Finding JudgeGpu(const GpuFacts& facts);

// The check on this host: nullopt when there is nothing to say (no GPU, and a build without
// CUDA on a host without NVIDIA devices). A build without CUDA on a host with /dev/nvidia0 says
// so (a warning: the GPUs are not used).
std::optional<Finding> CheckGpu();

// "13.0" for 13000; NCCL's "2.27.3" for 22703.
std::string CudaVersionText(int version);
std::string NcclVersionText(int version);

}  // namespace substrax::doctor

#endif  // SUBSTRAX_WORKER_DOCTOR_GPU_H_
