// The "cuda" device spec (bazel build --config=cuda).
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "contract/devices.h"

namespace substrax {
namespace devices_internal {
namespace {

std::string CudaText(cudaError_t e) {
  return absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e));
}

}  // namespace

absl::StatusOr<std::vector<v1::Device>> DiscoverCudaDevices(const std::string& host) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices cuda: no usable CUDA GPU on ", host, " (", CudaText(e),
        "); check that the NVIDIA driver is installed and loaded (nvidia-smi) and recent enough "
        "for this CUDA runtime, or offer CPU devices with --devices cpu:N"));
  }
  if (count == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--devices cuda: no CUDA GPU on ", host,
        " (cudaGetDeviceCount returned 0; check nvidia-smi and CUDA_VISIBLE_DEVICES)"));
  }
  std::vector<v1::Device> devices;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (const cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--devices cuda: cannot read the properties of GPU ", i, " on ", host, " (",
          CudaText(e), "); check nvidia-smi and dmesg"));
    }
    char bus_id[32] = {};
    if (const cudaError_t e = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), i); e != cudaSuccess) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--devices cuda: cannot read the PCI bus id of GPU ", i, " on ", host, " (",
          CudaText(e), ")"));
    }
    v1::Device d;
    d.set_host(host);
    d.set_local_index(i);
    d.set_kind(v1::DEVICE_KIND_CUDA);
    d.set_name(prop.name);
    d.set_memory_bytes(static_cast<int64_t>(prop.totalGlobalMem));
    d.set_pci_bus_id(bus_id);
    devices.push_back(std::move(d));
  }
  return devices;
}

}  // namespace devices_internal
}  // namespace substrax
