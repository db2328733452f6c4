// CudaPrefetcher in a build without --config=cuda: Create fails with UNIMPLEMENTED, so no object
// exists; the other members are defined so that callers link in both builds.
#include <memory>
#include <optional>
#include <utility>

#include "worker/data/cuda_prefetch.h"

namespace substrax {
namespace {
absl::Status NotBuilt() { return CudaNotBuilt(); }
}  // namespace

struct CudaPrefetcher::Impl {};
CudaPrefetcher::CudaPrefetcher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudaPrefetcher::~CudaPrefetcher() = default;
absl::StatusOr<std::unique_ptr<CudaPrefetcher>> CudaPrefetcher::Create(const CudaDevice*,
                                                                       Producer<Batch>, int) {
  return NotBuilt();
}
absl::StatusOr<std::optional<DeviceBatchView>> CudaPrefetcher::Next() { return NotBuilt(); }

}  // namespace substrax
