#include "worker/gpu/cuda_device.h"

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker/gpu/cuda_status.h"

namespace substrax {

bool CudaBuilt() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // No driver or no device is a state of the machine, not a bug: FAILED_PRECONDITION always.
    return absl::FailedPreconditionError(absl::StrCat(
        "cudaGetDeviceCount: ", cudaGetErrorName(error), ": ", cudaGetErrorString(error),
        "; check the GPU and its driver (nvidia-smi)"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(
        "cudaGetDeviceCount: 0 CUDA devices; check the GPU and its driver (nvidia-smi)");
  }
  return count;
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(const CudaDevice& device, int64_t count) {
  DeviceBuffer buffer;
  buffer.device_ = device.ordinal();
  buffer.size_ = count;
  if (count == 0) return buffer;
  SUBSTRAX_RETURN_IF_ERROR(device.MakeCurrent());
  void* data = nullptr;
  SUBSTRAX_RETURN_IF_ERROR(
      CudaStatus(cudaMalloc(&data, static_cast<size_t>(count) * sizeof(float)),
                 absl::StrCat("cudaMalloc of ", count, " floats"), device.name()));
  buffer.data_ = static_cast<float*>(data);
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr && owned_) {
    // cudaFree needs the owning device current; errors here (a dead context) cannot be reported.
    int current = 0;
    cudaGetDevice(&current);
    if (current != device_) cudaSetDevice(device_);
    cudaFree(data_);
    if (current != device_) cudaSetDevice(current);
  }
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_),
      owned_(other.owned_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    DeviceBuffer old(std::move(*this));
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
    owned_ = other.owned_;
  }
  return *this;
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Create(int ordinal) {
  SUBSTRAX_ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "CUDA device ", ordinal, " does not exist: this machine has ", count,
        " (check CUDA_VISIBLE_DEVICES and nvidia-smi)"));
  }
  std::unique_ptr<CudaDevice> device(new CudaDevice());
  device->ordinal_ = ordinal;
  device->name_ = absl::StrCat("cuda:", ordinal);
  cudaDeviceProp prop;
  SUBSTRAX_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties", device->name_));
  device->name_ = absl::StrCat("cuda:", ordinal, " (", prop.name, ")");
  SUBSTRAX_RETURN_IF_ERROR(device->MakeCurrent());
  cudaStream_t stream = nullptr;
  SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                      "cudaStreamCreate", device->name_));
  device->stream_ = stream;
  cublasHandle_t handle = nullptr;
  SUBSTRAX_RETURN_IF_ERROR(CublasStatus(cublasCreate(&handle), "cublasCreate", device->name_));
  device->cublas_ = handle;
  SUBSTRAX_RETURN_IF_ERROR(
      CublasStatus(cublasSetStream(handle, stream), "cublasSetStream", device->name_));
  // A workspace set before any capture: without one, cuBLAS allocates its own, which a stream
  // capture cannot record (capture fails, or it runs other algorithms than eager).
  SUBSTRAX_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&device->cublas_workspace_, kCublasWorkspaceBytes),
                                      "cudaMalloc of the cuBLAS workspace", device->name_));
  SUBSTRAX_RETURN_IF_ERROR(CublasStatus(
      cublasSetWorkspace(handle, device->cublas_workspace_, kCublasWorkspaceBytes),
      "cublasSetWorkspace", device->name_));
  // Plain float32 (no TF32 tensor cores), so results agree with the CPU model within 1e-5.
  SUBSTRAX_RETURN_IF_ERROR(CublasStatus(cublasSetMathMode(handle, CUBLAS_DEFAULT_MATH),
                                        "cublasSetMathMode", device->name_));
  return device;
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(ordinal_);
  if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (cublas_workspace_ != nullptr) cudaFree(cublas_workspace_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaDevice::MakeCurrent() const {
  return CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice", name_);
}

absl::Status CudaDevice::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", name_);
}

absl::StatusOr<DeviceTensor> CudaDevice::Upload(const Tensor& tensor) const {
  DeviceTensor out;
  out.shape = tensor.shape();
  SUBSTRAX_ASSIGN_OR_RETURN(out.buffer, DeviceBuffer::Allocate(*this, tensor.size()));
  if (tensor.size() > 0) {
    // Pageable memory: the copy is staged by the driver and the call returns once the source
    // may be reused, so `tensor` need not outlive it.
    SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(out.data(), tensor.data(), tensor.size() * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync host to device", name_));
  }
  return out;
}

absl::StatusOr<Tensor> CudaDevice::Download(const DeviceTensor& tensor) const {
  Tensor out(tensor.shape);
  if (out.size() != tensor.size()) {
    return absl::InvalidArgumentError(absl::StrCat("device tensor of shape ", out.ShapeString(),
                                                   " holds ", tensor.size(), " values"));
  }
  if (out.size() > 0) {
    SUBSTRAX_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(out.data(), tensor.data(), out.size() * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync device to host", name_));
  }
  SUBSTRAX_RETURN_IF_ERROR(Synchronize());
  return out;
}

absl::StatusOr<DeviceTree> CudaDevice::Upload(const TensorTree& tree) const {
  DeviceTree out;
  for (const auto& [name, tensor] : tree) {
    SUBSTRAX_ASSIGN_OR_RETURN(out[name], Upload(tensor));
  }
  return out;
}

absl::StatusOr<TensorTree> CudaDevice::Download(const DeviceTree& tree) const {
  TensorTree out;
  for (const auto& [name, tensor] : tree) {
    SUBSTRAX_ASSIGN_OR_RETURN(out[name], Download(tensor));
  }
  return out;
}

}  // namespace substrax
