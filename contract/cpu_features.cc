#include "contract/cpu_features.h"

#include <fstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"

namespace substrax {
namespace {

// __builtin_cpu_supports needs a literal; the list is the flags of tools/cpu_kernels.bzl.
std::vector<CpuFeature> Features() {
  __builtin_cpu_init();
  return {{"avx2", __builtin_cpu_supports("avx2") != 0},
          {"fma", __builtin_cpu_supports("fma") != 0},
          {"f16c", __builtin_cpu_supports("f16c") != 0}};
}

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (!absl::StartsWith(line, "model name")) continue;
    const size_t colon = line.find(':');
    if (colon != std::string::npos) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
  }
  return "unknown CPU";
}

}  // namespace

std::string CpuKernelsTarget() {
  std::vector<std::string> names;
  for (const CpuFeature& f : Features()) names.push_back(f.name);
  return absl::StrCat("x86-64-v3 (", absl::StrJoin(names, ", "), ")");
}

absl::Status CheckCpuKernels() { return CheckCpuKernels(Features(), CpuModelName()); }

absl::Status CheckCpuKernels(const std::vector<CpuFeature>& features,
                             const std::string& model_name) {
  std::vector<std::string> missing;
  for (const CpuFeature& f : features) {
    if (!f.present) missing.push_back(f.name);
  }
  if (missing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "this host's CPU (", model_name, ") lacks ", absl::StrJoin(missing, ", "),
      ": substrax's CPU kernels are built for ", CpuKernelsTarget(),
      "; run CPU devices on a newer host (any x86-64 CPU since about 2015 has them)"));
}

}  // namespace substrax
