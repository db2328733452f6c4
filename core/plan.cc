#include "core/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/job_spec.h"
#include "core/optimizers.h"
#include "core/status.h"

namespace substrax {
namespace {

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool SpecUsesAxis(const PartitionSpec& spec, const std::string& axis) {
  for (const std::vector<std::string>& dim : spec.dims()) {
    if (std::find(dim.begin(), dim.end(), axis) != dim.end()) return true;
  }
  return false;
}

// Optimizer state per parameter value, in values: the table's slots (momentum keeps a velocity,
// adam a first and a second moment).
int64_t OptimizerSlots(const std::string& type) {
  const OptimizerInfo* info = FindOptimizer(type);
  return info == nullptr ? 0 : static_cast<int64_t>(info->slots.size());
}

}  // namespace

absl::StatusOr<JobPlan> PlanJob(const v1::JobSpec& spec, absl::Span<const Device> devices,
                                int64_t num_features) {
  SUBSTRAX_ASSIGN_OR_RETURN(Mesh mesh, CreateMeshForJob(spec.mesh(), devices));
  JobPlan plan(std::move(mesh));
  const Mesh& m = plan.mesh;
  plan.mesh_info = DeviceMeshManager::GetMeshInfo(m);
  plan.num_features = num_features;
  plan.per_device_batch = PerDeviceBatchSize(spec);
  const int64_t model_axis = m.HasAxis(kModelAxis) ? *m.AxisSize(kModelAxis) : 1;
  // A program or command defines its model itself: the plan is its mesh (and batch) only.
  if (RunsUserCode(spec)) return plan;

  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<ParamSpec> params,
                            ModelParams(spec.model(), num_features, model_axis));
  plan.model_param_bytes = ParamCount(params) * kBytesPerValue;
  for (ParamSpec& param : params) {
    SUBSTRAX_ASSIGN_OR_RETURN(NamedSharding sharding, NamedSharding::Create(m, param.partition));
    absl::StatusOr<ShardLayout> layout = sharding.Layout(param.shape);
    if (!layout.ok()) return Annotate(layout.status(), param.name);
    ParamPlan p;
    p.shard_shape = layout->shards.front().shape();
    p.shard_bytes = NumElements(p.shard_shape) * kBytesPerValue;
    p.replicas = layout->num_replicas;
    // Gradients are reduced over exactly the axes the parameter is not split on: along those the
    // devices hold copies that saw different examples (data) or must stay equal (model). An axis
    // of size 1 has nothing to reduce.
    for (int a = 0; a < m.ndim(); ++a) {
      const std::string& axis = m.axis_names()[a];
      if (m.shape()[a] > 1 && !SpecUsesAxis(param.partition, axis)) {
        p.gradient_axes.push_back(axis);
      }
    }
    p.param = std::move(param);
    p.layout = *std::move(layout);
    plan.memory.parameters += p.shard_bytes;
    plan.params.push_back(std::move(p));
  }
  plan.memory.gradients = plan.memory.parameters;
  plan.memory.optimizer_state = plan.memory.parameters * OptimizerSlots(spec.optimizer().type());

  // Layers: one kernel and one bias each, in order (model_catalog).
  const std::vector<LayerSplit> splits = LayerSplits(spec.model(), model_axis);
  const int64_t batch_bytes = plan.per_device_batch * kBytesPerValue;
  Collective forward{kModelAxis, model_axis, "activations, forward (sum)"};
  Collective backward{kModelAxis, model_axis, "activation gradients, backward (sum)"};
  for (size_t layer = 0; layer < splits.size(); ++layer) {
    const std::vector<int64_t>& kernel = plan.params[2 * layer].param.shape;
    const int64_t in = kernel[0], out = kernel[1];
    plan.local_layer_widths.push_back(splits[layer] == LayerSplit::kColumn ? out / model_axis
                                                                           : out);
    if (splits[layer] == LayerSplit::kRow) {
      // The row-parallel layer's partial outputs are summed over "model" (Megatron's g).
      ++forward.count;
      forward.bytes += batch_bytes * out;
    }
    if (splits[layer] == LayerSplit::kColumn && layer > 0) {
      // The gradient of the column-parallel layer's input is summed over "model" (Megatron's f);
      // the first pair's input is the data, which needs no gradient.
      ++backward.count;
      backward.bytes += batch_bytes * in;
    }
  }
  int64_t widths = 0;
  for (int64_t w : plan.local_layer_widths) widths += w;
  plan.memory.activations = 2 * batch_bytes * widths;

  for (int a = 0; a < m.ndim(); ++a) {
    Collective gradients{m.axis_names()[a], m.shape()[a], "gradients (mean)"};
    for (const ParamPlan& p : plan.params) {
      if (std::find(p.gradient_axes.begin(), p.gradient_axes.end(), gradients.axis) ==
          p.gradient_axes.end()) {
        continue;
      }
      ++gradients.count;
      gradients.bytes += p.shard_bytes;
    }
    if (gradients.count > 0) plan.collectives.push_back(std::move(gradients));
  }
  for (Collective* c : {&forward, &backward}) {
    if (c->count > 0) plan.collectives.push_back(std::move(*c));
  }
  return plan;
}

}  // namespace substrax
