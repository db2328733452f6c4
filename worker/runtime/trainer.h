// Train: runs one process's part of a training job. A TrainingProcess prepares what the process's
// devices share (the data, the checkpoints, the sharded update's group); then each device, on its
// own thread with its communicators connected to every device of the mesh across processes (CPU
// devices: per group Gloo, a host-local communicator or both in levels, see
// cpu_group_connector.h; NCCL on GPUs), builds its backend and runs the step loop (step_loop.h).
// The threads are RunOnLocalDevices' (local_devices.h), the fan-out behind the SDK's
// Program::RunOnDevices: the built-in trainer (`substrax-job run`) runs TrainingProcess::RunDevice
// inside its Program's RunOnDevices; Train runs it for a process without a Program
// (`substrax-job train`, tests). This is where compute, collectives and data are joined.
//
// Every process of the job calls Train with the same spec, mesh and store; the parameters of
// every process end identical (replicated), equal to training on one device with the same
// global batch and seed.
#ifndef SUBSTRAX_WORKER_RUNTIME_TRAINER_H_
#define SUBSTRAX_WORKER_RUNTIME_TRAINER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/mesh.h"
#include "core/metric_reductions.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/job.pb.h"
#include "worker/collectives/cpu_group_connector.h"
#include "worker/collectives/store.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/runtime/checkpointing.h"
#include "worker/runtime/local_devices.h"
#include "worker/runtime/cpu_backend.h"
#include "worker/runtime/step_loop.h"
#include "worker/tensor/tensor.h"

namespace substrax {

struct TrainerOptions {
  explicit TrainerOptions(Mesh job_mesh) : mesh(std::move(job_mesh)) {}

  // A defaulted, validated spec (ParseJobSpecYaml does both).
  v1::JobSpec spec;
  // The job this process is part of (empty for `substrax-job train`): its checkpoints carry it,
  // and keep_last removes only its own.
  std::string job_id;
  // The job's mesh and, for each mesh position, the process that drives that device.
  Mesh mesh;
  std::vector<int> process_of_position;
  int process_index = 0;
  // The attempt's rendezvous store; must outlive Train.
  Store* store = nullptr;
  // Address peers reach this process on (Gloo and the peer monitor).
  std::string listen_host = "127.0.0.1";
  // Every collective must finish within this time: a dead peer becomes an error, not a hang.
  absl::Duration collective_timeout = absl::Seconds(30);
  // Connecting to every peer at start may take this long.
  absl::Duration connect_timeout = absl::Seconds(60);
  // How CPU devices' groups connect (cpu_group_connector.h): per topology, or flat Gloo.
  CpuCollectives cpu_collectives = CpuCollectives::kAuto;
  // Each device thread (and the threads it starts: its input pipeline) on its own CPU
  // (DeviceThreadOptions::pin_device_threads): for a process that has the host to itself
  // (`substrax-job train`).
  bool pin_device_threads = false;
  // How data files are opened (safe_open.h). The default opens none (synthetic data only): a
  // runner confines reads to its daemon's data roots, `substrax-job train` reads any path.
  DataAccess data_access = DataAccess::Confined({});
  // Train with the explicit collective step (the guide's pmap path) instead of SpmdTrainStep.
  bool explicit_collectives = false;
  // Benchmarks and GPU checks only: StepLoopOptions::force_single_replica_collectives.
  bool force_single_replica_collectives = false;
  // Called on the process that holds mesh position 0, from a device thread; keep it short.
  std::function<void(const ProgressReport&)> on_progress;
  // Called on every device thread of this process at every report; must be thread-safe.
  std::function<void(const DeviceReport&)> on_device_report;
  // Where checkpoints (spec.checkpoint.directory, spec.resume_from) may be written and read
  // (checkpointing.h, CheckCheckpointDirectory): a runner's daemon --checkpoint-root
  // directories; nullopt: anywhere (`substrax-job train`). The default allows none.
  std::optional<std::vector<std::string>> checkpoint_roots = std::vector<std::string>{};
  // Process 0, once before training when the job checkpoints or resumes: where it resumed from
  // and which checkpoints it skipped (damaged) and why.
  std::function<void(const v1::CheckpointResume&)> on_resume;
  // Process 0, after each committed checkpoint: what the job's directory holds.
  std::function<void(const v1::CheckpointListing&)> on_checkpoint;
  // Whether the process has been asked to stop (StepLoopOptions::stop_requested; preemption.h's
  // SigtermReceived in a job process). Null: never. Must be thread-safe.
  std::function<bool()> stop_requested;
};

// What every device of a process reads: the data set's splits, the order of its examples and
// the number of steps. Errors: those of loading the data; INVALID_ARGUMENT when the labels do
// not fit the model or the batch does not fit the data.
struct TrainingData {
  Dataset train;
  std::optional<Dataset> test;
  int64_t num_features = 0;
  std::shared_ptr<BatchSampler> sampler;
  int64_t total_steps = 0;
};
absl::StatusOr<TrainingData> LoadTrainingData(const v1::JobSpec& spec, const DataAccess& access);

// The ids of the mesh devices this process drives (options.process_of_position).
std::vector<int> LocalDeviceIds(const TrainerOptions& options);

// Errors: INVALID_ARGUMENT (mesh, process table or spec unusable: the message names the field),
// NOT_FOUND (data files), UNAVAILABLE / DEADLINE_EXCEEDED (a peer died or hung; names it),
// FAILED_PRECONDITION (spec.backend does not match the devices), and for checkpoints:
// INVALID_ARGUMENT (a directory outside the checkpoint roots; a checkpoint of another model),
// NOT_FOUND (resume_from holds no whole checkpoint), UNAVAILABLE (a checkpoint could not be
// written: a full disk; the message names the file and the reason), UNIMPLEMENTED (checkpoints
// on CUDA devices), ABORTED (StoppedBySigterm, preemption.h: stop_requested stopped every
// device after the same step, its checkpoint committed). The devices' kind chooses the
// backend (CPU: Gloo and cpu_backend.h; CUDA: NCCL and cuda_backend.h); both run step_loop.h.
absl::StatusOr<TrainResult> Train(const TrainerOptions& options);

// One process's part of a training job: what its devices share, prepared once, and the body
// each device runs. Thread-safe: RunDevice runs on every device thread at once.
class TrainingProcess {
 public:
  // Checks the options and the spec against the devices, loads the data, finds where the
  // attempt resumes from (told to on_resume), starts the checkpoint writer and makes the sharded
  // update's group. Errors: as Train's, but those of connecting and training.
  static absl::StatusOr<std::unique_ptr<TrainingProcess>> Prepare(TrainerOptions options);

  // The body of one device's thread (RunOnLocalDevices, Program::RunOnDevices): builds the
  // device's backend, restores it where the attempt resumes, and runs the step loop. Called once
  // per local device, concurrently. Errors: as Train's.
  absl::Status RunDevice(DeviceContext& ctx);

  // How the device threads run: pinned or not (TrainerOptions::pin_device_threads), and the
  // checkpoint writer to flush once every device has returned.
  LocalDeviceOptions local_device_options() const;
  // How the devices connect (pointing into this process's options).
  ConnectionOptions connections() const;
  // The result of this process's first device, once every RunDevice returned OK.
  // Errors: FAILED_PRECONDITION when that device has not trained.
  absl::StatusOr<TrainResult> Result();

 private:
  TrainingProcess(TrainerOptions options, TrainingData data)
      : options_(std::move(options)), data_(std::move(data)) {}
  absl::Status StartCheckpoints();

  const TrainerOptions options_;
  const TrainingData data_;
  std::vector<int> local_devices_;
  // Where the attempt resumes from (its reader is not thread-safe: one device reads at a time).
  std::optional<ResumePoint> resume_;
  absl::Mutex reader_mu_;
  std::unique_ptr<Checkpointer> checkpoints_;
  // The sharded update's group (spec.gradients.shard_update), or null.
  std::shared_ptr<ShardedUpdateGroup> sharded_update_;
  absl::Mutex mu_;
  std::map<int, TrainResult> results_ ABSL_GUARDED_BY(mu_);  // by device id
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_TRAINER_H_
