// Train: runs one process's part of a training job. One thread per local device; Gloo
// collectives between every device of the mesh, across processes; data from worker/data with
// PrefetchToDevice; steps from worker/compute joined by SpmdTrainStep (or the explicit
// collective path). This is the step loop that joins compute, collectives and data.
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

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/mesh.h"
#include "core/metric_reductions.h"
#include "substrax/v1/job.pb.h"
#include "worker/collectives/peer_monitor.h"
#include "worker/collectives/store.h"
#include "worker/data/dataset.h"
#include "worker/data/sampler.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// What the runner reports every spec.report_every_steps steps (and after the last step).
struct ProgressReport {
  int64_t step = 0;         // steps done
  int64_t total_steps = 0;
  int64_t epoch = 0;        // 1-based epoch of the last step
  int64_t total_epochs = 0;
  // The job's metrics over the interval, reduced across devices as the spec declares.
  Metrics metrics;
  // Examples per second over all devices, over the interval.
  double samples_per_second = 0;
  // Fractions of the interval the slowest device spent waiting for data, computing and in
  // collectives.
  double data_wait_fraction = 0;
  double compute_fraction = 0;
  double collective_fraction = 0;
  absl::Duration elapsed;
};

// What one device measured over a report interval (the raw per-device values the coordinator
// keeps).
struct DeviceReport {
  int device_id = 0;
  int64_t step = 0;
  // The job's metrics on this device over the interval (before any reduction across devices).
  Metrics values;
  double samples_per_second = 0;
  double data_wait_seconds = 0;
  double compute_seconds = 0;
  double collective_seconds = 0;
};

struct TrainerOptions {
  explicit TrainerOptions(Mesh job_mesh) : mesh(std::move(job_mesh)) {}

  // A defaulted, validated spec (ParseJobSpecYaml does both).
  v1::JobSpec spec;
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
  // Train with the explicit collective step (the guide's pmap path) instead of SpmdTrainStep.
  bool explicit_collectives = false;
  // Called on the process that holds mesh position 0, from a device thread; keep it short.
  std::function<void(const ProgressReport&)> on_progress;
  // Called on every device thread of this process at every report; must be thread-safe.
  std::function<void(const DeviceReport&)> on_device_report;
};

struct TrainResult {
  // This process's parameters after the last step, gathered to their full shape.
  TensorTree params;
  int64_t steps = 0;
  // The last report's metrics.
  Metrics final_metrics;
  // "test_accuracy" and "test_loss" (classification) or "test_loss" (regression) on the test
  // split; "train_*" on the training split when the spec has no test split.
  Metrics evaluation;
};

// Errors: INVALID_ARGUMENT (mesh, process table or spec unusable: the message names the field),
// NOT_FOUND (data files), UNAVAILABLE / DEADLINE_EXCEEDED (a peer died or hung; names it),
// FAILED_PRECONDITION (spec.backend does not match the devices). Jobs on CUDA devices run the
// CUDA step loop (cuda_trainer.h).
absl::StatusOr<TrainResult> Train(const TrainerOptions& options);

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
absl::StatusOr<TrainingData> LoadTrainingData(const v1::JobSpec& spec);

// The ids of the mesh devices this process drives (options.process_of_position).
std::vector<int> LocalDeviceIds(const TrainerOptions& options);

// The liveness monitor of this process's peers (peer_monitor.h), or null when the job has one
// process. Errors: those of PeerMonitor::Start.
absl::StatusOr<std::unique_ptr<PeerMonitor>> StartPeerMonitor(const TrainerOptions& options);

// The progress report after `steps_done` steps: steps and epochs from `data`, throughput from
// the interval's steps of `global_batch` examples over `interval` (time fractions left 0).
ProgressReport MakeProgressReport(const TrainingData& data, int64_t steps_done, Metrics metrics,
                                  int64_t global_batch, int64_t interval_steps,
                                  absl::Duration interval, absl::Duration elapsed);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_TRAINER_H_
