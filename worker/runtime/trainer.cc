#include "worker/runtime/trainer.h"

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/data_paths.h"
#include "core/job_spec.h"
#include "core/model_catalog.h"
#include "core/sharding.h"
#include "core/status.h"
#include "worker/compute/model.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/runtime/cpu_backend.h"
#include "worker/runtime/cuda_backend.h"
#include "substrax/spmd.h"
#include "worker/runtime/step_loop.h"

namespace substrax {
namespace {

// The rows of a global batch this device processes: its block of the batch dimension as the
// data-parallel sharding lays it out (the whole batch on a mesh without a data axis; devices
// along the model axis share their rows).
absl::StatusOr<IndexRange> BatchRows(const Mesh& mesh, int device_id, int64_t global_batch) {
  if (!mesh.HasAxis(kDataAxis)) return IndexRange{0, global_batch};
  SUBSTRAX_ASSIGN_OR_RETURN(NamedSharding sharding, CreateDataParallelSharding(mesh));
  SUBSTRAX_ASSIGN_OR_RETURN(ShardLayout layout, sharding.Layout({global_batch}));
  SUBSTRAX_ASSIGN_OR_RETURN(ShardSlice shard, layout.ForDevice(device_id));
  return shard.index[0];
}

// Whether this process may run a reduction thread beside its device threads without taking a
// core from them: overlap's default. On a host whose cores all compute (2 devices on 2 cores)
// the thread competes with the backward pass, and the step got about 10% slower
// (docs/performance.md).
bool HasCoresToSpare(size_t device_threads) {
  return AllowedCpus().size() > device_threads;
}

// Whether the step loops reduce each bucket during the backward pass (spec.gradients.overlap).
bool OverlapGradients(const TrainerOptions& options) {
  const v1::GradientsSpec& g = options.spec.gradients();
  if (g.has_overlap()) return g.overlap();
  // Left out: off under a sharded update, which reduces after the pass.
  return !g.shard_update() && HasCoresToSpare(LocalDeviceIds(options).size());
}

// The sharded update's group of this process's devices (spec.gradients.shard_update: true), or
// null where each device updates all of its parameters. Errors: FAILED_PRECONDITION where the
// update cannot be sharded, saying why.
absl::StatusOr<std::shared_ptr<ShardedUpdateGroup>> ShardUpdate(const TrainerOptions& options,
                                                               size_t local_devices) {
  if (!options.spec.gradients().shard_update()) return nullptr;
  const Mesh& mesh = options.mesh;
  std::string why_not;
  if (mesh.devices().front().kind != DeviceKind::kCpu) {
    why_not = "the job's devices are not CPU devices";
  } else if (mesh.axis_names() != std::vector<std::string>{std::string(kDataAxis)}) {
    why_not = absl::StrCat("the mesh ", mesh.ShapeString(), " has axes besides '", kDataAxis, "'");
  } else if (static_cast<int64_t>(local_devices) != mesh.size()) {
    why_not = absl::StrCat("this process drives ", local_devices, " of the mesh's ", mesh.size(),
                           " devices, and the update is sharded within one process");
  } else if (options.explicit_collectives) {
    why_not = "the job reduces gradients with explicit collectives";
  }
  // (overlap: true with it is refused by validation; left out, overlap is off with it.)
  if (!why_not.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.gradients.shard_update is true, but ", why_not, "; remove shard_update"));
  }
  return MakeShardedUpdateGroup(static_cast<int>(mesh.size()));
}

// The spec against the devices and the checkpoint roots. Errors: as Train's.
absl::Status CheckSpecForDevices(const TrainerOptions& options) {
  const v1::JobSpec& spec = options.spec;
  SUBSTRAX_RETURN_IF_ERROR(ValidateJobSpec(spec));
  // The device kind decides the backend; a spec that asks for another one is refused.
  const bool cuda_devices = options.mesh.devices().front().kind == DeviceKind::kCuda;
  if ((spec.has_checkpoint() || !spec.resume_from().empty()) && cuda_devices) {
    return absl::UnimplementedError(
        "spec.checkpoint: checkpoints are not implemented on CUDA devices yet (they run on CPU "
        "devices); remove the checkpoint section and resume_from, or run on CPU workers");
  }
  for (const auto& [field, dir] : CheckpointRootPaths(spec)) {
    SUBSTRAX_RETURN_IF_ERROR(CheckCheckpointDirectory(field, dir, options.checkpoint_roots));
  }
  if (spec.backend() == v1::BACKEND_CUDA && !cuda_devices) {
    return absl::FailedPreconditionError(
        "spec.backend is cuda but the job's devices are CPU devices; run it on CUDA workers "
        "(substrax-agent --devices cuda) or use backend auto or cpu");
  }
  if (spec.backend() == v1::BACKEND_CPU && cuda_devices) {
    return absl::FailedPreconditionError(
        "spec.backend is cpu but the job's devices are CUDA devices");
  }
  // Validation refused tf32/bf16 with backend cpu; with backend auto it is decided here.
  if (!cuda_devices && spec.precision() != v1::PRECISION_FP32 &&
      spec.precision() != v1::PRECISION_UNSPECIFIED) {
    return absl::FailedPreconditionError(absl::StrCat(
        "spec.precision is ", PrecisionName(spec.precision()),
        " but the job's devices are CPU devices, which compute in fp32 only; run it on CUDA "
        "workers (substrax-agent --devices cuda) or use precision fp32"));
  }
  return absl::OkStatus();
}

// How long processes other than 0 wait for process 0 to choose the checkpoint to resume from.
constexpr absl::Duration kResumeTimeout = absl::Minutes(10);

}  // namespace

absl::StatusOr<TrainingData> LoadTrainingData(const v1::JobSpec& spec, const DataAccess& access) {
  TrainingData data;
  const bool classification = IsClassification(spec.model().type());
  SUBSTRAX_ASSIGN_OR_RETURN(data.train,
                            LoadSplit(spec.data(), /*test_split=*/false, spec.seed(), classification,
                                      access));
  const bool has_test = spec.data().has_test() ||
                        (spec.data().format() == v1::DATA_FORMAT_SYNTHETIC &&
                         spec.data().synthetic().num_test_examples() > 0);
  if (has_test) {
    SUBSTRAX_ASSIGN_OR_RETURN(data.test,
                              LoadSplit(spec.data(), /*test_split=*/true, spec.seed(), classification,
                                        access));
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
  return LocalDeviceIds(options.mesh, options.process_of_position, options.process_index);
}

absl::StatusOr<std::unique_ptr<TrainingProcess>> TrainingProcess::Prepare(TrainerOptions options) {
  SUBSTRAX_RETURN_IF_ERROR(CheckSpecForDevices(options));
  const Mesh& mesh = options.mesh;
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
  SUBSTRAX_ASSIGN_OR_RETURN(std::shared_ptr<ShardedUpdateGroup> sharded_update,
                            ShardUpdate(options, local_devices.size()));
  SUBSTRAX_ASSIGN_OR_RETURN(TrainingData data,
                            LoadTrainingData(options.spec, options.data_access));
  std::unique_ptr<TrainingProcess> process(
      new TrainingProcess(std::move(options), std::move(data)));
  process->local_devices_ = local_devices;
  process->sharded_update_ = std::move(sharded_update);
  const v1::JobSpec& spec = process->options_.spec;
  if (spec.has_checkpoint() || !spec.resume_from().empty()) {
    SUBSTRAX_RETURN_IF_ERROR(process->StartCheckpoints());
  }
  if (process->sharded_update_ != nullptr) {
    std::cerr << "optimizer update sharded between the " << local_devices.size()
              << " devices (spec.gradients.shard_update)\n";
  }
  return process;
}

// Where this attempt resumes from (told to on_resume), and the writer of its checkpoints.
absl::Status TrainingProcess::StartCheckpoints() {
  const v1::JobSpec& spec = options_.spec;
  SUBSTRAX_ASSIGN_OR_RETURN(
      resume_,
      // Process 0 reads every shard file of the checkpoints it checks: the others may wait
      // longer than for a connection.
      FindResumePoint(spec.checkpoint().directory(), spec.resume_from(), options_.process_index,
                      options_.store, std::max(options_.connect_timeout, kResumeTimeout)));
  if (options_.process_index == 0 && options_.on_resume) options_.on_resume(resume_->report);
  const int64_t first_step = resume_->reader.has_value() ? resume_->report.step() : 0;
  if (first_step > data_.total_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint in ", resume_->report.path(), " is of step ", first_step,
        ", beyond this job's ", data_.total_steps, " steps"));
  }
  if (!spec.has_checkpoint()) return absl::OkStatus();
  CheckpointerOptions writer;
  writer.directory = spec.checkpoint().directory();
  writer.keep_last = spec.checkpoint().keep_last();
  writer.job_id = options_.job_id;
  writer.mesh = &options_.mesh;
  writer.process_index = options_.process_index;
  writer.num_processes = NumProcesses(options_.process_of_position);
  writer.local_devices = local_devices_;
  SUBSTRAX_ASSIGN_OR_RETURN(writer.params,
                            ModelParams(spec.model(), data_.num_features, ModelAxisSize(spec)));
  writer.store = options_.store;
  if (options_.process_index == 0) writer.on_commit = options_.on_checkpoint;
  checkpoints_ = std::make_unique<Checkpointer>(std::move(writer));
  return absl::OkStatus();
}

LocalDeviceOptions TrainingProcess::local_device_options() const {
  LocalDeviceOptions local;
  local.pin_device_threads = options_.pin_device_threads;
  local.checkpoints = checkpoints_.get();
  return local;
}

ConnectionOptions TrainingProcess::connections() const {
  ConnectionOptions connections;
  connections.mesh = &options_.mesh;
  connections.process_of_position = &options_.process_of_position;
  connections.process_index = options_.process_index;
  connections.store = options_.store;
  connections.listen_host = options_.listen_host;
  connections.collective_timeout = options_.collective_timeout;
  connections.connect_timeout = options_.connect_timeout;
  connections.cpu_collectives = options_.cpu_collectives;
  return connections;
}

absl::Status TrainingProcess::RunDevice(DeviceContext& ctx) {
  const v1::JobSpec& spec = options_.spec;
  const Mesh& mesh = options_.mesh;
  const int device_id = ctx.device.id;
  BackendSetup setup;
  setup.spec = &spec;
  setup.num_features = data_.num_features;
  setup.local_index = ctx.device.local_index;
  if (absl::StatusOr<int> axis = mesh.AxisIndex(kModelAxis); axis.ok()) {
    SUBSTRAX_ASSIGN_OR_RETURN(setup.model_axis, ctx.comms->Axis(kModelAxis));
    setup.model_index = ctx.coords[*axis];
  }
  SUBSTRAX_ASSIGN_OR_RETURN(IndexRange rows,
                            BatchRows(mesh, device_id, spec.batch().global_batch_size()));
  // A resumed run reads on from the checkpoint's step: the order of examples is a function of
  // the seed and the step alone (sampler.h), so it sees the batches an uninterrupted run would.
  const int64_t first_step =
      resume_.has_value() && resume_->reader.has_value() ? resume_->report.step() : 0;
  auto next_step = std::make_shared<int64_t>(first_step);
  setup.batches = [this, rows, next_step]() -> absl::StatusOr<std::optional<Batch>> {
    if (*next_step >= data_.total_steps) return std::optional<Batch>();
    const std::vector<int64_t> global = data_.sampler->GlobalBatch((*next_step)++);
    return std::optional<Batch>(Gather(
        data_.train, absl::MakeConstSpan(global).subspan(rows.start, rows.limit - rows.start)));
  };
  // The sharded update's mesh has a data axis alone: the device's coordinate is its rank on it.
  const CpuShardedUpdate sharded{sharded_update_, static_cast<int>(ctx.coords[0])};
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBackend> backend,
                            ctx.device.kind == DeviceKind::kCuda
                                ? CreateCudaBackend(std::move(setup))
                                : CreateCpuBackend(std::move(setup), sharded));
  if (first_step > 0) {
    absl::MutexLock lock(&reader_mu_);
    SUBSTRAX_RETURN_IF_ERROR(
        Annotate(RestoreDevice(*resume_->reader, first_step, mesh, device_id, *backend),
                 absl::StrCat("resuming from the checkpoint of step ", first_step)));
  }

  StepLoopOptions loop;
  loop.first_step = first_step;
  if (Checkpointer* writer = checkpoints_.get(); writer != nullptr) {
    loop.save = [writer, device_id](int64_t steps_done, DeviceBackend& b) -> absl::Status {
      SUBSTRAX_ASSIGN_OR_RETURN(TensorTree state, b.SaveState());
      return writer->Submit(device_id, steps_done, std::move(state));
    };
    loop.save_every_steps = spec.checkpoint().every_steps();
    loop.save_every = absl::Seconds(spec.checkpoint().every_seconds());
    loop.save_at_end = CheckpointAtEnd(spec);
  }
  loop.spec = &spec;
  loop.mesh = &mesh;
  loop.device_id = device_id;
  loop.comms = ctx.comms;
  loop.total_steps = data_.total_steps;
  loop.steps_per_epoch = data_.sampler->steps_per_epoch();
  loop.eval = data_.test.has_value() ? &*data_.test : &data_.train;
  loop.eval_prefix = data_.test.has_value() ? "test" : "train";
  loop.explicit_collectives = options_.explicit_collectives;
  loop.gradients.bucket_bytes = spec.gradients().bucket_bytes() > 0
                                    ? spec.gradients().bucket_bytes()
                                    : kDefaultGradientBucketBytes;
  loop.overlap_gradients = OverlapGradients(options_);
  loop.force_single_replica_collectives = options_.force_single_replica_collectives;
  loop.on_progress = options_.on_progress;
  loop.stop_requested = options_.stop_requested;
  if (options_.on_device_report) {
    loop.on_device_report = [this](DeviceReport report) {
      report.input_features = data_.num_features;
      options_.on_device_report(report);
    };
  }
  SUBSTRAX_ASSIGN_OR_RETURN(TrainResult result, RunStepLoop(loop, *backend));
  absl::MutexLock lock(&mu_);
  results_[device_id] = std::move(result);
  return absl::OkStatus();
}

absl::StatusOr<TrainResult> TrainingProcess::Result() {
  absl::MutexLock lock(&mu_);
  auto first = results_.find(local_devices_.front());
  if (first == results_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", local_devices_.front(), " of process ", options_.process_index,
                     " has not trained"));
  }
  return first->second;
}

absl::StatusOr<TrainResult> Train(const TrainerOptions& options) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<TrainingProcess> process,
                            TrainingProcess::Prepare(options));
  SUBSTRAX_RETURN_IF_ERROR(
      RunOnLocalDevices(process->connections(), process->local_device_options(),
                        [&process](DeviceContext& ctx) { return process->RunDevice(ctx); }));
  return process->Result();
}

}  // namespace substrax
