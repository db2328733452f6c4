// The step loop: one per device, the same for every backend. It drives a DeviceBackend through
// the steps of a job, reduces the gradients as the shardings imply (or, on the guide's pmap path,
// with explicit collectives per axis) in buckets over the flat gradient buffer, reduces the
// metrics as the spec declares, measures where the time goes, reports progress, evaluates, and
// gathers the parameters to their full shapes.
#ifndef SUBSTRAX_WORKER_RUNTIME_STEP_LOOP_H_
#define SUBSTRAX_WORKER_RUNTIME_STEP_LOOP_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/mesh.h"
#include "core/metric_reductions.h"
#include "substrax/v1/job.pb.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/data/dataset.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/spmd.h"
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
  // collectives (measured by the device's backend).
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
  // What the runner found in the data, for the coordinator (which reads no data files): the
  // attempt's total steps and the features per example.
  int64_t total_steps = 0;
  int64_t input_features = 0;
};

struct TrainResult {
  // The parameters after the last step, gathered to their full shape.
  TensorTree params;
  int64_t steps = 0;
  // The steps restored from a checkpoint before training (0: from the beginning).
  int64_t resumed_from_step = 0;
  // The last report's metrics.
  Metrics final_metrics;
  // "test_accuracy" and "test_loss" (classification) or "test_loss" (regression) on the test
  // split; "train_*" on the training split when the spec has no test split.
  Metrics evaluation;
};

struct StepLoopOptions {
  // A defaulted, validated spec: metrics, report_every_steps, batch.
  const v1::JobSpec* spec = nullptr;
  // The device's place: mesh, id, and its connected communicators.
  const Mesh* mesh = nullptr;
  int device_id = 0;
  MeshCommunicators* comms = nullptr;
  // Length of the job.
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 1;
  // Evaluated once at the end (the devices of the data axis each take a share); may be null.
  const Dataset* eval = nullptr;
  // "test" or "train": the prefix of the evaluation's metric names.
  std::string eval_prefix = "test";
  // The guide's pmap path: the loop calls the collective functions per axis (mean over "data"
  // for every gradient, then over "model" for the replicated ones) instead of reducing as the
  // shardings imply. Same result.
  bool explicit_collectives = false;
  GradientReductionOptions gradients;
  // Reduce each bucket as soon as the backward pass has produced it, on a thread of the loop's,
  // while the pass goes on (overlapped_reduction.h). Taken only where it can be: a backend whose
  // collectives run on the calling thread (max_steps_in_flight() == 0), the sharding path (not
  // explicit_collectives), and no model axis (the backward pass all-reduces over it itself).
  bool overlap_gradients = false;
  // Benchmarks and GPU checks only: reduce over mesh axes of one replica too (normally skipped),
  // so that one GPU runs a step's real collectives with a 1-rank group
  // (GradientPlan::reduce_single_replica_axes).
  bool force_single_replica_collectives = false;
  // Called on the device at mesh position 0; keep it short.
  std::function<void(const ProgressReport&)> on_progress;
  // Called on every device at every report; must be thread-safe.
  std::function<void(const DeviceReport&)> on_device_report;

  // A resumed run: the steps already done (the backend's state and its input are those after
  // them); the loop runs the steps after first_step.
  int64_t first_step = 0;
  // Checkpoints. `save` is called on every device of the mesh at the same steps, after that
  // step's update, with the steps done: every save_every_steps steps, at the first report after
  // save_every has passed since the last save (the devices agree through the report's
  // reduction), and after the last step when save_at_end. Null: no checkpoints.
  std::function<absl::Status(int64_t steps_done, DeviceBackend& backend)> save;
  int64_t save_every_steps = 0;
  absl::Duration save_every = absl::ZeroDuration();
  bool save_at_end = false;
  // Whether this process has been asked to stop (preemption.h: SIGTERM); called on every device
  // at every report and reduced with the report (max), so that every device of every process
  // stops after the same step: after a final checkpoint of it (when `save` is set) the loop ends
  // with StoppedBySigterm. Not honoured after the last step (the run is complete). Null: never.
  std::function<bool()> stop_requested;
};

// What the loop did, for tests: how many gradient collectives (all-reduces of buckets, or the
// sharded update's reduce-scatters) it issued, and the kind of GradientReducer it ran
// (gradient_reducer.h: "flat", "explicit", "overlapped", or the backend's own, such as
// "sharded update").
struct StepLoopStats {
  int64_t gradient_collectives = 0;
  std::string gradient_reducer;
};

// Runs the job on one device. Every device of the mesh runs it with the same options but its
// own device_id, comms and backend. Errors: the backend's and the collectives' (annotated with
// the step), INVALID_ARGUMENT for unusable options or metric reductions, ABORTED
// (StoppedBySigterm) when stop_requested stopped it.
absl::StatusOr<TrainResult> RunStepLoop(const StepLoopOptions& options, DeviceBackend& backend,
                                        StepLoopStats* stats = nullptr);

// The progress report after `steps_done` steps: throughput from the interval's steps of
// `global_batch` examples over `interval` (time fractions left 0).
ProgressReport MakeProgressReport(int64_t total_steps, int64_t steps_per_epoch,
                                  int64_t steps_done, Metrics metrics, int64_t global_batch,
                                  int64_t interval_steps, absl::Duration interval,
                                  absl::Duration elapsed);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_STEP_LOOP_H_
