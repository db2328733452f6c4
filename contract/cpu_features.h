// Whether this host can run the CPU kernels (tools/cpu_kernels.bzl): they are built for
// x86-64-v3 (AVX2, FMA, F16C). Built without those flags itself, so that it can run, and say
// what is missing, on any x86-64 CPU.
//
// Every entry into the CPU kernels calls CheckCpuKernels() first (the CPU backend, the SDK's
// Init, the worker daemon when it offers CPU devices): a host without the instructions gets a
// clear error at start, never a crash on an illegal instruction mid-step.
#ifndef SUBSTRAX_CONTRACT_CPU_FEATURES_H_
#define SUBSTRAX_CONTRACT_CPU_FEATURES_H_

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace substrax {

// "x86-64-v3 (avx2, fma, f16c)": what the kernels need.
std::string CpuKernelsTarget();

// OK when this CPU has every instruction set the kernels use; otherwise FAILED_PRECONDITION
// naming the missing ones and the CPU's model name.
absl::Status CheckCpuKernels();

// One instruction set the kernels use, and whether a CPU has it.
struct CpuFeature {
  std::string name;
  bool present = false;
};
// CheckCpuKernels for a CPU with `features` and `model_name` (tests give other CPUs).
absl::Status CheckCpuKernels(const std::vector<CpuFeature>& features,
                             const std::string& model_name);

}  // namespace substrax

#endif  // SUBSTRAX_CONTRACT_CPU_FEATURES_H_
