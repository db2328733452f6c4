// Device discovery, shared by the agent (which devices this host offers the coordinator) and
// `substrax-job train` (which devices a whole job runs on in one process):
//
//   "cuda"    one device per visible CUDA GPU (CUDA_VISIBLE_DEVICES applies), in CUDA's order:
//             kind CUDA, name ("NVIDIA H200"), memory_bytes, pci_bus_id, local_index.
//   "cpu:N"   N CPU devices (1 <= N <= 256), named "cpu".
//
// Every device gets `host`; ids are the coordinator's to assign. Thread-safe.
#ifndef SUBSTRAX_CONTRACT_DEVICES_H_
#define SUBSTRAX_CONTRACT_DEVICES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "substrax/v1/topology.pb.h"

namespace substrax {

// Errors: INVALID_ARGUMENT (spec is neither "cuda" nor "cpu:N" with N in 1..256; the message
// lists the accepted forms); FAILED_PRECONDITION for "cuda" when no GPU can be used (driver
// missing or too old, no device), with CUDA's error text; UNIMPLEMENTED for "cuda" in a binary
// built without --config=cuda.
absl::StatusOr<std::vector<v1::Device>> DiscoverDevices(const std::string& spec,
                                                        const std::string& host);

namespace devices_internal {
// The "cuda" case: devices_cuda.cc under --config=cuda, devices_no_cuda.cc otherwise.
absl::StatusOr<std::vector<v1::Device>> DiscoverCudaDevices(const std::string& host);
}  // namespace devices_internal

}  // namespace substrax

#endif  // SUBSTRAX_CONTRACT_DEVICES_H_
