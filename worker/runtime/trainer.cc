#include "worker/runtime/trainer.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "core/data_paths.h"
#include "core/job_spec.h"
#include "core/model_catalog.h"
#include "core/sharding.h"
#include "core/status.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/compute/model.h"
#include "worker/compute/optimizer.h"
#include "worker/data/dataset.h"
#include "worker/data/prefetch.h"
#include "worker/data/sampler.h"
#include "worker/runtime/checkpointing.h"
#include "worker/runtime/cpu_backend.h"
#include "worker/runtime/cuda_backend.h"
#include "worker/runtime/device_connections.h"
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

// What the devices of a process share for checkpoints: where they resume from (the reader is
// not thread-safe: one device reads at a time) and the writer of this process's shards.
struct ProcessCheckpoints {
  std::optional<ResumePoint> resume;
  absl::Mutex reader_mu;
  std::unique_ptr<Checkpointer> writer;

  int64_t first_step() const {
    return resume.has_value() && resume->reader.has_value() ? resume->report.step() : 0;
  }
};

ConnectionOptions ConnectionsOf(const TrainerOptions& options) {
  ConnectionOptions connections;
  connections.mesh = &options.mesh;
  connections.process_of_position = &options.process_of_position;
  connections.process_index = options.process_index;
  connections.store = options.store;
  connections.listen_host = options.listen_host;
  connections.collective_timeout = options.collective_timeout;
  connections.connect_timeout = options.connect_timeout;
  connections.cpu_collectives = options.cpu_collectives;
  return connections;
}

// The CPUs this process may run on, in order.
std::vector<int> AllowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

// One CPU per device thread, or none when there are fewer CPUs than device threads.
std::vector<int> CpusForDeviceThreads(size_t device_threads) {
  std::vector<int> cpus = AllowedCpus();
  if (cpus.size() < device_threads) return {};
  cpus.resize(device_threads);
  return cpus;
}

void PinCallingThread(int cpu) {
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  // Best effort: a thread that cannot be pinned still runs, only less predictably.
  (void)pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
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

absl::StatusOr<TrainResult> RunDevice(const TrainerOptions& options, const TrainingData& data,
                                      const PeerMonitor* monitor, int device_id,
                                      ProcessCheckpoints& checkpoints,
                                      std::shared_ptr<ShardedUpdateGroup> sharded_update) {
  const v1::JobSpec& spec = options.spec;
  const Mesh& mesh = options.mesh;
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int64_t> coords, mesh.CoordinatesOf(device_id));
  const Device& me = mesh.DeviceAt(coords);
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::unique_ptr<DeviceConnection> connection,
      DeviceConnection::Connect(ConnectionsOf(options), device_id, monitor));
  MeshCommunicators* comms = &connection->comms();

  BackendSetup setup;
  setup.spec = &spec;
  setup.num_features = data.num_features;
  setup.local_index = me.local_index;
  if (absl::StatusOr<int> axis = mesh.AxisIndex(kModelAxis); axis.ok()) {
    SUBSTRAX_ASSIGN_OR_RETURN(setup.model_axis, comms->Axis(kModelAxis));
    setup.model_index = coords[*axis];
  }
  // A mesh with a data axis alone: the device's coordinate is its rank on that axis.
  const CpuShardedUpdate sharded{std::move(sharded_update), static_cast<int>(coords[0])};
  SUBSTRAX_ASSIGN_OR_RETURN(IndexRange rows,
                            BatchRows(mesh, device_id, spec.batch().global_batch_size()));
  // A resumed run reads on from the checkpoint's step: the order of examples is a function of
  // the seed and the step alone (sampler.h), so it sees the batches an uninterrupted run would.
  const int64_t first_step = checkpoints.first_step();
  auto next_step = std::make_shared<int64_t>(first_step);
  setup.batches = [&data, rows, next_step]() -> absl::StatusOr<std::optional<Batch>> {
    if (*next_step >= data.total_steps) return std::optional<Batch>();
    const std::vector<int64_t> global = data.sampler->GlobalBatch((*next_step)++);
    return std::optional<Batch>(Gather(
        data.train, absl::MakeConstSpan(global).subspan(rows.start, rows.limit - rows.start)));
  };
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBackend> backend,
                            me.kind == DeviceKind::kCuda ? CreateCudaBackend(std::move(setup))
                                                         : CreateCpuBackend(std::move(setup), sharded));

  if (first_step > 0) {
    absl::MutexLock lock(&checkpoints.reader_mu);
    SUBSTRAX_RETURN_IF_ERROR(Annotate(
        RestoreDevice(*checkpoints.resume->reader, first_step, mesh, device_id, *backend),
        absl::StrCat("resuming from the checkpoint of step ", first_step)));
  }

  StepLoopOptions loop;
  loop.first_step = first_step;
  if (Checkpointer* writer = checkpoints.writer.get(); writer != nullptr) {
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
  loop.comms = comms;
  loop.total_steps = data.total_steps;
  loop.steps_per_epoch = data.sampler->steps_per_epoch();
  loop.eval = data.test.has_value() ? &*data.test : &data.train;
  loop.eval_prefix = data.test.has_value() ? "test" : "train";
  loop.explicit_collectives = options.explicit_collectives;
  loop.gradients.bucket_bytes = spec.gradients().bucket_bytes() > 0
                                    ? spec.gradients().bucket_bytes()
                                    : kDefaultBucketBytes;
  loop.overlap_gradients = OverlapGradients(options);
  loop.on_progress = options.on_progress;
  if (options.on_device_report) {
    loop.on_device_report = [&options, features = data.num_features](DeviceReport report) {
      report.input_features = features;
      options.on_device_report(report);
    };
  }
  return RunStepLoop(loop, *backend);
}

// How long processes other than 0 wait for process 0 to choose the checkpoint to resume from.
constexpr absl::Duration kResumeTimeout = absl::Minutes(10);

// Where this attempt resumes from (told to on_resume), and the writer of its checkpoints.
absl::Status StartCheckpoints(const TrainerOptions& options, const TrainingData& data,
                              const std::vector<int>& local_devices,
                              ProcessCheckpoints* checkpoints) {
  const v1::JobSpec& spec = options.spec;
  SUBSTRAX_ASSIGN_OR_RETURN(
      checkpoints->resume,
      // Process 0 reads every shard file of the checkpoints it checks: the others may wait
      // longer than for a connection.
      FindResumePoint(spec.checkpoint().directory(), spec.resume_from(), options.process_index,
                      options.store, std::max(options.connect_timeout, kResumeTimeout)));
  if (options.process_index == 0 && options.on_resume) {
    options.on_resume(checkpoints->resume->report);
  }
  if (checkpoints->first_step() > data.total_steps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the checkpoint in ", checkpoints->resume->report.path(), " is of step ",
        checkpoints->first_step(), ", beyond this job's ", data.total_steps, " steps"));
  }
  if (!spec.has_checkpoint()) return absl::OkStatus();
  const int num_processes = NumProcesses(options.process_of_position);
  CheckpointerOptions writer;
  writer.directory = spec.checkpoint().directory();
  writer.keep_last = spec.checkpoint().keep_last();
  writer.mesh = &options.mesh;
  writer.process_index = options.process_index;
  writer.num_processes = num_processes;
  writer.local_devices = local_devices;
  SUBSTRAX_ASSIGN_OR_RETURN(writer.params,
                            ModelParams(spec.model(), data.num_features, ModelAxisSize(spec)));
  writer.store = options.store;
  if (options.process_index == 0) writer.on_commit = options.on_checkpoint;
  checkpoints->writer = std::make_unique<Checkpointer>(std::move(writer));
  return absl::OkStatus();
}

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
  std::vector<int> local;
  for (int64_t i = 0; i < options.mesh.size(); ++i) {
    if (options.process_of_position[i] == options.process_index) {
      local.push_back(options.mesh.devices()[i].id);
    }
  }
  return local;
}

absl::StatusOr<TrainResult> Train(const TrainerOptions& options) {
  const v1::JobSpec& spec = options.spec;
  SUBSTRAX_RETURN_IF_ERROR(ValidateJobSpec(spec));
  const Mesh& mesh = options.mesh;
  // The device kind decides the backend; a spec that asks for another one is refused.
  const bool cuda_devices = mesh.devices().front().kind == DeviceKind::kCuda;
  const bool checkpointed = spec.has_checkpoint() || !spec.resume_from().empty();
  if (checkpointed && cuda_devices) {
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
  SUBSTRAX_ASSIGN_OR_RETURN(const TrainingData data, LoadTrainingData(spec, options.data_access));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<PeerMonitor> monitor,
                            StartPeerMonitor(ConnectionsOf(options)));
  ProcessCheckpoints checkpoints;
  if (checkpointed) {
    SUBSTRAX_RETURN_IF_ERROR(StartCheckpoints(options, data, local_devices, &checkpoints));
  }

  std::vector<absl::StatusOr<TrainResult>> results(local_devices.size(),
                                                   absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  const std::vector<int> cpus =
      options.pin_device_threads ? CpusForDeviceThreads(local_devices.size()) : std::vector<int>();
  if (!cpus.empty()) {
    std::cerr << "device threads pinned to CPUs " << absl::StrJoin(cpus, ", ") << "\n";
  }
  if (sharded_update != nullptr) {
    std::cerr << "optimizer update sharded between the " << local_devices.size()
              << " devices (spec.gradients.shard_update)\n";
  }
  for (size_t i = 0; i < local_devices.size(); ++i) {
    threads.emplace_back([&, i] {
      // Before anything else, so that the threads the device starts (its input pipeline) share
      // its CPU and leave the other devices' alone.
      if (!cpus.empty()) PinCallingThread(cpus[i]);
      results[i] =
          RunDevice(options, data, monitor.get(), local_devices[i], checkpoints,
                    sharded_update);
    });
  }
  for (auto& t : threads) t.join();
  // The job has not succeeded until its last checkpoint is committed.
  if (checkpoints.writer != nullptr) {
    absl::Status flushed = checkpoints.writer->Flush();
    const bool trained = std::all_of(results.begin(), results.end(),
                                     [](const auto& r) { return r.ok(); });
    if (!flushed.ok() && trained) return flushed;
  }
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
