#include "worker/runtime/cuda_trainer.h"

#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/sharding.h"
#include "core/status.h"
#include "absl/synchronization/notification.h"
#include "worker/collectives/nccl_communicator.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/gpu/cuda_device.h"
#include "worker/gpu/cuda_model.h"
#include "worker/gpu/cuda_prefetch.h"
#include "worker/runtime/spmd.h"

namespace substrax {
namespace {

// Sums `values` over `comm` (host values; nothing to do without one).
absl::Status SumOverWorld(NcclCommunicator* comm, std::vector<double>* values) {
  if (comm == nullptr) return absl::OkStatus();
  return comm->AllReduce(absl::MakeSpan(*values), ReduceOp::kSum);
}

// Tells the device's communicators when a peer process dies, so that their watchdogs abort at
// once instead of waiting for the collective timeout. Stops when destroyed.
class DeathForwarder {
 public:
  DeathForwarder(const PeerMonitor* monitor, std::vector<NcclCommunicator*> comms) {
    if (monitor == nullptr) return;
    thread_ = std::thread([this, monitor, comms = std::move(comms)] {
      while (!done_.HasBeenNotified()) {
        if (!monitor->AwaitDeath(absl::Milliseconds(100))) continue;
        const PeerMonitor::Death death = monitor->Deaths().front();
        const std::string who =
            absl::StrCat("process ", death.process_index, " died: ", death.reason);
        for (NcclCommunicator* comm : comms) {
          if (comm != nullptr) comm->PeerDied(who);
        }
        return;
      }
    });
  }
  ~DeathForwarder() {
    done_.Notify();
    if (thread_.joinable()) thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

absl::StatusOr<TrainResult> RunCudaDevice(const TrainerOptions& options, const TrainingData& data,
                                          const PeerMonitor* monitor, int device_id) {
  const v1::JobSpec& spec = options.spec;
  const Mesh& mesh = options.mesh;
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int64_t> coords, mesh.CoordinatesOf(device_id));
  const Device& me = mesh.DeviceAt(coords);
  const int64_t position = mesh.Ravel(coords);
  const int64_t world_size = mesh.size();

  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaDevice> device, CudaDevice::Create(me.local_index));
  // NCCL communicators: the world, and one per mesh axis split from it (every rank splits in the
  // same order: data, then model). A 1-D mesh's only axis is the world.
  std::unique_ptr<NcclCommunicator> world, data_split, model_split;
  PrefixStore nccl_store(options.store, "nccl/world");
  if (world_size > 1) {
    NcclCommunicatorOptions nccl;
    nccl.name = "world";
    nccl.device = me.local_index;
    nccl.self = me.ToString();
    nccl.timeout = options.collective_timeout;
    nccl.connect_timeout = options.connect_timeout;
    SUBSTRAX_ASSIGN_OR_RETURN(world, NcclCommunicator::Create(nccl, &nccl_store,
                                                              static_cast<int>(position),
                                                              static_cast<int>(world_size)));
  }
  const absl::StatusOr<int> data_axis = mesh.AxisIndex(kDataAxis);
  const absl::StatusOr<int> model_axis = mesh.AxisIndex(kModelAxis);
  if (world != nullptr && mesh.ndim() == 2) {
    SUBSTRAX_ASSIGN_OR_RETURN(data_split, world->Split(static_cast<int>(coords[*model_axis]),
                                                       static_cast<int>(coords[*data_axis]),
                                                       "axis 'data'"));
    SUBSTRAX_ASSIGN_OR_RETURN(model_split, world->Split(static_cast<int>(coords[*data_axis]),
                                                        static_cast<int>(coords[*model_axis]),
                                                        "axis 'model'"));
  }
  auto axis_comm = [&](const absl::StatusOr<int>& axis,
                       const std::unique_ptr<NcclCommunicator>& split) -> NcclCommunicator* {
    if (!axis.ok() || mesh.shape()[*axis] == 1) return nullptr;
    return split != nullptr ? split.get() : world.get();
  };
  NcclCommunicator* data_comm = axis_comm(data_axis, data_split);
  NcclCommunicator* model_comm = axis_comm(model_axis, model_split);
  DeathForwarder deaths(monitor, {world.get(), data_split.get(), model_split.get()});

  CudaTensorParallelism tp;
  if (model_comm != nullptr) {
    tp.axis_size = mesh.shape()[*model_axis];
    tp.index = coords[*model_axis];
    tp.all_reduce_sum = [model_comm, stream = device->stream()](float* values, int64_t count) {
      return Annotate(model_comm->AllReduceDevice(values, static_cast<size_t>(count),
                                                  ReduceOp::kSum, stream),
                      "tensor-parallel all-reduce");
    };
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaModel> model,
                            CudaModel::Create(spec.model(), data.num_features, device.get(), tp));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaOptimizer> optimizer,
                            CudaOptimizer::Create(spec.optimizer(), device.get()));
  SUBSTRAX_ASSIGN_OR_RETURN(DeviceTree params, model->Init(spec.seed()));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaMetrics> metrics, CudaMetrics::Create(*device));

  // This device's rows of every global batch: its block on the data axis (all of it on a mesh
  // without one; devices along the model axis share their rows).
  const int64_t global_batch = spec.batch().global_batch_size();
  IndexRange rows{0, global_batch};
  if (data_axis.ok()) {
    SUBSTRAX_ASSIGN_OR_RETURN(NamedSharding sharding, CreateDataParallelSharding(mesh));
    SUBSTRAX_ASSIGN_OR_RETURN(ShardLayout layout, sharding.Layout({global_batch}));
    SUBSTRAX_ASSIGN_OR_RETURN(ShardSlice shard, layout.ForDevice(device_id));
    rows = shard.index[0];
  }
  int64_t next_step = 0;
  Producer<Batch> produce = [&]() -> absl::StatusOr<std::optional<Batch>> {
    if (next_step >= data.total_steps) return std::optional<Batch>();
    const std::vector<int64_t> indices = data.sampler->GlobalBatch(next_step++);
    return std::optional<Batch>(Gather(
        data.train, absl::MakeConstSpan(indices).subspan(rows.start, rows.limit - rows.start)));
  };
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::unique_ptr<CudaPrefetcher> batches,
      CudaPrefetcher::Create(device.get(), std::move(produce), spec.data().prefetch_size()));

  TrainResult result;
  DeviceTree grads;
  absl::Time interval_start = absl::Now();
  const absl::Time start = interval_start;
  int64_t interval_steps = 0;
  for (int64_t step = 0; step < data.total_steps; ++step) {
    SUBSTRAX_ASSIGN_OR_RETURN(std::optional<DeviceBatchView> batch, batches->Next());
    if (!batch.has_value()) {
      return absl::InternalError(absl::StrCat("input ended after ", step, " steps"));
    }
    SUBSTRAX_RETURN_IF_ERROR(model->LossAndGradients(params, *batch, &grads, metrics.get()));
    // The reduction the shardings imply: a parameter split over the model axis is averaged
    // over the data axis only; a replicated one over every device.
    for (const ParamSpec& p : model->params()) {
      NcclCommunicator* comm = p.partition == PartitionSpec() ? world.get() : data_comm;
      if (comm == nullptr) continue;
      DeviceTensor& grad = grads.at(p.name);
      SUBSTRAX_RETURN_IF_ERROR(Annotate(
          comm->AllReduceDevice(grad.data(), grad.size(), ReduceOp::kMean, device->stream()),
          absl::StrCat("gradient all-reduce of ", p.name)));
    }
    SUBSTRAX_RETURN_IF_ERROR(optimizer->Update(grads, &params));
    ++interval_steps;
    const bool last = step + 1 == data.total_steps;
    if ((step + 1) % spec.report_every_steps() != 0 && !last) continue;

    SUBSTRAX_ASSIGN_OR_RETURN(EvalResult local, metrics->Read());
    SUBSTRAX_RETURN_IF_ERROR(metrics->Reset());
    const double wall = std::max(1e-9, absl::ToDoubleSeconds(absl::Now() - interval_start));
    Metrics mine;
    const double count = std::max<int64_t>(1, local.count);
    for (const auto& [name, reduction] : spec.metrics()) {
      if (name == "loss") mine[name] = local.loss_sum / count;
      if (name == "accuracy") mine[name] = static_cast<double>(local.correct) / count;
      if (name == "step") mine[name] = static_cast<double>(step + 1);
    }
    if (options.on_device_report) {
      DeviceReport report;
      report.device_id = device_id;
      report.step = step + 1;
      report.values = mine;
      report.samples_per_second = static_cast<double>(local.count) / wall;
      report.compute_seconds = wall;
      options.on_device_report(report);
    }
    // Mean over devices of loss and accuracy (equal batches), for the progress line.
    std::vector<double> sums = {local.loss_sum, static_cast<double>(local.correct),
                                static_cast<double>(local.count)};
    SUBSTRAX_RETURN_IF_ERROR(Annotate(SumOverWorld(world.get(), &sums), "metric reduction"));
    Metrics reduced;
    for (const auto& [name, value] : mine) {
      if (name == "loss") reduced[name] = sums[0] / std::max(1.0, sums[2]);
      if (name == "accuracy") reduced[name] = sums[1] / std::max(1.0, sums[2]);
      if (name == "step") reduced[name] = value;
    }
    if (position == 0 && options.on_progress) {
      ProgressReport report =
          MakeProgressReport(data, step + 1, reduced, global_batch, interval_steps,
                             absl::Seconds(wall), absl::Now() - start);
      report.compute_fraction = 1;
      options.on_progress(report);
    }
    result.final_metrics = reduced;
    interval_steps = 0;
    interval_start = absl::Now();
  }
  result.steps = data.total_steps;

  // Evaluation: each data-axis shard its share of the split (devices along the model axis
  // evaluate the same share together), sums added over the data axis.
  const Dataset& eval = data.test.has_value() ? *data.test : data.train;
  const int64_t n = eval.num_examples();
  const int64_t shards = data_axis.ok() ? mesh.shape()[*data_axis] : 1;
  const int64_t shard_index = data_axis.ok() ? coords[*data_axis] : 0;
  int64_t next = n * shard_index / shards;
  const int64_t end = n * (shard_index + 1) / shards;
  constexpr int64_t kChunk = 1024;
  Producer<Batch> chunks = [&]() -> absl::StatusOr<std::optional<Batch>> {
    if (next >= end) return std::optional<Batch>();
    std::vector<int64_t> rows_now;
    for (int64_t i = next; i < std::min(end, next + kChunk); ++i) rows_now.push_back(i);
    next += kChunk;
    return std::optional<Batch>(Gather(eval, rows_now));
  };
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<CudaPrefetcher> eval_batches,
                            CudaPrefetcher::Create(device.get(), std::move(chunks), 2));
  while (true) {
    SUBSTRAX_ASSIGN_OR_RETURN(std::optional<DeviceBatchView> batch, eval_batches->Next());
    if (!batch.has_value()) break;
    SUBSTRAX_RETURN_IF_ERROR(model->Evaluate(params, *batch, metrics.get()));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(EvalResult evaluated, metrics->Read());
  std::vector<double> sums = {evaluated.loss_sum, static_cast<double>(evaluated.correct),
                              static_cast<double>(evaluated.count)};
  SUBSTRAX_RETURN_IF_ERROR(Annotate(SumOverWorld(data_comm, &sums), "evaluation"));
  const std::string prefix = data.test.has_value() ? "test" : "train";
  if (sums[2] > 0) {
    result.evaluation[prefix + "_loss"] = sums[0] / sums[2];
    if (model->is_classification()) result.evaluation[prefix + "_accuracy"] = sums[1] / sums[2];
  }
  // Full-shape parameters: this device's shards, gathered over the model axis.
  SUBSTRAX_ASSIGN_OR_RETURN(TensorTree local, device->Download(params));
  std::map<std::string, PartitionSpec> specs;
  for (const ParamSpec& p : model->params()) specs[p.name] = p.partition;
  SUBSTRAX_ASSIGN_OR_RETURN(
      result.params,
      AllGatherState(local, specs,
                     [&](const Tensor& t, const std::string&) -> absl::StatusOr<Tensor> {
                       if (model_comm == nullptr) return t;
                       std::vector<int64_t> shape = {model_comm->size()};
                       shape.insert(shape.end(), t.shape().begin(), t.shape().end());
                       Tensor stacked(shape);
                       SUBSTRAX_RETURN_IF_ERROR(model_comm->AllGather(t.span(), stacked.span()));
                       return stacked;
                     }));
  return result;
}

}  // namespace

absl::StatusOr<TrainResult> TrainOnCuda(const TrainerOptions& options, const TrainingData& data) {
  const Mesh& mesh = options.mesh;
  const std::vector<int> local = LocalDeviceIds(options);
  // Liveness of the other processes (as on CPU): a death aborts the NCCL communicators at once.
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<PeerMonitor> monitor, StartPeerMonitor(options));
  std::vector<absl::StatusOr<TrainResult>> results(local.size(), absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < local.size(); ++i) {
    threads.emplace_back(
        [&, i] { results[i] = RunCudaDevice(options, data, monitor.get(), local[i]); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      const Device& d = mesh.DeviceAt(*mesh.CoordinatesOf(local[i]));
      return Annotate(results[i].status(),
                      absl::StrCat(d.ToString(), ", process ", options.process_index));
    }
  }
  return std::move(results[0]);
}

}  // namespace substrax
