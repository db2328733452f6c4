// A dry run of a job: the mesh it would get on a set of devices, how every parameter is laid out
// over it, what each device holds in memory, and which collectives one training step performs
// with how many bytes per mesh axis. `substraxctl plan` prints this; it needs no running job and
// no compute code (docs/meshes.md explains the model behind it).
//
// The mesh is built with CreateMeshForJob, exactly as the coordinator schedules a job, so a job
// that cannot run on the devices fails here with the coordinator's message.
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_CORE_PLAN_H_
#define SUBSTRAX_CORE_PLAN_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/mesh.h"
#include "core/model_catalog.h"
#include "core/sharding.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

// Bytes of one parameter, gradient or activation value: substrax trains in float32.
inline constexpr int64_t kBytesPerValue = 4;

// One parameter laid out over the mesh.
struct ParamPlan {
  // Name, global shape and partition spec (model_catalog).
  ParamSpec param;
  // The block every device holds.
  ShardLayout layout;
  // Shape and float32 bytes of one device's block (every device's block has the same shape).
  std::vector<int64_t> shard_shape;
  int64_t shard_bytes = 0;
  // Copies of each element across the mesh (product of the axes the spec does not use).
  int64_t replicas = 1;
  // Mesh axes of size > 1 the spec does not use: the gradient is all-reduced (mean) over each.
  std::vector<std::string> gradient_axes;
};

// What one device holds during a step, in bytes. Every device holds the same amounts: shards are
// equal blocks and the batch splits evenly over the data axis.
struct DeviceMemory {
  // The device's parameter blocks.
  int64_t parameters = 0;
  // One gradient per parameter block.
  int64_t gradients = 0;
  // sgd: none; momentum: one velocity per parameter; adam: two moments per parameter.
  int64_t optimizer_state = 0;
  // Forward activations, B x sum over layers of the layer's output width on this device x 4
  // bytes (B the per-device batch; the width is out/m for a column-parallel layer on a model
  // axis of size m, else out), plus as much again for their gradients in the backward pass. The
  // input batch and the framework's temporaries are not counted.
  int64_t activations = 0;

  int64_t total() const { return parameters + gradients + optimizer_state + activations; }
};

// The all-reduces of one training step over one mesh axis for one purpose.
struct Collective {
  // The mesh axis ("data", "model"); each all-reduce runs within every group along it.
  std::string axis;
  // Devices in each group (the axis size).
  int64_t group_size = 1;
  // "gradients (mean)", "activations, forward (sum)", "activation gradients, backward (sum)".
  std::string what;
  // All-reduces per step (one per tensor).
  int64_t count = 0;
  // Sum of their payloads: the bytes each device contributes per step. A ring all-reduce sends
  // 2 (n - 1) / n times this from each device, n = group_size.
  int64_t bytes = 0;
};

struct JobPlan {
  explicit JobPlan(Mesh m) : mesh(std::move(m)) {}

  Mesh mesh;
  // DeviceMeshManager::GetMeshInfo(mesh): the grid with hosts.
  MeshInfo mesh_info;
  // Inputs per example (the data's width) and examples per device per step.
  int64_t num_features = 0;
  int64_t per_device_batch = 0;
  // In layer order.
  std::vector<ParamPlan> params;
  // Output width of each dense layer on one device: out / m for a column-parallel layer on a
  // model axis of size m, else out (what DeviceMemory::activations sums).
  std::vector<int64_t> local_layer_widths;
  // ParamCount x 4: the model's parameters once, however they are sharded.
  int64_t model_param_bytes = 0;
  // Per device (the same on every device).
  DeviceMemory memory;
  // Gradient all-reduces per axis, then the tensor-parallel activation all-reduces.
  std::vector<Collective> collectives;
};

// Plans `spec` (after ApplyJobSpecDefaults; normally also ValidateJobSpec) on `devices` for
// inputs of `num_features` values (InputFeatures). A program or command job (RunsUserCode)
// defines its model itself: its plan is the mesh and the per-device batch only (no parameters, memory or
// collectives), and `num_features` is not used.
// Errors: INVALID_ARGUMENT, naming the field: the devices cannot hold the mesh (CreateMeshForJob's
// message, starting "spec.mesh: "), a hidden width that does not divide over the model axis
// ("spec.model.hidden_sizes[i]: ..."), or another model error of ModelParams.
absl::StatusOr<JobPlan> PlanJob(const v1::JobSpec& spec, absl::Span<const Device> devices,
                                int64_t num_features);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_PLAN_H_
