#include "worker/runtime/trainer.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/job_spec.h"
#include "core/sharding.h"
#include "core/status.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/compute/model.h"
#include "worker/compute/optimizer.h"
#include "worker/data/dataset.h"
#include "worker/data/prefetch.h"
#include "worker/data/sampler.h"
#include "worker/runtime/cuda_trainer.h"
#include "worker/runtime/spmd.h"

namespace substrax {
namespace {

// Read-only state every device thread of the process shares.
struct Shared : TrainingData {
  const TrainerOptions* options = nullptr;
  const PeerMonitor* monitor = nullptr;
};

// Where one device's time went over a report interval.
struct Timing {
  double data = 0, compute = 0, collective = 0;
};

// The rows of a global batch this device processes: its block of the batch dimension as the
// data-parallel sharding lays it out (the whole batch on a mesh without a data axis).
absl::StatusOr<IndexRange> BatchRows(const Mesh& mesh, int device_id, int64_t global_batch) {
  if (!mesh.HasAxis(kDataAxis)) return IndexRange{0, global_batch};
  SUBSTRAX_ASSIGN_OR_RETURN(NamedSharding sharding, CreateDataParallelSharding(mesh));
  SUBSTRAX_ASSIGN_OR_RETURN(ShardLayout layout, sharding.Layout({global_batch}));
  SUBSTRAX_ASSIGN_OR_RETURN(ShardSlice shard, layout.ForDevice(device_id));
  return shard.index[0];
}

// Evaluates the split: the devices of the data axis each take a contiguous share (devices along
// the model axis evaluate the same share together, as tensor parallelism needs), and the sums
// are added over the data axis.
absl::StatusOr<Metrics> Evaluate(DeviceContext& ctx, const Model& model, const TensorTree& params,
                                 const Dataset& data, const std::string& prefix) {
  const int64_t n = data.num_examples();
  const int64_t shards = ctx.data_size(), shard = ctx.data_index();
  const int64_t begin = n * shard / shards;
  const int64_t end = n * (shard + 1) / shards;
  std::vector<double> sums = {0, 0, 0};  // loss_sum, correct, count
  constexpr int64_t kChunk = 1024;
  for (int64_t start = begin; start < end; start += kChunk) {
    std::vector<int64_t> rows;
    for (int64_t i = start; i < std::min(end, start + kChunk); ++i) rows.push_back(i);
    SUBSTRAX_ASSIGN_OR_RETURN(EvalResult r, model.Evaluate(params, Gather(data, rows)));
    sums[0] += r.loss_sum;
    sums[1] += static_cast<double>(r.correct);
    sums[2] += static_cast<double>(r.count);
  }
  if (ctx.mesh->HasAxis(kDataAxis)) {
    SUBSTRAX_ASSIGN_OR_RETURN(Communicator * data, ctx.comms->Axis(kDataAxis));
    SUBSTRAX_RETURN_IF_ERROR(
        Annotate(data->AllReduce(absl::MakeSpan(sums), ReduceOp::kSum), "evaluation"));
  }
  Metrics out;
  if (sums[2] == 0) return out;
  out[prefix + "_loss"] = sums[0] / sums[2];
  if (model.is_classification()) out[prefix + "_accuracy"] = sums[1] / sums[2];
  return out;
}

absl::StatusOr<TrainResult> RunDevice(const Shared& shared, int device_id) {
  const TrainerOptions& options = *shared.options;
  const v1::JobSpec& spec = options.spec;
  const Mesh& mesh = options.mesh;
  DeviceContext ctx;
  ctx.mesh = &mesh;
  SUBSTRAX_ASSIGN_OR_RETURN(ctx.coords, mesh.CoordinatesOf(device_id));
  ctx.device = mesh.DeviceAt(ctx.coords);
  GlooCommunicatorOptions gloo;
  gloo.timeout = options.collective_timeout;
  gloo.connect_timeout = options.connect_timeout;
  gloo.listen_host = options.listen_host;
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::unique_ptr<MeshCommunicators> comms,
      MeshCommunicators::Create(mesh, device_id, options.process_of_position, options.store,
                                shared.monitor, gloo));
  ctx.comms = comms.get();

  // This device's part of tensor parallelism: its coordinate on the model axis, and the
  // all-reduce the model's layer pairs need.
  TensorParallelism tp;
  if (absl::StatusOr<int> axis = mesh.AxisIndex(kModelAxis); axis.ok()) {
    tp.axis_size = mesh.shape()[*axis];
    tp.index = ctx.coords[*axis];
    SUBSTRAX_ASSIGN_OR_RETURN(Communicator * model_comm, comms->Axis(kModelAxis));
    tp.all_reduce_sum = [model_comm](absl::Span<float> values) {
      return Annotate(model_comm->AllReduce(values, ReduceOp::kSum), "tensor-parallel all-reduce");
    };
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<Model> model_ptr,
                            Model::Create(spec.model(), shared.num_features, tp));
  const Model& model = *model_ptr;
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> optimizer,
                            Optimizer::Create(spec.optimizer()));
  // Each device initialises only its shards; each equals the slice of the full initialisation.
  TensorTree params = model.Init(spec.seed());

  const int64_t global_batch = spec.batch().global_batch_size();
  SUBSTRAX_ASSIGN_OR_RETURN(IndexRange rows, BatchRows(mesh, device_id, global_batch));
  int64_t next_step = 0;
  Producer<Batch> produce = [&]() -> absl::StatusOr<std::optional<Batch>> {
    if (next_step >= shared.total_steps) return std::optional<Batch>();
    const std::vector<int64_t> global = shared.sampler->GlobalBatch(next_step++);
    return std::optional<Batch>(Gather(
        shared.train, absl::MakeConstSpan(global).subspan(rows.start, rows.limit - rows.start)));
  };
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<Prefetcher<Batch>> batches,
                            PrefetchToDevice(std::move(produce), spec.data().prefetch_size()));

  std::map<std::string, ReduceOp> reductions;
  for (const auto& [name, reduction] : spec.metrics()) {
    SUBSTRAX_ASSIGN_OR_RETURN(reductions[name], ReduceOpFromProto(reduction));
  }
  const bool reporter = mesh.Ravel(ctx.coords) == 0;
  TrainResult result;
  Timing timing;
  double loss_sum = 0, accuracy_sum = 0;
  int64_t interval_steps = 0;
  absl::Time interval_start = absl::Now();
  const absl::Time start = interval_start;

  for (int64_t step = 0; step < shared.total_steps; ++step) {
    absl::Time t = absl::Now();
    SUBSTRAX_ASSIGN_OR_RETURN(std::optional<Batch> batch, batches->Next());
    if (!batch.has_value()) {
      return absl::InternalError(absl::StrCat("input ended after ", step, " of ",
                                              shared.total_steps, " steps"));
    }
    timing.data += absl::ToDoubleSeconds(absl::Now() - t);
    absl::StatusOr<StepResult> r =
        options.explicit_collectives
            ? CollectiveTrainStep(ctx, model, *optimizer, &params, *batch)
            : SpmdTrainStep(ctx, model, *optimizer, &params, *batch);
    if (!r.ok()) return Annotate(r.status(), absl::StrCat("step ", step + 1));
    timing.compute += r->compute_seconds;
    timing.collective += r->collective_seconds;
    loss_sum += r->loss;
    accuracy_sum += r->accuracy;
    ++interval_steps;

    const bool last = step + 1 == shared.total_steps;
    if ((step + 1) % spec.report_every_steps() != 0 && !last) continue;
    // Metrics of the interval on this device, then reduced as the spec declares.
    Metrics local;
    for (const auto& [name, op] : reductions) {
      if (name == "loss") local[name] = loss_sum / interval_steps;
      if (name == "accuracy") local[name] = accuracy_sum / interval_steps;
      if (name == "step") local[name] = static_cast<double>(step + 1);
    }
    const double wall = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - interval_start));
    if (options.on_device_report) {
      DeviceReport report;
      report.device_id = device_id;
      report.step = step + 1;
      report.values = local;
      report.samples_per_second = static_cast<double>((rows.limit - rows.start) * interval_steps) / wall;
      report.data_wait_seconds = timing.data;
      report.compute_seconds = timing.compute;
      report.collective_seconds = timing.collective;
      options.on_device_report(report);
    }
    SUBSTRAX_ASSIGN_OR_RETURN(Metrics reduced, ReduceCustom(ctx, local, reductions));
    // The slowest device's fractions: the max over devices of each.
    Metrics fractions = {{"collective", timing.collective / wall},
                         {"compute", timing.compute / wall},
                         {"data", timing.data / wall}};
    SUBSTRAX_ASSIGN_OR_RETURN(
        Metrics slowest,
        ReduceCustom(ctx, fractions,
                     std::map<std::string, ReduceOp>{{"collective", ReduceOp::kMax},
                                                     {"compute", ReduceOp::kMax},
                                                     {"data", ReduceOp::kMax}}));
    if (reporter && options.on_progress) {
      ProgressReport report =
          MakeProgressReport(shared, step + 1, reduced, global_batch, interval_steps,
                             absl::Seconds(wall), absl::Now() - start);
      report.data_wait_fraction = slowest["data"];
      report.compute_fraction = slowest["compute"];
      report.collective_fraction = slowest["collective"];
      options.on_progress(report);
    }
    result.final_metrics = reduced;
    loss_sum = accuracy_sum = 0;
    interval_steps = 0;
    timing = Timing();
    interval_start = absl::Now();
  }
  result.steps = shared.total_steps;
  const Dataset& eval_data = shared.test.has_value() ? *shared.test : shared.train;
  SUBSTRAX_ASSIGN_OR_RETURN(
      result.evaluation,
      Evaluate(ctx, model, params, eval_data, shared.test.has_value() ? "test" : "train"));
  // Full-shape parameters: gathered over the axes they are split on.
  SUBSTRAX_ASSIGN_OR_RETURN(result.params, AllGatherState(ctx, params, PartitionSpecs(model)));
  return result;
}

}  // namespace

absl::StatusOr<TrainingData> LoadTrainingData(const v1::JobSpec& spec) {
  TrainingData data;
  const bool classification = IsClassification(spec.model().type());
  SUBSTRAX_ASSIGN_OR_RETURN(data.train,
                            LoadSplit(spec.data(), /*test_split=*/false, spec.seed(), classification));
  const bool has_test = spec.data().has_test() ||
                        (spec.data().format() == v1::DATA_FORMAT_SYNTHETIC &&
                         spec.data().synthetic().num_test_examples() > 0);
  if (has_test) {
    SUBSTRAX_ASSIGN_OR_RETURN(data.test,
                              LoadSplit(spec.data(), /*test_split=*/true, spec.seed(), classification));
  }
  if (classification && data.train.num_classes > spec.model().num_classes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.model.num_classes: the training data has labels up to ",
        data.train.num_classes - 1, ", more than the ", spec.model().num_classes(),
        " classes the model has"));
  }
  data.num_features = data.train.num_features();
  // Fail before any device starts if the model cannot be built at all.
  SUBSTRAX_RETURN_IF_ERROR(Model::Create(spec.model(), data.num_features).status());
  SUBSTRAX_ASSIGN_OR_RETURN(
      BatchSampler sampler,
      BatchSampler::Create(data.train.num_examples(), spec.batch().global_batch_size(),
                           spec.seed(), spec.data().shuffle()));
  data.sampler = std::make_shared<BatchSampler>(std::move(sampler));
  data.total_steps = spec.length_case() == v1::JobSpec::kSteps
                         ? spec.steps()
                         : spec.epochs() * data.sampler->steps_per_epoch();
  return data;
}

std::vector<int> LocalDeviceIds(const TrainerOptions& options) {
  std::vector<int> local;
  for (int64_t i = 0; i < options.mesh.size(); ++i) {
    if (options.process_of_position[i] == options.process_index) {
      local.push_back(options.mesh.devices()[i].id);
    }
  }
  return local;
}

absl::StatusOr<std::unique_ptr<PeerMonitor>> StartPeerMonitor(const TrainerOptions& options) {
  int num_processes = 0;
  for (int p : options.process_of_position) num_processes = std::max(num_processes, p + 1);
  if (num_processes <= 1) return std::unique_ptr<PeerMonitor>();
  PeerMonitor::Options monitor_options;
  monitor_options.process_index = options.process_index;
  monitor_options.num_processes = num_processes;
  monitor_options.listen_host = options.listen_host;
  monitor_options.connect_timeout = options.connect_timeout;
  return PeerMonitor::Start(monitor_options, options.store);
}

ProgressReport MakeProgressReport(const TrainingData& data, int64_t steps_done, Metrics metrics,
                                  int64_t global_batch, int64_t interval_steps,
                                  absl::Duration interval, absl::Duration elapsed) {
  const int64_t steps_per_epoch = std::max<int64_t>(1, data.sampler->steps_per_epoch());
  ProgressReport report;
  report.step = steps_done;
  report.total_steps = data.total_steps;
  report.epoch = (steps_done - 1) / steps_per_epoch + 1;
  report.total_epochs = (data.total_steps + steps_per_epoch - 1) / steps_per_epoch;
  report.metrics = std::move(metrics);
  report.samples_per_second = static_cast<double>(global_batch * interval_steps) /
                              std::max(1e-9, absl::ToDoubleSeconds(interval));
  report.elapsed = elapsed;
  return report;
}

absl::StatusOr<TrainResult> Train(const TrainerOptions& options) {
  const v1::JobSpec& spec = options.spec;
  SUBSTRAX_RETURN_IF_ERROR(ValidateJobSpec(spec));
  const Mesh& mesh = options.mesh;
  if (spec.has_checkpoint()) {
    return absl::UnimplementedError(
        "spec.checkpoint: checkpoints are not implemented yet; remove the checkpoint section");
  }
  // The device kind decides the backend; a spec that asks for another one is refused.
  const bool cuda_devices = mesh.devices().front().kind == DeviceKind::kCuda;
  if (spec.backend() == v1::BACKEND_CUDA && !cuda_devices) {
    return absl::FailedPreconditionError(
        "spec.backend is cuda but the job's devices are CPU devices; run it on CUDA workers "
        "(substrax-worker daemon --devices cuda) or use backend auto or cpu");
  }
  if (spec.backend() == v1::BACKEND_CPU && cuda_devices) {
    return absl::FailedPreconditionError(
        "spec.backend is cpu but the job's devices are CUDA devices");
  }

  if (static_cast<int64_t>(options.process_of_position.size()) != mesh.size()) {
    return absl::InvalidArgumentError(absl::StrCat("process table has ",
                                                   options.process_of_position.size(),
                                                   " entries for a mesh of ", mesh.size()));
  }
  if (options.store == nullptr) return absl::InvalidArgumentError("no rendezvous store");
  const std::vector<int> local_devices = LocalDeviceIds(options);
  if (local_devices.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("process ", options.process_index,
                                                   " drives no device of mesh ",
                                                   mesh.ShapeString()));
  }

  Shared shared;
  shared.options = &options;
  SUBSTRAX_ASSIGN_OR_RETURN(static_cast<TrainingData&>(shared), LoadTrainingData(spec));
  if (cuda_devices) return TrainOnCuda(options, shared);

  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<PeerMonitor> monitor, StartPeerMonitor(options));
  shared.monitor = monitor.get();

  std::vector<absl::StatusOr<TrainResult>> results(local_devices.size(),
                                                   absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < local_devices.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = RunDevice(shared, local_devices[i]); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      const Device& d = mesh.DeviceAt(*mesh.CoordinatesOf(local_devices[i]));
      return Annotate(results[i].status(), absl::StrCat(d.ToString(), ", process ",
                                                        options.process_index));
    }
  }
  return std::move(results[0]);
}

}  // namespace substrax
