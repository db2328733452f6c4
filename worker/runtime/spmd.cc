#include "worker/runtime/spmd.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "worker/runtime/gradient_buckets.h"
#include "worker/tensor/aligned_floats.h"

namespace substrax {
namespace {

// A 52-bit FNV-1a hash of the metric names, exact in a double.
double NamesFingerprint(const Metrics& metrics) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, value] : metrics) {
    for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    h = (h ^ 0xff) * 1099511628211ull;
  }
  return static_cast<double>(h >> 12);
}

// Fails unless every device of `comm` passes the same metric names: a device that reports
// different metrics would otherwise be reduced against the wrong values.
absl::Status CheckSameNames(Communicator& comm, const Metrics& metrics, const char* fn) {
  const double mine = NamesFingerprint(metrics);
  std::vector<double> both = {mine, -mine};
  SUBSTRAX_RETURN_IF_ERROR(Annotate(comm.AllReduce(absl::MakeSpan(both), ReduceOp::kMax), fn));
  if (both[0] != mine || both[1] != -mine) {
    return absl::FailedPreconditionError(absl::StrCat(
        fn, " on communicator '", comm.name(),
        "': devices passed different metric names; every device must report the same metrics"));
  }
  return absl::OkStatus();
}

std::vector<double> Values(const Metrics& metrics) {
  std::vector<double> values;
  for (const auto& [name, v] : metrics) values.push_back(v);
  return values;
}

absl::StatusOr<StackedMetrics> GatherMetrics(DeviceContext& ctx, const Metrics& metrics,
                                             const char* fn) {
  Communicator& world = ctx.comms->world();
  SUBSTRAX_RETURN_IF_ERROR(CheckSameNames(world, metrics, fn));
  const std::vector<double> mine = Values(metrics);
  std::vector<double> all(mine.size() * world.size());
  SUBSTRAX_RETURN_IF_ERROR(Annotate(world.AllGather(mine, absl::MakeSpan(all)), fn));
  StackedMetrics stacked;
  size_t k = 0;
  for (const auto& [name, v] : metrics) {
    std::vector<double>& column = stacked[name];
    for (int d = 0; d < world.size(); ++d) column.push_back(all[d * mine.size() + k]);
    ++k;
  }
  return stacked;
}

// Reduces every tensor of `tree` as `plan` says, in buckets, through one flat host buffer.
absl::Status ReduceTree(DeviceContext& ctx, TensorTree* tree, ReduceOp op,
                        const std::function<GradientPlan(const FlatLayout&)>& plan,
                        int64_t bucket_bytes, const char* fn) {
  const FlatLayout layout = LayoutOfTree(*tree);
  AlignedFloats flat(layout.total);
  SUBSTRAX_RETURN_IF_ERROR(PackTree(*tree, layout, flat.data()));
  SUBSTRAX_RETURN_IF_ERROR(ReduceFlat(*ctx.comms, plan(layout), flat.data(), op, bucket_bytes,
                                      ExecutionContext::CallingThread(), fn));
  return UnpackTree(flat.data(), layout, tree);
}

absl::Status ReduceTreeOverAxis(DeviceContext& ctx, TensorTree* tree, absl::string_view axis,
                                ReduceOp op, int64_t bucket_bytes, const char* fn) {
  SUBSTRAX_RETURN_IF_ERROR(ctx.comms->Axis(axis).status());
  return ReduceTree(
      ctx, tree, op,
      [&](const FlatLayout& layout) { return PlanOverAxis(std::string(axis), layout); },
      bucket_bytes, fn);
}

absl::StatusOr<Metrics> ReduceMetricsOverAxis(DeviceContext& ctx, const Metrics& metrics,
                                              absl::string_view axis, ReduceOp op,
                                              const char* fn) {
  SUBSTRAX_ASSIGN_OR_RETURN(Communicator * comm, ctx.comms->Axis(axis));
  SUBSTRAX_RETURN_IF_ERROR(CheckSameNames(*comm, metrics, fn));
  std::vector<double> values = Values(metrics);
  SUBSTRAX_RETURN_IF_ERROR(Annotate(comm->AllReduce(absl::MakeSpan(values), op), fn));
  Metrics out;
  size_t k = 0;
  for (const auto& [name, v] : metrics) out[name] = values[k++];
  return out;
}

double SecondsSince(absl::Time start) { return absl::ToDoubleSeconds(absl::Now() - start); }

// The block of `tensor` that `device_id` holds under `sharding`.
absl::StatusOr<Tensor> ShardForDevice(const Tensor& tensor, const NamedSharding& sharding,
                                      int device_id, const std::string& what) {
  absl::StatusOr<ShardLayout> layout = sharding.Layout(tensor.shape());
  if (!layout.ok()) return Annotate(layout.status(), what);
  SUBSTRAX_ASSIGN_OR_RETURN(ShardSlice shard, layout->ForDevice(device_id));
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const IndexRange& r : shard.index) ranges.emplace_back(r.start, r.limit);
  return tensor.Slice(ranges);
}

// Loss and gradients, `reduce` on the gradients (the collectives), one optimizer update.
template <typename Reduce>
absl::StatusOr<StepResult> TrainStep(const LossAndGradsFn& loss_and_grads, Optimizer& optimizer,
                                     TensorTree* params, const Batch& batch, Reduce&& reduce) {
  StepResult result;
  absl::Time start = absl::Now();
  SUBSTRAX_ASSIGN_OR_RETURN(LossAndGrads lg, loss_and_grads(*params, batch));
  result.compute_seconds = SecondsSince(start);
  start = absl::Now();
  SUBSTRAX_RETURN_IF_ERROR(reduce(&lg.grads));
  result.collective_seconds = SecondsSince(start);
  start = absl::Now();
  SUBSTRAX_RETURN_IF_ERROR(optimizer.Update(lg.grads, params));
  result.compute_seconds += SecondsSince(start);
  result.loss = lg.loss;
  result.accuracy = lg.accuracy;
  return result;
}

// A built-in model as a program's loss-and-gradients function.
LossAndGradsFn ModelLossAndGrads(const Model& model) {
  return [&model](const TensorTree& params, const Batch& batch) {
    return model.LossAndGradients(params, batch);
  };
}

}  // namespace

int64_t DeviceContext::data_index() const {
  absl::StatusOr<int> axis = mesh->AxisIndex(kDataAxis);
  return axis.ok() ? coords[*axis] : 0;
}

int64_t DeviceContext::data_size() const {
  absl::StatusOr<int64_t> size = mesh->AxisSize(kDataAxis);
  return size.ok() ? *size : 1;
}

absl::StatusOr<Metrics> ReduceMean(DeviceContext& ctx, const Metrics& metrics) {
  SUBSTRAX_ASSIGN_OR_RETURN(StackedMetrics stacked, GatherMetrics(ctx, metrics, "reduce_mean"));
  return substrax::ReduceMean(stacked);
}

absl::StatusOr<Metrics> ReduceSum(DeviceContext& ctx, const Metrics& metrics) {
  SUBSTRAX_ASSIGN_OR_RETURN(StackedMetrics stacked, GatherMetrics(ctx, metrics, "reduce_sum"));
  return substrax::ReduceSum(stacked);
}

absl::StatusOr<Metrics> ReduceCustom(DeviceContext& ctx, const Metrics& metrics,
                                     const std::map<std::string, std::string>& reduce_fn) {
  SUBSTRAX_ASSIGN_OR_RETURN(StackedMetrics stacked, GatherMetrics(ctx, metrics, "reduce_custom"));
  return substrax::ReduceCustom(stacked, reduce_fn);
}

absl::StatusOr<Metrics> ReduceCustom(DeviceContext& ctx, const Metrics& metrics,
                                     const std::map<std::string, ReduceOp>& reduce_fn) {
  SUBSTRAX_ASSIGN_OR_RETURN(StackedMetrics stacked, GatherMetrics(ctx, metrics, "reduce_custom"));
  return substrax::ReduceCustom(stacked, reduce_fn);
}

absl::StatusOr<std::vector<Metrics>> CollectFromDevices(DeviceContext& ctx,
                                                        const Metrics& metrics) {
  SUBSTRAX_ASSIGN_OR_RETURN(StackedMetrics stacked,
                            GatherMetrics(ctx, metrics, "collect_from_devices"));
  return substrax::CollectFromDevices(stacked);
}

absl::Status ReduceMeanCollective(DeviceContext& ctx, TensorTree* tree, absl::string_view axis) {
  return ReduceTreeOverAxis(ctx, tree, axis, ReduceOp::kMean,
                            GradientReductionOptions().bucket_bytes, "reduce_mean_collective");
}

absl::Status ReduceSumCollective(DeviceContext& ctx, TensorTree* tree, absl::string_view axis) {
  return ReduceTreeOverAxis(ctx, tree, axis, ReduceOp::kSum,
                            GradientReductionOptions().bucket_bytes, "reduce_sum_collective");
}

absl::StatusOr<Metrics> ReduceMeanCollective(DeviceContext& ctx, const Metrics& metrics,
                                             absl::string_view axis) {
  return ReduceMetricsOverAxis(ctx, metrics, axis, ReduceOp::kMean, "reduce_mean_collective");
}

absl::StatusOr<Metrics> ReduceSumCollective(DeviceContext& ctx, const Metrics& metrics,
                                            absl::string_view axis) {
  return ReduceMetricsOverAxis(ctx, metrics, axis, ReduceOp::kSum, "reduce_sum_collective");
}

absl::StatusOr<Tensor> AllGather(DeviceContext& ctx, const Tensor& tensor,
                                 absl::string_view axis) {
  SUBSTRAX_ASSIGN_OR_RETURN(Communicator * comm, ctx.comms->Axis(axis));
  std::vector<int64_t> shape = {comm->size()};
  shape.insert(shape.end(), tensor.shape().begin(), tensor.shape().end());
  Tensor out(shape);
  SUBSTRAX_RETURN_IF_ERROR(Annotate(comm->AllGather(tensor.span(), out.span()), "all_gather"));
  return out;
}

absl::Status ReduceGradientTree(DeviceContext& ctx, TensorTree* grads, ReduceType type,
                                const GradientReductionOptions& options) {
  if (!ctx.mesh->HasAxis(kDataAxis)) return absl::OkStatus();
  return ReduceTreeOverAxis(ctx, grads, kDataAxis,
                            type == ReduceType::kMean ? ReduceOp::kMean : ReduceOp::kSum,
                            options.bucket_bytes, "reduce_gradient_tree");
}

absl::Status ReduceGradientsBySharding(DeviceContext& ctx, TensorTree* grads,
                                       const std::map<std::string, PartitionSpec>& specs,
                                       const GradientReductionOptions& options) {
  return ReduceTree(
      ctx, grads, ReduceOp::kMean,
      [&](const FlatLayout& layout) {
        return PlanBySharding(ctx.mesh->axis_names(), layout, specs);
      },
      options.bucket_bytes, "reduce_gradients_by_sharding");
}

absl::StatusOr<TensorTree> AllGatherState(DeviceContext& ctx, const TensorTree& local,
                                          const std::map<std::string, PartitionSpec>& specs) {
  return AllGatherState(local, specs, [&ctx](const Tensor& t, const std::string& axis) {
    return AllGather(ctx, t, axis);
  });
}

absl::StatusOr<TensorTree> AllGatherState(const TensorTree& local,
                                          const std::map<std::string, PartitionSpec>& specs,
                                          const AxisGather& gather) {
  TensorTree full;
  for (const auto& [name, shard] : local) {
    Tensor gathered = shard;
    auto spec = specs.find(name);
    if (spec != specs.end()) {
      const auto& dims = spec->second.dims();
      for (size_t d = 0; d < dims.size(); ++d) {
        if (dims[d].empty()) continue;
        if (dims[d].size() != 1) {
          return absl::UnimplementedError(absl::StrCat(
              "all_gather_state: '", name, "' splits dimension ", d, " over several axes"));
        }
        SUBSTRAX_ASSIGN_OR_RETURN(Tensor stacked, gather(gathered, dims[d][0]));
        // stacked is [n, ...shard]; concatenate the n blocks along dimension d.
        const int64_t n = stacked.dim(0);
        std::vector<int64_t> shape = gathered.shape();
        int64_t outer = 1, inner = 1;
        for (size_t k = 0; k < d; ++k) outer *= shape[k];
        for (size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
        const int64_t block = shape[d] * inner;
        shape[d] *= n;
        Tensor out(shape);
        for (int64_t o = 0; o < outer; ++o) {
          for (int64_t b = 0; b < n; ++b) {
            std::memcpy(out.data() + (o * n + b) * block,
                        stacked.data() + b * gathered.size() + o * block, block * sizeof(float));
          }
        }
        gathered = std::move(out);
      }
    }
    full[name] = std::move(gathered);
  }
  return full;
}

std::map<std::string, PartitionSpec> PartitionSpecs(const Model& model) {
  std::map<std::string, PartitionSpec> specs;
  for (const ParamSpec& p : model.params()) specs[p.name] = p.partition;
  return specs;
}

absl::StatusOr<Batch> PlaceBatchOnShards(const Batch& global, const NamedSharding& sharding,
                                         int device_id) {
  Batch local;
  SUBSTRAX_ASSIGN_OR_RETURN(local.inputs,
                            ShardForDevice(global.inputs, sharding, device_id, "batch inputs"));
  SUBSTRAX_ASSIGN_OR_RETURN(local.targets,
                            ShardForDevice(global.targets, sharding, device_id, "batch targets"));
  return local;
}

absl::StatusOr<TensorTree> PlaceStateOnShards(const TensorTree& state, const Mesh& mesh,
                                              const std::map<std::string, PartitionSpec>& specs,
                                              int device_id) {
  TensorTree local;
  for (const auto& [name, tensor] : state) {
    const std::string what = absl::StrCat("state '", name, "'");
    auto spec = specs.find(name);
    absl::StatusOr<NamedSharding> sharding =
        NamedSharding::Create(mesh, spec == specs.end() ? PartitionSpec() : spec->second);
    if (!sharding.ok()) return Annotate(sharding.status(), what);
    SUBSTRAX_ASSIGN_OR_RETURN(local[name], ShardForDevice(tensor, *sharding, device_id, what));
  }
  return local;
}

absl::StatusOr<StepResult> SpmdTrainStep(DeviceContext& ctx, const Model& model,
                                         Optimizer& optimizer, TensorTree* params,
                                         const Batch& batch,
                                         const GradientReductionOptions& options) {
  return SpmdTrainStep(ctx, ModelLossAndGrads(model), optimizer, params, batch,
                       PartitionSpecs(model), options);
}

absl::StatusOr<StepResult> SpmdTrainStep(DeviceContext& ctx, const LossAndGradsFn& loss_and_grads,
                                         Optimizer& optimizer, TensorTree* params,
                                         const Batch& batch,
                                         const std::map<std::string, PartitionSpec>& specs,
                                         const GradientReductionOptions& options) {
  if (!loss_and_grads) {
    return absl::InvalidArgumentError("spmd_train_step: no loss-and-gradients function given");
  }
  return TrainStep(loss_and_grads, optimizer, params, batch, [&](TensorTree* grads) {
    return ReduceGradientsBySharding(ctx, grads, specs, options);
  });
}

absl::StatusOr<StepResult> CollectiveTrainStep(DeviceContext& ctx, const Model& model,
                                               Optimizer& optimizer, TensorTree* params,
                                               const Batch& batch) {
  return TrainStep(ModelLossAndGrads(model), optimizer, params, batch,
                   [&](TensorTree* grads) -> absl::Status {
    if (ctx.mesh->HasAxis(kDataAxis)) {
      SUBSTRAX_RETURN_IF_ERROR(ReduceMeanCollective(ctx, grads, kDataAxis));
    }
    if (!ctx.mesh->HasAxis(kModelAxis)) return absl::OkStatus();
    // Tensor parallelism replicates some parameters along "model": average those there too.
    TensorTree replicated;
    for (const ParamSpec& p : model.params()) {
      if (p.partition == PartitionSpec()) replicated[p.name] = std::move((*grads)[p.name]);
    }
    absl::Status status = ReduceMeanCollective(ctx, &replicated, kModelAxis);
    for (auto& [name, grad] : replicated) (*grads)[name] = std::move(grad);
    return status;
  });
}

}  // namespace substrax
