#include "worker/runtime/step_loop.h"

#include <algorithm>
#include <deque>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "worker/runtime/overlapped_reduction.h"

namespace substrax {
namespace {

// The flat layout of the gradients: parameters replicated over every axis first, then the split
// ones, each group in layer order. So the ranges each axis averages are few and long (on a
// (data, model) mesh the model axis averages one prefix of the buffer).
FlatLayout GradientLayout(const DeviceBackend& backend) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> replicated, split;
  for (const ParamSpec& p : backend.params()) {
    (p.partition == PartitionSpec() ? replicated : split)
        .emplace_back(p.name, backend.LocalShape(p));
  }
  replicated.insert(replicated.end(), split.begin(), split.end());
  return MakeFlatLayout(replicated);
}

std::map<std::string, PartitionSpec> Specs(const DeviceBackend& backend) {
  std::map<std::string, PartitionSpec> specs;
  for (const ParamSpec& p : backend.params()) specs[p.name] = p.partition;
  return specs;
}

// The pmap path, as the guide writes it with axis names: every gradient averaged over "data",
// then the gradients of the parameters tensor parallelism replicates over "model".
std::vector<std::pair<std::string, GradientPlan>> ExplicitPlans(const Mesh& mesh,
                                                              const FlatLayout& layout,
                                                              const DeviceBackend& backend) {
  std::vector<std::pair<std::string, GradientPlan>> plans;
  if (mesh.HasAxis(kDataAxis)) plans.emplace_back(kDataAxis, PlanOverAxis(kDataAxis, layout));
  if (mesh.HasAxis(kModelAxis)) {
    std::map<std::string, PartitionSpec> split_everywhere;
    for (const ParamSpec& p : backend.params()) {
      if (!(p.partition == PartitionSpec())) {
        split_everywhere[p.name] = PartitionSpec::Of({std::string(kModelAxis)});
      }
    }
    plans.emplace_back(kModelAxis, PlanBySharding({kModelAxis}, layout, split_everywhere));
  }
  return plans;
}

// Evaluation: the devices of the data axis each take a contiguous share of `data` (devices along
// the model axis evaluate the same share together, as tensor parallelism needs); the sums are
// added over the data axis.
absl::StatusOr<Metrics> Evaluate(DeviceContext& ctx, DeviceBackend& backend, const Dataset& data,
                                 const std::string& prefix) {
  const int64_t n = data.num_examples();
  const int64_t shards = ctx.data_size(), shard = ctx.data_index();
  SUBSTRAX_ASSIGN_OR_RETURN(EvalResult r,
                            backend.Evaluate(data, n * shard / shards, n * (shard + 1) / shards));
  std::vector<double> sums = {r.loss_sum, static_cast<double>(r.correct),
                              static_cast<double>(r.count)};
  if (ctx.mesh->HasAxis(kDataAxis)) {
    SUBSTRAX_ASSIGN_OR_RETURN(Communicator * comm, ctx.comms->Axis(kDataAxis));
    SUBSTRAX_RETURN_IF_ERROR(
        Annotate(comm->AllReduce(absl::MakeSpan(sums), ReduceOp::kSum), "evaluation"));
  }
  Metrics out;
  if (sums[2] == 0) return out;
  out[prefix + "_loss"] = sums[0] / sums[2];
  if (backend.is_classification()) out[prefix + "_accuracy"] = sums[1] / sums[2];
  return out;
}

// The interval's metrics on this device, for the metric names the spec declares.
Metrics LocalMetrics(const std::map<std::string, ReduceOp>& reductions, const EvalResult& sums,
                     int64_t step) {
  const double count = static_cast<double>(std::max<int64_t>(1, sums.count));
  Metrics local;
  for (const auto& [name, op] : reductions) {
    if (name == "loss") local[name] = sums.loss_sum / count;
    if (name == "accuracy") local[name] = static_cast<double>(sums.correct) / count;
    if (name == "step") local[name] = static_cast<double>(step);
  }
  return local;
}

// The sharded update's plan: the data axis's communicator and the elements of each device's
// block of the gradient buffer.
struct ShardedUpdate {
  Communicator* comm = nullptr;
  int64_t block = 0;
};

// Whole 64-byte lines of float32: neighbouring blocks share no cache line.
constexpr int64_t kShardedBlockGranule = 16;

absl::StatusOr<std::optional<ShardedUpdate>> PlanShardedUpdate(const StepLoopOptions& options,
                                                             const DeviceContext& ctx,
                                                             const DeviceBackend& backend,
                                                             const FlatLayout& layout) {
  if (!backend.shards_update()) return std::optional<ShardedUpdate>();
  const Mesh& mesh = *ctx.mesh;
  if (options.explicit_collectives || !mesh.HasAxis(kDataAxis) ||
      mesh.axis_names().size() != 1 || backend.max_steps_in_flight() > 0) {
    return absl::InvalidArgumentError(
        "the update is sharded only on a mesh with a data axis alone, on the sharding path "
        "(not explicit collectives), with a backend that runs on the calling thread");
  }
  ShardedUpdate plan;
  SUBSTRAX_ASSIGN_OR_RETURN(plan.comm, ctx.comms->Axis(kDataAxis));
  const int64_t n = plan.comm->size();
  const int64_t per_device = (layout.total + n - 1) / n;
  plan.block = (per_device + kShardedBlockGranule - 1) / kShardedBlockGranule * kShardedBlockGranule;
  return std::optional<ShardedUpdate>(plan);
}

}  // namespace

ProgressReport MakeProgressReport(int64_t total_steps, int64_t steps_per_epoch,
                                  int64_t steps_done, Metrics metrics, int64_t global_batch,
                                  int64_t interval_steps, absl::Duration interval,
                                  absl::Duration elapsed) {
  steps_per_epoch = std::max<int64_t>(1, steps_per_epoch);
  ProgressReport report;
  report.step = steps_done;
  report.total_steps = total_steps;
  report.epoch = (steps_done - 1) / steps_per_epoch + 1;
  report.total_epochs = (total_steps + steps_per_epoch - 1) / steps_per_epoch;
  report.metrics = std::move(metrics);
  report.samples_per_second = static_cast<double>(global_batch * interval_steps) /
                              std::max(1e-9, absl::ToDoubleSeconds(interval));
  report.elapsed = elapsed;
  return report;
}

absl::StatusOr<TrainResult> RunStepLoop(const StepLoopOptions& options, DeviceBackend& backend,
                                        StepLoopStats* stats) {
  if (options.spec == nullptr || options.mesh == nullptr || options.comms == nullptr) {
    return absl::InvalidArgumentError("step loop: spec, mesh and communicators are required");
  }
  const v1::JobSpec& spec = *options.spec;
  const Mesh& mesh = *options.mesh;
  DeviceContext ctx;
  ctx.mesh = &mesh;
  SUBSTRAX_ASSIGN_OR_RETURN(ctx.coords, mesh.CoordinatesOf(options.device_id));
  ctx.device = mesh.DeviceAt(ctx.coords);
  ctx.comms = options.comms;

  std::map<std::string, ReduceOp> reductions;
  for (const auto& [name, reduction] : spec.metrics()) {
    absl::StatusOr<ReduceOp> op = ReduceOpFromProto(reduction);
    if (!op.ok()) return Annotate(op.status(), absl::StrCat("spec.metrics.", name));
    reductions[name] = *op;
  }

  const FlatLayout layout = GradientLayout(backend);
  // The sharded update (DeviceBackend::shards_update): the buffer is padded to equal blocks of
  // whole cache lines, one per device of the data axis, for the reduce-scatter.
  SUBSTRAX_ASSIGN_OR_RETURN(std::optional<ShardedUpdate> sharded,
                            PlanShardedUpdate(options, ctx, backend, layout));
  FlatLayout bound = layout;
  if (sharded.has_value()) bound.total = sharded->block * sharded->comm->size();
  SUBSTRAX_ASSIGN_OR_RETURN(float* grads, backend.BindGradients(bound));
  const GradientPlan sharding_plan = PlanBySharding(mesh.axis_names(), layout, Specs(backend));
  const std::vector<std::pair<std::string, GradientPlan>> explicit_plans =
      ExplicitPlans(mesh, layout, backend);
  const ExecutionContext exec = backend.execution_context();
  BucketStats buckets;
  // On an asynchronous backend the step's reductions stay in flight (the device orders the
  // update after them) and are collected here: oldest first, at each report, at the end, and
  // whenever more than max_steps_in_flight steps are outstanding, so that a failure surfaces
  // within a bounded number of steps and the handles do not pile up.
  const size_t max_in_flight = static_cast<size_t>(std::max(0, backend.max_steps_in_flight()));
  struct StepReductions {
    int64_t step = 0;
    const char* fn = "";
    std::vector<CollectiveEvent> events;
  };
  std::deque<StepReductions> in_flight;
  std::vector<CollectiveEvent> step_events;
  auto collect = [&](size_t keep) -> absl::Status {
    while (in_flight.size() > keep) {
      StepReductions oldest = std::move(in_flight.front());
      in_flight.pop_front();
      absl::Status status;
      for (const CollectiveEvent& e : oldest.events) status.Update(e.Await());
      if (!status.ok()) {
        return Annotate(status, absl::StrCat("step ", oldest.step, ": ", oldest.fn));
      }
    }
    return absl::OkStatus();
  };
  const char* const reduce_fn =
      options.explicit_collectives ? "reduce_mean_collective" : "gradient reduction";
  // Overlap where it can be taken (StepLoopOptions::overlap_gradients says where).
  std::unique_ptr<OverlappedReduction> overlapped;
  absl::StatusOr<Communicator*> model_axis = ctx.comms->Axis(kModelAxis);
  const bool tensor_parallel = model_axis.ok() && (*model_axis)->size() > 1;
  if (options.overlap_gradients && !options.explicit_collectives && max_in_flight == 0 &&
      !tensor_parallel && !sharded.has_value()) {
    SUBSTRAX_ASSIGN_OR_RETURN(
        overlapped, OverlappedReduction::Create(*ctx.comms, sharding_plan, grads, ReduceOp::kMean,
                                                options.gradients.bucket_bytes, reduce_fn));
    backend.SetGradientsReady(
        [r = overlapped.get()](int64_t offset, int64_t size) { r->Ready(offset, size); });
  }
  // The backend must not call into the reduction after the loop.
  struct Unbind {
    DeviceBackend& backend;
    bool bound;
    ~Unbind() {
      if (bound) backend.SetGradientsReady(nullptr);
    }
  } unbind{backend, overlapped != nullptr};
  auto reduce_gradients = [&]() -> absl::Status {
    if (overlapped != nullptr) return overlapped->Finish();
    if (sharded.has_value()) {
      ++buckets.collectives;
      Communicator& comm = *sharded->comm;
      return Annotate(comm.ReduceScatter(grads, grads + sharded->block * comm.rank(),
                                         DataType::kFloat32, sharded->block, ReduceOp::kMean),
                      reduce_fn);
    }
    std::vector<CollectiveEvent>* events = max_in_flight > 0 ? &step_events : nullptr;
    if (!options.explicit_collectives) {
      return ReduceFlat(*ctx.comms, sharding_plan, grads, ReduceOp::kMean,
                        options.gradients.bucket_bytes, exec, reduce_fn, &buckets, events);
    }
    for (const auto& [axis, plan] : explicit_plans) {
      SUBSTRAX_RETURN_IF_ERROR(ReduceFlat(*ctx.comms, plan, grads, ReduceOp::kMean,
                                          options.gradients.bucket_bytes, exec, reduce_fn,
                                          &buckets, events));
    }
    return absl::OkStatus();
  };

  const bool reporter = mesh.Ravel(ctx.coords) == 0;
  const int64_t global_batch = spec.batch().global_batch_size();
  const int64_t report_every = std::max<int64_t>(1, spec.report_every_steps());
  TrainResult result;
  int64_t interval_steps = 0;
  absl::Time interval_start = absl::Now();
  const absl::Time start = interval_start;
  SUBSTRAX_RETURN_IF_ERROR(backend.TakePhaseSeconds().status());  // start the clock afresh

  absl::Time last_save = start;
  auto save = [&](int64_t steps_done) -> absl::Status {
    // The state must be the step's: every reduction it depends on has landed.
    SUBSTRAX_RETURN_IF_ERROR(collect(0));
    last_save = absl::Now();
    return Annotate(options.save(steps_done, backend),
                    absl::StrCat("checkpoint after step ", steps_done));
  };

  for (int64_t step = options.first_step; step < options.total_steps; ++step) {
    auto step_error = [step](const absl::Status& s) {
      return Annotate(s, absl::StrCat("step ", step + 1));
    };
    backend.MarkPhase(Phase::kData);
    absl::StatusOr<bool> more = backend.NextBatch();
    if (!more.ok()) return step_error(more.status());
    if (!*more) {
      return absl::InternalError(absl::StrCat("input ended after ", step, " of ",
                                              options.total_steps, " steps"));
    }
    backend.MarkPhase(Phase::kCompute);
    if (overlapped != nullptr) overlapped->Begin();
    if (absl::Status s = backend.ComputeGradients(); !s.ok()) return step_error(s);
    backend.MarkPhase(Phase::kCollective);
    if (absl::Status s = reduce_gradients(); !s.ok()) return step_error(s);
    backend.MarkPhase(Phase::kCompute);
    if (sharded.has_value()) {
      // This device's block of the parameters; then, once every device has updated its block,
      // the others' blocks from them.
      // (Past the layout's end, in its padding, a block is empty.)
      const int64_t begin = std::min(layout.total, sharded->block * sharded->comm->rank());
      const int64_t end = std::min(layout.total, sharded->block * (sharded->comm->rank() + 1));
      if (absl::Status s = backend.ApplyGradientBlock(begin, end, step + 1); !s.ok()) {
        return step_error(s);
      }
      backend.MarkPhase(Phase::kCollective);
      if (absl::Status s = Annotate(sharded->comm->Barrier(), "sharded update"); !s.ok()) {
        return step_error(s);
      }
      if (absl::Status s = backend.FetchPeerBlocks(sharded->block, sharded->comm->rank(),
                                                   sharded->comm->size());
          !s.ok()) {
        return step_error(s);
      }
    } else if (absl::Status s = backend.ApplyGradients(); !s.ok()) {
      return step_error(s);
    }
    ++interval_steps;
    if (max_in_flight > 0) {
      in_flight.push_back({step + 1, reduce_fn, std::move(step_events)});
      step_events.clear();
      SUBSTRAX_RETURN_IF_ERROR(collect(max_in_flight));
    }

    const bool last = step + 1 == options.total_steps;
    bool save_now = options.save != nullptr &&
                    ((options.save_every_steps > 0 && (step + 1) % options.save_every_steps == 0) ||
                     (last && options.save_at_end));
    if ((step + 1) % report_every != 0 && !last) {
      if (save_now) SUBSTRAX_RETURN_IF_ERROR(save(step + 1));
      continue;
    }
    // The report: this device's metrics of the interval, reduced over the devices as the spec
    // declares, and the slowest device's time fractions. Every reduction still in flight is
    // collected first: a report never covers a step whose collectives failed.
    SUBSTRAX_RETURN_IF_ERROR(collect(0));
    backend.MarkPhase(Phase::kCollective);
    SUBSTRAX_ASSIGN_OR_RETURN(EvalResult sums, backend.TakeMetrics());
    SUBSTRAX_ASSIGN_OR_RETURN(PhaseSeconds seconds, backend.TakePhaseSeconds());
    const double wall = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - interval_start));
    const Metrics local = LocalMetrics(reductions, sums, step + 1);
    if (options.on_device_report) {
      DeviceReport report;
      report.device_id = options.device_id;
      report.step = step + 1;
      report.values = local;
      report.samples_per_second = static_cast<double>(sums.count) / wall;
      report.data_wait_seconds = seconds[static_cast<int>(Phase::kData)];
      report.compute_seconds = seconds[static_cast<int>(Phase::kCompute)];
      report.collective_seconds = seconds[static_cast<int>(Phase::kCollective)];
      report.total_steps = options.total_steps;
      options.on_device_report(report);
    }
    SUBSTRAX_ASSIGN_OR_RETURN(Metrics reduced, ReduceCustom(ctx, local, reductions));
    // The time fractions, and whether any device finds a timed checkpoint due: reduced together
    // so that every device decides the same.
    const bool due = options.save != nullptr && options.save_every > absl::ZeroDuration() &&
                     absl::Now() - last_save >= options.save_every;
    const Metrics fractions = {
        {"collective", seconds[static_cast<int>(Phase::kCollective)] / wall},
        {"compute", seconds[static_cast<int>(Phase::kCompute)] / wall},
        {"data", seconds[static_cast<int>(Phase::kData)] / wall},
        {"save", due ? 1.0 : 0.0}};
    SUBSTRAX_ASSIGN_OR_RETURN(
        Metrics slowest,
        ReduceCustom(ctx, fractions,
                     std::map<std::string, ReduceOp>{{"collective", ReduceOp::kMax},
                                                     {"compute", ReduceOp::kMax},
                                                     {"data", ReduceOp::kMax},
                                                     {"save", ReduceOp::kMax}}));
    save_now = save_now || slowest["save"] > 0;
    if (reporter && options.on_progress) {
      ProgressReport report =
          MakeProgressReport(options.total_steps, options.steps_per_epoch, step + 1, reduced,
                             global_batch, interval_steps, absl::Seconds(wall),
                             absl::Now() - start);
      report.data_wait_fraction = slowest["data"];
      report.compute_fraction = slowest["compute"];
      report.collective_fraction = slowest["collective"];
      options.on_progress(report);
    }
    result.final_metrics = std::move(reduced);
    interval_steps = 0;
    interval_start = absl::Now();
    // (Counted in the next interval's time: the copy is part of training's cost.)
    if (save_now) SUBSTRAX_RETURN_IF_ERROR(save(step + 1));
  }
  result.steps = options.total_steps;
  result.resumed_from_step = options.first_step;
  if (stats != nullptr) {
    stats->gradient_collectives =
        overlapped != nullptr ? overlapped->collectives() : buckets.collectives;
    stats->overlapped = overlapped != nullptr;
    stats->sharded_update = sharded.has_value();
  }
  if (options.eval != nullptr) {
    SUBSTRAX_ASSIGN_OR_RETURN(result.evaluation,
                              Evaluate(ctx, backend, *options.eval, options.eval_prefix));
  }
  // Full-shape parameters: this device's blocks, gathered over the axes they are split on.
  SUBSTRAX_ASSIGN_OR_RETURN(TensorTree local, backend.Parameters());
  SUBSTRAX_ASSIGN_OR_RETURN(result.params, AllGatherState(ctx, local, Specs(backend)));
  return result;
}

}  // namespace substrax
