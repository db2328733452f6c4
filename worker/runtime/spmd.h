// The guide's functions with substrax's built-in models (worker/compute/model.h). The guide's
// functions themselves are public (part of the SDK, docs/sdk.md): substrax/spmd.h.
#ifndef SUBSTRAX_WORKER_RUNTIME_SPMD_H_
#define SUBSTRAX_WORKER_RUNTIME_SPMD_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "core/mesh.h"
#include "core/metric_reductions.h"
#include "core/sharding.h"
#include "substrax/spmd.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/compute/model.h"
#include "worker/compute/optimizer.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// The partition specs of a model's parameters, by name.
std::map<std::string, PartitionSpec> PartitionSpecs(const Model& model);

// The guide's spmd_train_step: loss and gradients on the device's batch (tensor-parallel
// collectives inside the model when it has a model axis), gradients reduced as the shardings
// imply (ReduceGradientsBySharding), then one optimizer update. Replicas of a parameter end
// identical on every device.
absl::StatusOr<StepResult> SpmdTrainStep(DeviceContext& ctx, const Model& model,
                                         Optimizer& optimizer, TensorTree* params,
                                         const Batch& batch,
                                         const GradientReductionOptions& options = {});

// The pmap path: the step calls the collectives itself, as the guide's explicit example does
// with axis_name: ReduceMeanCollective(grads, "data") for every gradient, then
// ReduceMeanCollective(replicated_grads, "model") on a mesh with a model axis.
absl::StatusOr<StepResult> CollectiveTrainStep(DeviceContext& ctx, const Model& model,
                                               Optimizer& optimizer, TensorTree* params,
                                               const Batch& batch);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_SPMD_H_
