// One GPU as the backend sees it: the device, its compute stream, a cuBLAS handle bound to that
// stream, float buffers in its memory, and metric accumulators that stay on it between reports.
//
// This header needs no CUDA headers, so that code which is not CUDA-specific (the trainer, tests)
// includes it in every build. Without --config=cuda the factories here return UNIMPLEMENTED
// ("built without --config=cuda; rebuild with bazel build --config=cuda") and no object of these
// classes can exist; CudaBuilt() says which build this is.
//
// Errors of the CUDA runtime and cuBLAS become absl::Status in one place (cuda_status.cc):
// RESOURCE_EXHAUSTED for out of memory, FAILED_PRECONDITION when there is no usable device or
// driver, INTERNAL otherwise; each message names the call, the device and the CUDA error string,
// and says to check the GPU (nvidia-smi).
//
// Thread-safety: a CudaDevice, its buffers and metrics belong to one device thread (work is queued
// on its stream in call order). Different CudaDevice objects may be used from different threads.
#ifndef SUBSTRAX_WORKER_GPU_CUDA_DEVICE_H_
#define SUBSTRAX_WORKER_GPU_CUDA_DEVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/tensor/tensor.h"

// cudaStream_t is a CUstream_st*; declared here so this header stays free of CUDA headers.
struct CUstream_st;

namespace substrax {

// True when this binary was built with --config=cuda.
bool CudaBuilt();
// What every CUDA factory returns in the default build.
inline absl::Status CudaNotBuilt() {
  return absl::UnimplementedError(
      "the CUDA backend was built without --config=cuda; rebuild with bazel build --config=cuda");
}

// The number of usable CUDA devices.
// Errors: UNIMPLEMENTED without --config=cuda; FAILED_PRECONDITION when the driver or runtime
// finds none (the message carries CUDA's reason, e.g. "no CUDA-capable device is detected").
absl::StatusOr<int> CudaDeviceCount();

class CudaDevice;

// `count` floats of device memory, freed on destruction. Move-only.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // Errors: RESOURCE_EXHAUSTED when the device is out of memory; INTERNAL otherwise.
  static absl::StatusOr<DeviceBuffer> Allocate(const CudaDevice& device, int64_t count);
  // A view of `count` floats at `data`, memory that someone else owns and frees (a slice of a
  // flat buffer); it must outlive the view.
  static DeviceBuffer View(float* data, int64_t count) {
    DeviceBuffer view;
    view.data_ = data;
    view.size_ = count;
    view.owned_ = false;
    return view;
  }
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  float* data() const { return data_; }
  int64_t size() const { return size_; }

 private:
  float* data_ = nullptr;
  int64_t size_ = 0;
  int device_ = 0;
  bool owned_ = true;
};

// A row-major float32 array in device memory: worker/tensor's Tensor on a GPU.
struct DeviceTensor {
  std::vector<int64_t> shape;
  DeviceBuffer buffer;
  float* data() const { return buffer.data(); }
  int64_t size() const { return buffer.size(); }
};

// Named device tensors in the same sorted order as TensorTree.
using DeviceTree = std::map<std::string, DeviceTensor>;

// A batch in device memory as the model reads it (a view: the memory belongs to whoever made it,
// e.g. CudaPrefetcher or an uploaded Batch).
struct DeviceBatchView {
  const float* inputs = nullptr;   // [size, num_features]
  const float* targets = nullptr;  // classification: [size] class ids; regression [size, outputs]
  int64_t size = 0;
  int64_t num_features = 0;
  // Values per example in targets: 1 for class ids, the output width for regression.
  int64_t target_width = 0;
};

// The cuBLAS workspace of each device: 32 MiB, what NVIDIA documents for Hopper (and more than
// the 4 MiB older GPUs need).
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

class CudaDevice {
 public:
  // Device `ordinal`: sets it current on the calling thread, creates a non-blocking compute stream
  // and a cuBLAS handle on it (default float32 math: no TF32, like the CPU model) with a
  // workspace of its own (kCublasWorkspaceBytes), so that cuBLAS allocates nothing while a CUDA
  // graph is captured and picks the same algorithms captured as eager.
  // Errors: UNIMPLEMENTED without --config=cuda; FAILED_PRECONDITION when there is no device
  // `ordinal`; INTERNAL for CUDA or cuBLAS failures.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal);
  ~CudaDevice();
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  int ordinal() const { return ordinal_; }
  CUstream_st* stream() const { return stream_; }
  // The cuBLAS handle (a cublasHandle_t), bound to stream().
  void* cublas() const { return cublas_; }
  // "cuda:0 (NVIDIA H200)": for error messages.
  const std::string& name() const { return name_; }

  // Makes this device current on the calling thread (CUDA's current device is per thread).
  absl::Status MakeCurrent() const;
  // Waits for everything queued on stream(). Errors: INTERNAL (an earlier kernel failed).
  absl::Status Synchronize() const;

  // Copies to and from the device on stream(); Download waits for the copy.
  absl::StatusOr<DeviceTensor> Upload(const Tensor& tensor) const;
  absl::StatusOr<Tensor> Download(const DeviceTensor& tensor) const;
  absl::StatusOr<DeviceTree> Upload(const TensorTree& tree) const;
  absl::StatusOr<TensorTree> Download(const DeviceTree& tree) const;

 private:
  CudaDevice() = default;
  int ordinal_ = 0;
  CUstream_st* stream_ = nullptr;
  void* cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  std::string name_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_GPU_CUDA_DEVICE_H_
