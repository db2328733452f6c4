// The GPU device layer in a build without --config=cuda: every factory fails with UNIMPLEMENTED,
// so no object of these classes can exist and the other members are never reached. They are
// defined so that callers link in both builds.
#include <memory>
#include <utility>

#include "worker/gpu/cuda_device.h"

namespace substrax {
namespace {
absl::Status NotBuilt() { return CudaNotBuilt(); }
}  // namespace

bool CudaBuilt() { return false; }
absl::StatusOr<int> CudaDeviceCount() { return NotBuilt(); }

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(const CudaDevice&, int64_t) {
  return NotBuilt();
}
DeviceBuffer::~DeviceBuffer() = default;
DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  return *this;
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int) { return NotBuilt(); }
CudaDevice::~CudaDevice() = default;
absl::Status CudaDevice::MakeCurrent() const { return NotBuilt(); }
absl::Status CudaDevice::Synchronize() const { return NotBuilt(); }
absl::StatusOr<DeviceTensor> CudaDevice::Upload(const Tensor&) const { return NotBuilt(); }
absl::StatusOr<Tensor> CudaDevice::Download(const DeviceTensor&) const { return NotBuilt(); }
absl::StatusOr<DeviceTree> CudaDevice::Upload(const TensorTree&) const { return NotBuilt(); }
absl::StatusOr<TensorTree> CudaDevice::Download(const DeviceTree&) const { return NotBuilt(); }

}  // namespace substrax
