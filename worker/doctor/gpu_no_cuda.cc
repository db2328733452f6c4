// The GPU check in a build without CUDA.
#include <unistd.h>

#include "worker/doctor/gpu.h"

namespace substrax::doctor {

std::optional<Finding> CheckGpu() {
  if (access("/dev/nvidia0", F_OK) != 0) return std::nullopt;
  return Finding{"gpu", Verdict::kWarning,
                 "this host has NVIDIA devices, but this substrax-job is built without CUDA",
                 "install the CUDA build of substrax on GPU hosts (docs/gpu.md)"};
}

}  // namespace substrax::doctor
