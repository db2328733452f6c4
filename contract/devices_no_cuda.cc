// The "cuda" device spec in a binary built without CUDA.
#include "contract/devices.h"

namespace substrax {
namespace devices_internal {

absl::StatusOr<std::vector<v1::Device>> DiscoverCudaDevices(const std::string&) {
  return absl::UnimplementedError(
      "--devices cuda: this binary was built without CUDA; rebuild with bazel build "
      "--config=cuda");
}

}  // namespace devices_internal
}  // namespace substrax
