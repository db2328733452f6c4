// DeviceMeshManager: the public declarations are in substrax/device_mesh_manager.h (part of the SDK, docs/sdk.md); this
// header adds the substrax-internal ones that name the wire form (substrax.v1 protos).
#ifndef SUBSTRAX_CORE_DEVICE_MESH_MANAGER_H_
#define SUBSTRAX_CORE_DEVICE_MESH_MANAGER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/mesh.h"
#include "substrax/device_mesh_manager.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

// The devices a job with `backend` may use: cpu → CPU devices; cuda → CUDA devices; auto (or
// unspecified) → the CUDA devices when there are any, else the CPU devices.
std::vector<Device> DevicesForBackend(v1::Backend backend, absl::Span<const Device> devices);

// The mesh a job spec asks for (spec.mesh, after ApplyJobSpecDefaults), built from `devices`
// with the matching DeviceMeshManager method. A data-parallel mesh takes the first
// data_parallel_size devices in canonical order (grouped by host). Errors: INVALID_ARGUMENT when
// the devices cannot hold it, with the reason (the message starts with "spec.mesh: ").
absl::StatusOr<Mesh> CreateMeshForJob(const v1::MeshSpec& spec, absl::Span<const Device> devices);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_DEVICE_MESH_MANAGER_H_
