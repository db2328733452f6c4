#include "worker/runtime/step_loop.h"

#include <algorithm>
#include <deque>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "contract/activity.h"
#include "worker/collectives/job_failpoints.h"
#include "worker/runtime/gradient_reducer.h"
#include "worker/runtime/preemption.h"

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
std::vector<GradientPlan> ExplicitPlans(const Mesh& mesh, const FlatLayout& layout,
                                        const DeviceBackend& backend) {
  std::vector<GradientPlan> plans;
  if (mesh.HasAxis(kDataAxis)) plans.push_back(PlanOverAxis(kDataAxis, layout));
  if (mesh.HasAxis(kModelAxis)) {
    std::map<std::string, PartitionSpec> split_everywhere;
    for (const ParamSpec& p : backend.params()) {
      if (!(p.partition == PartitionSpec())) {
        split_everywhere[p.name] = PartitionSpec::Of({std::string(kModelAxis)});
      }
    }
    plans.push_back(PlanBySharding({kModelAxis}, layout, split_everywhere));
  }
  return plans;
}

// The reducer of every step, chosen once: the backend's own (the CPU backend's sharded update),
// else the pmap path's, else overlapped where it can be taken (StepLoopOptions::overlap_gradients
// says where), else the shardings' after the backward pass.
absl::StatusOr<std::unique_ptr<GradientReducer>> ChooseGradientReducer(
    const StepLoopOptions& options, const DeviceContext& ctx, DeviceBackend& backend) {
  GradientReducerSetup setup;
  setup.mesh = ctx.mesh;
  setup.comms = ctx.comms;
  setup.layout = GradientLayout(backend);
  setup.explicit_collectives = options.explicit_collectives;
  setup.gradients = options.gradients;
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> own,
                            backend.OwnGradientReducer(setup));
  if (own != nullptr) return own;
  SUBSTRAX_ASSIGN_OR_RETURN(float* grads, backend.BindGradients(setup.layout));
  const int64_t bucket_bytes = options.gradients.bucket_bytes;
  const ExecutionContext exec = backend.execution_context();
  if (options.explicit_collectives) {
    return MakeExplicitReducer(*ctx.comms, ExplicitPlans(*ctx.mesh, setup.layout, backend), grads,
                               bucket_bytes, exec);
  }
  GradientPlan plan = PlanBySharding(ctx.mesh->axis_names(), setup.layout, Specs(backend));
  plan.reduce_single_replica_axes = options.force_single_replica_collectives;
  absl::StatusOr<Communicator*> model_axis = ctx.comms->Axis(kModelAxis);
  const bool tensor_parallel = model_axis.ok() && (*model_axis)->size() > 1;
  if (options.overlap_gradients && backend.max_steps_in_flight() == 0 && !tensor_parallel) {
    return MakeOverlappedReducer(backend, *ctx.comms, plan, grads, bucket_bytes);
  }
  return MakeFlatReducer(*ctx.comms, std::move(plan), grads, bucket_bytes, exec);
}

// On an asynchronous backend the step's reductions stay in flight (the device orders the update
// after them) and are collected here: oldest first, at each report, at the end, and whenever
// more than max_steps_in_flight steps are outstanding, so that a failure surfaces within a
// bounded number of steps and the handles do not pile up.
class InFlightReductions {
 public:
  explicit InFlightReductions(int max_steps)
      : max_steps_(static_cast<size_t>(std::max(0, max_steps))) {}

  // Where the step's reducer leaves its handles; null: it waits for its collectives itself.
  std::vector<CollectiveEvent>* step_events() { return max_steps_ > 0 ? &step_events_ : nullptr; }
  // After step `step`'s update: keeps its handles, collects what is beyond the bound.
  absl::Status EndStep(int64_t step, const char* what) {
    if (max_steps_ == 0) return absl::OkStatus();
    steps_.push_back({step, what, std::move(step_events_)});
    step_events_.clear();
    return Collect(max_steps_);
  }
  // Collects every step's reductions: errors annotated with the step that issued them.
  absl::Status CollectAll() { return Collect(0); }

 private:
  struct StepReductions {
    int64_t step = 0;
    const char* what = "";
    std::vector<CollectiveEvent> events;
  };
  absl::Status Collect(size_t keep) {
    while (steps_.size() > keep) {
      StepReductions oldest = std::move(steps_.front());
      steps_.pop_front();
      absl::Status status;
      for (const CollectiveEvent& e : oldest.events) status.Update(e.Await());
      if (!status.ok()) {
        return Annotate(status, absl::StrCat("step ", oldest.step, ": ", oldest.what));
      }
    }
    return absl::OkStatus();
  }

  const size_t max_steps_;
  std::deque<StepReductions> steps_;
  std::vector<CollectiveEvent> step_events_;
};

// Evaluation: the devices of the data axis each take a contiguous share of `data` (devices along
// the model axis evaluate the same share together, as tensor parallelism needs); the sums are
// added over the data axis.
absl::StatusOr<Metrics> Evaluate(DeviceContext& ctx, DeviceBackend& backend,
                                 const Dataset& data, const std::string& prefix) {
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

// The spec's metric reductions by metric name.
using MetricOps = std::map<std::string, ReduceOp>;
absl::StatusOr<MetricOps> MetricReductions(const v1::JobSpec& spec) {
  MetricOps reductions;
  for (const auto& [name, reduction] : spec.metrics()) {
    absl::StatusOr<ReduceOp> op = ReduceOpFromProto(reduction);
    if (!op.ok()) return Annotate(op.status(), absl::StrCat("spec.metrics.", name));
    reductions[name] = *op;
  }
  return reductions;
}

// One device's loop between its steps: the interval's reports and the checkpoints.
class StepLoop {
 public:
  StepLoop(const StepLoopOptions& options, DeviceContext ctx, DeviceBackend& backend,
           GradientReducer& reducer, MetricOps reductions)
      : options_(options),
        ctx_(std::move(ctx)),
        backend_(backend),
        reducer_(reducer),
        reductions_(std::move(reductions)),
        in_flight_(backend.max_steps_in_flight()),
        report_every_(std::max<int64_t>(1, options.spec->report_every_steps())),
        board_(ProcessActivityBoard()),
        board_slot_(board_ != nullptr ? board_->DeviceSlot(options.device_id) : -1) {}

  // One step (0-based `step`): data, gradients, their reduction, the update.
  absl::Status Step(int64_t step);
  // After `done` steps: a report and a checkpoint, where due.
  absl::Status ReportAndSave(int64_t done);
  // After the last step: evaluation and the parameters at their full shapes.
  absl::StatusOr<TrainResult> Finish();

 private:
  // What every device agreed on at a report.
  struct Agreed {
    bool save = false;  // some device finds a timed checkpoint due
    bool stop = false;  // some device was asked to stop
  };
  // The report after `done` steps.
  absl::StatusOr<Agreed> Report(int64_t done);
  absl::Status Save(int64_t done);
  // The device starts `phase` with `done` steps completed: timed by the backend, published in
  // the activity file (contract/activity.h) where the process has one.
  void Mark(Phase phase, int64_t done) {
    backend_.MarkPhase(phase);
    Publish(phase == Phase::kData      ? ActivityPhase::kData
            : phase == Phase::kCompute ? ActivityPhase::kCompute
                                       : ActivityPhase::kCollective,
            done);
  }
  void Publish(ActivityPhase phase, int64_t done) {
    if (board_ != nullptr) board_->SetPhase(board_slot_, phase, done);
  }

  const StepLoopOptions& options_;
  DeviceContext ctx_;
  DeviceBackend& backend_;
  GradientReducer& reducer_;
  const MetricOps reductions_;
  InFlightReductions in_flight_;
  const int64_t report_every_;
  ActivityBoard* const board_;
  const int board_slot_;
  Metrics final_metrics_;
  int64_t interval_steps_ = 0;
  const absl::Time start_ = absl::Now();
  absl::Time interval_start_ = start_;
  absl::Time last_save_ = start_;
};

absl::Status StepLoop::Step(int64_t step) {
  auto step_error = [step](const absl::Status& s) {
    return Annotate(s, absl::StrCat("step ", step + 1));
  };
  Mark(Phase::kData, step);
  JobFailpointAtStep(step + 1);
  absl::StatusOr<bool> more = backend_.NextBatch();
  if (!more.ok()) return step_error(more.status());
  if (!*more) {
    return absl::InternalError(
        absl::StrCat("input ended after ", step, " of ", options_.total_steps, " steps"));
  }
  Mark(Phase::kCompute, step);
  reducer_.BeginStep();
  if (absl::Status s = backend_.ComputeGradients(); !s.ok()) return step_error(s);
  Mark(Phase::kCollective, step);
  if (absl::Status s = reducer_.Reduce(in_flight_.step_events()); !s.ok()) return step_error(s);
  Mark(Phase::kCompute, step);
  if (absl::Status s = reducer_.Apply(backend_, step + 1); !s.ok()) return step_error(s);
  ++interval_steps_;
  return in_flight_.EndStep(step + 1, reducer_.what());
}

absl::Status StepLoop::ReportAndSave(int64_t done) {
  const bool last = done == options_.total_steps;
  const bool save_now =
      options_.save != nullptr &&
      ((options_.save_every_steps > 0 && done % options_.save_every_steps == 0) ||
       (last && options_.save_at_end));
  Agreed agreed;
  if (done % report_every_ == 0 || last) {
    SUBSTRAX_ASSIGN_OR_RETURN(agreed, Report(done));
  }
  const bool stop = agreed.stop && !last;
  // (After a report, counted in the next interval's time: the copy is part of training's cost.)
  if (save_now || agreed.save || (stop && options_.save != nullptr)) {
    SUBSTRAX_RETURN_IF_ERROR(Save(done));
  }
  return stop ? StoppedBySigterm(done, options_.save != nullptr) : absl::OkStatus();
}

absl::StatusOr<StepLoop::Agreed> StepLoop::Report(int64_t done) {
  // This device's metrics of the interval, reduced over the devices as the spec declares, and
  // the slowest device's time fractions. Every reduction still in flight is collected first: a
  // report never covers a step whose collectives failed.
  SUBSTRAX_RETURN_IF_ERROR(in_flight_.CollectAll());
  Mark(Phase::kCollective, done);
  SUBSTRAX_ASSIGN_OR_RETURN(EvalResult sums, backend_.TakeMetrics());
  SUBSTRAX_ASSIGN_OR_RETURN(PhaseSeconds seconds, backend_.TakePhaseSeconds());
  const double wall = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - interval_start_));
  const Metrics local = LocalMetrics(reductions_, sums, done);
  auto phase = [&seconds](Phase p) { return seconds[static_cast<int>(p)]; };
  if (options_.on_device_report) {
    DeviceReport report;
    report.device_id = options_.device_id;
    report.step = done;
    report.values = local;
    report.samples_per_second = static_cast<double>(sums.count) / wall;
    report.data_wait_seconds = phase(Phase::kData);
    report.compute_seconds = phase(Phase::kCompute);
    report.collective_seconds = phase(Phase::kCollective);
    report.total_steps = options_.total_steps;
    options_.on_device_report(report);
  }
  SUBSTRAX_ASSIGN_OR_RETURN(Metrics reduced, ReduceCustom(ctx_, local, reductions_));
  // The time fractions, whether any device finds a timed checkpoint due and whether any was
  // asked to stop: reduced together so that every device decides the same.
  const bool due = options_.save != nullptr && options_.save_every > absl::ZeroDuration() &&
                   absl::Now() - last_save_ >= options_.save_every;
  const bool stop = options_.stop_requested != nullptr && options_.stop_requested();
  const Metrics fractions = {{"collective", phase(Phase::kCollective) / wall},
                             {"compute", phase(Phase::kCompute) / wall},
                             {"data", phase(Phase::kData) / wall},
                             {"save", due ? 1.0 : 0.0},
                             {"stop", stop ? 1.0 : 0.0}};
  SUBSTRAX_ASSIGN_OR_RETURN(
      Metrics slowest,
      ReduceCustom(ctx_, fractions,
                   MetricOps{{"collective", ReduceOp::kMax},
                             {"compute", ReduceOp::kMax},
                             {"data", ReduceOp::kMax},
                             {"save", ReduceOp::kMax},
                             {"stop", ReduceOp::kMax}}));
  if (options_.on_progress && ctx_.mesh->Ravel(ctx_.coords) == 0) {
    ProgressReport report = MakeProgressReport(
        options_.total_steps, options_.steps_per_epoch, done, reduced,
        options_.spec->batch().global_batch_size(), interval_steps_, absl::Seconds(wall),
        absl::Now() - start_);
    report.data_wait_fraction = slowest["data"];
    report.compute_fraction = slowest["compute"];
    report.collective_fraction = slowest["collective"];
    options_.on_progress(report);
  }
  final_metrics_ = std::move(reduced);
  interval_steps_ = 0;
  interval_start_ = absl::Now();
  return Agreed{.save = slowest["save"] > 0, .stop = slowest["stop"] > 0};
}

absl::Status StepLoop::Save(int64_t done) {
  // The state must be the step's: every reduction it depends on has landed.
  SUBSTRAX_RETURN_IF_ERROR(in_flight_.CollectAll());
  Publish(ActivityPhase::kCheckpoint, done);
  last_save_ = absl::Now();
  return Annotate(options_.save(done, backend_), absl::StrCat("checkpoint after step ", done));
}

absl::StatusOr<TrainResult> StepLoop::Finish() {
  TrainResult result;
  result.steps = options_.total_steps;
  result.resumed_from_step = options_.first_step;
  result.final_metrics = std::move(final_metrics_);
  Publish(ActivityPhase::kEvaluation, options_.total_steps);
  if (options_.eval != nullptr) {
    SUBSTRAX_ASSIGN_OR_RETURN(result.evaluation,
                              Evaluate(ctx_, backend_, *options_.eval, options_.eval_prefix));
  }
  // Full-shape parameters: this device's blocks, gathered over the axes they are split on.
  SUBSTRAX_ASSIGN_OR_RETURN(TensorTree local, backend_.Parameters());
  SUBSTRAX_ASSIGN_OR_RETURN(result.params, AllGatherState(ctx_, local, Specs(backend_)));
  return result;
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
  DeviceContext ctx;
  ctx.mesh = options.mesh;
  SUBSTRAX_ASSIGN_OR_RETURN(ctx.coords, options.mesh->CoordinatesOf(options.device_id));
  ctx.device = options.mesh->DeviceAt(ctx.coords);
  ctx.comms = options.comms;
  SUBSTRAX_ASSIGN_OR_RETURN(MetricOps reductions, MetricReductions(*options.spec));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<GradientReducer> reducer,
                            ChooseGradientReducer(options, ctx, backend));

  StepLoop loop(options, ctx, backend, *reducer, std::move(reductions));
  SUBSTRAX_RETURN_IF_ERROR(backend.TakePhaseSeconds().status());  // start the clock afresh
  for (int64_t step = options.first_step; step < options.total_steps; ++step) {
    SUBSTRAX_RETURN_IF_ERROR(loop.Step(step));
    SUBSTRAX_RETURN_IF_ERROR(loop.ReportAndSave(step + 1));
  }
  if (stats != nullptr) {
    stats->gradient_collectives = reducer->collectives();
    stats->gradient_reducer = reducer->kind();
  }
  return loop.Finish();
}

}  // namespace substrax
