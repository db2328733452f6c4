// A training program's connection to its job: substrax::Init and substrax::Program (docs/sdk.md).
//
// A program built on the SDK runs in one of two modes, chosen by Init:
//  - in a job: a worker daemon started it for one attempt of a `program` job (the environment
//    names the daemon's launch file, SUBSTRAX_LAUNCH). Init reads the process's part of the job
//    (the mesh, this process's devices, the spec's settings), connects to the coordinator and
//    tells the daemon the program is running. RunOnDevices then connects every local device to
//    the whole mesh (Gloo, one communicator per mesh axis, the collective timeout and the peer
//    monitor of the built-in trainer), so the guide's functions (substrax/spmd.h) reduce across
//    every process of the job;
//  - standalone: started by hand, outside any job. The mesh is a data-parallel mesh of
//    InitOptions::standalone_devices local CPU devices (the environment variable
//    SUBSTRAX_DEVICES overrides it), all in this process; metrics are printed. The same program
//    runs on a laptop and on the cluster.
//
//   int main(int argc, char** argv) {
//     absl::StatusOr<std::unique_ptr<substrax::Program>> program = substrax::Init();
//     if (!program.ok()) return substrax::ExitWithError(program.status());
//     absl::Status trained = (*program)->RunOnDevices([&](substrax::DeviceContext& ctx) {
//       ...  // the step loop of one device
//     });
//     return (*program)->Finish(trained);
//   }
//
// Thread-safety: Init once per process, from main. RunOnDevices calls its function on one
// thread per local device, concurrently; ReportMetrics, SetTotalSteps and SetFinalMetrics may
// be called from those threads. Finish once, after RunOnDevices returned.
#ifndef SUBSTRAX_PROGRAM_H_
#define SUBSTRAX_PROGRAM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "substrax/mesh.h"
#include "substrax/metrics.h"
#include "substrax/spmd.h"
#include "substrax/version.h"

namespace substrax {

// The job's settings a program reads: from the job spec in a job, from InitOptions standalone.
struct JobSettings {
  // The job's id and this attempt's number (1, 2, ...); standalone: "standalone" and 1.
  std::string job_id = "standalone";
  int attempt = 1;
  // spec.seed: seed initialisation and shuffling with it, so that every process agrees.
  uint64_t seed = 0;
  // spec.batch.global_batch_size: examples per step over all devices (0: the spec has none).
  int64_t global_batch_size = 0;
  // spec.steps or spec.epochs (0: not set; at most one is set).
  int64_t steps = 0;
  int64_t epochs = 0;
  // spec.report_every_steps: how often to call ReportMetrics.
  int64_t report_every_steps = 50;
  // spec.metrics: the declared reduction across devices of each metric ("loss" -> "mean").
  // Reported metrics are reduced this way (a metric without a declared reduction: "mean").
  std::map<std::string, std::string> metrics = {{"loss", "mean"}, {"accuracy", "mean"}};
  // spec.checkpoint (docs/checkpoints.md): where to save (empty: the spec has no checkpoint
  // section), every how many steps (0: not by steps), whether after the last step, and how many
  // to keep (0: all); spec.resume_from: where to start from (empty: nowhere but the directory).
  std::string checkpoint_directory;
  int64_t checkpoint_every_steps = 0;
  bool checkpoint_at_end = true;
  int checkpoint_keep_last = 0;
  std::string resume_from;
};

// How a program's checkpoints are kept (Program::ConfigureCheckpoints).
struct CheckpointOptions {
  // Where checkpoints are written (absolute; in a job under a worker's --checkpoint-root, which is
  // checked); empty: JobSettings::checkpoint_directory. Both empty: none are written.
  std::string directory;
  // Committed checkpoints kept, the newest (0: all; -1: JobSettings::checkpoint_keep_last).
  int keep_last = -1;
  // A checkpoint (a job's directory or one "step-..." directory in it) to start from when the
  // directory holds none yet; empty: JobSettings::resume_from.
  std::string resume_from;
  // Every parameter's global shape by name, and how it is split over the mesh (missing:
  // replicated). Checkpoints hold the parameters and the optimizer's state at these shapes, so
  // they restore onto any mesh.
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, PartitionSpec> specs;
};

struct InitOptions {
  // Standalone mode: the number of local CPU devices (>= 1); SUBSTRAX_DEVICES overrides it.
  int standalone_devices = 1;
  // Standalone mode: the job's settings. In a job they come from the spec.
  JobSettings standalone_settings;
};

// Per-device timing a program may add to a report (shown by `substraxctl metrics` and `watch`).
struct ReportTiming {
  // Examples this device processed per second since its previous report (0: not measured).
  double samples_per_second = 0;
  // Seconds since the previous report spent waiting for data, computing, in collectives.
  double data_wait_seconds = 0;
  double compute_seconds = 0;
  double collective_seconds = 0;
};

class Program {
 public:
  virtual ~Program() = default;

  // True outside a job (standalone mode).
  virtual bool standalone() const = 0;
  virtual const JobSettings& settings() const = 0;
  // This process's index among the job's processes (0 standalone), and how many there are.
  virtual int process_index() const = 0;
  virtual int num_processes() const = 0;
  // The job's whole mesh, and the ids of the devices this process drives.
  virtual const Mesh& mesh() const = 0;
  virtual std::vector<int> local_device_ids() const = 0;

  // Runs `fn` once per local device, each on its own thread with that device's context, and
  // waits for all of them. Every device of the mesh (in every process) must make the same
  // collective calls in the same order. When a device's `fn` fails, the others are not stopped
  // by this call: a device blocked in a collective with it gets the collective's error (a peer
  // that left, or the collective timeout). It returns once every device's `fn` has returned and
  // this process's last checkpoint (SaveCheckpoint) is committed. Call it once.
  // Errors: the first failing device's error, annotated with the device and process; UNAVAILABLE
  // / DEADLINE_EXCEEDED when the communicators cannot connect (a peer process died or never
  // came); FAILED_PRECONDITION when called twice; a checkpoint's write error (as SaveCheckpoint).
  virtual absl::Status RunOnDevices(const std::function<absl::Status(DeviceContext&)>& fn) = 0;

  // The attempt's total steps, for progress (`substraxctl watch`); sent with the next reports.
  virtual void SetTotalSteps(int64_t total_steps) = 0;

  // Reports this device's metrics after `step` steps (every device reports the same steps). The
  // coordinator reduces them across devices with the spec's declared reductions
  // (`substraxctl metrics JOB`); standalone, they are reduced here and printed once every local
  // device has reported the step. Never blocks on the network (reports are sent in the
  // background, bounded).
  // Errors: INVALID_ARGUMENT for a device this process does not drive, an empty metric name or
  // a non-finite step.
  virtual absl::Status ReportMetrics(const DeviceContext& ctx, int64_t step,
                                     const Metrics& metrics, const ReportTiming& timing = {}) = 0;

  // The job's final metrics ("test_accuracy"), shown by `substraxctl get`; merged when set
  // several times (later values win).
  virtual void SetFinalMetrics(const Metrics& metrics) = 0;

  // Checkpoints (docs/checkpoints.md: sharded safetensors files committed atomically, listed by
  // `substraxctl checkpoints`, restored onto any mesh). Call ConfigureCheckpoints once, in every
  // process, before RunOnDevices: it finds what to resume from (process 0 chooses the newest
  // whole checkpoint of the directory, else of resume_from; damaged ones are skipped).
  // Errors: INVALID_ARGUMENT for a directory that is not absolute and normalized, or in a job
  // not under the worker's --checkpoint-root, and for options without shapes; NOT_FOUND when
  // resume_from holds no whole checkpoint; FAILED_PRECONDITION after RunOnDevices began.
  virtual absl::Status ConfigureCheckpoints(const CheckpointOptions& options) = 0;
  // On every device, before training: replaces `params` (this device's blocks, as
  // PlaceStateOnShards gives them) and `optimizer`'s state with the checkpoint's, and returns
  // its step: the steps already done (0, and nothing changed, when there is nothing to resume).
  // The program goes on from that step; its data order must be a function of the step.
  // Errors: INVALID_ARGUMENT when the checkpoint holds other arrays or shapes (another model or
  // optimizer); DATA_LOSS for a damaged shard file; FAILED_PRECONDITION without
  // ConfigureCheckpoints.
  virtual absl::StatusOr<int64_t> RestoreCheckpoint(const DeviceContext& ctx, TensorTree* params,
                                                    Optimizer& optimizer) = 0;
  // On every device, at the same steps: this device's parameters and optimizer state after
  // `step` steps. Copies them and returns; a background thread writes this process's shard file
  // and process 0 commits the checkpoint once every process has written. Finish waits for the
  // last commit (a job does not succeed before it). Errors: a failed earlier write (stop
  // training: the message names the file and the reason); FAILED_PRECONDITION without a
  // checkpoint directory.
  virtual absl::Status SaveCheckpoint(const DeviceContext& ctx, int64_t step,
                                      const TensorTree& params, const Optimizer& optimizer) = 0;

  // Ends the program's part of the attempt: waits for the last checkpoint to be committed (its
  // error replaces an OK `status`) and, up to 10 s, for the last reports to reach the
  // coordinator, then tells the daemon how it ended (`status`: OK = this process succeeded).
  // Returns the exit code for main (0 when `status` is OK, 1 otherwise) and prints a failure to
  // stderr. Call it once, as `return program->Finish(status);`.
  virtual int Finish(const absl::Status& status) = 0;
};

namespace internal {
// Init's implementation; the version is that of the headers the program was compiled with.
absl::StatusOr<std::unique_ptr<Program>> InitForVersion(int header_major, int header_minor,
                                                        const InitOptions& options);
}  // namespace internal

// Connects this process to its job, or starts standalone (see the top of this file). Call it
// first in main, before reading data: a program the daemon started that has not called Init
// within the worker's --program-init-timeout (60 s by default) is stopped as stalled.
// Errors: FAILED_PRECONDITION when the program was built against another major version of the
// SDK than the library or the worker speak (the message says which to rebuild); INVALID_ARGUMENT
// for unusable options or SUBSTRAX_DEVICES, or an unreadable launch file; UNAVAILABLE when the
// coordinator cannot be reached.
inline absl::StatusOr<std::unique_ptr<Program>> Init(const InitOptions& options = {}) {
  return internal::InitForVersion(SUBSTRAX_VERSION_MAJOR, SUBSTRAX_VERSION_MINOR, options);
}

// The version of the SDK library the program runs with ("1.0.0"), which may be newer than the
// headers it was built with (SUBSTRAX_VERSION_STRING) within one major version.
const char* LibraryVersion();

// For an error before Finish can be called (Init failed): prints it to stderr and returns 1.
int ExitWithError(const absl::Status& status);

// True once this process got SIGTERM: the agent stops an attempt (cancel, preemption by a job of
// higher priority) with SIGTERM, then SIGKILL after a grace period. Init installs the handler: a
// first SIGTERM only sets this flag (the program goes on), a second one ends the process. A
// program's loop checks it on every device at the same steps (reduce it with the step's
// metrics, kMax, so that every device of every process agrees), saves a checkpoint of the step
// (SaveCheckpoint) and returns; Finish then waits for its commit (docs/sdk.md, "Preemption").
// Async-signal-safe to read; thread-safe.
bool StopRequested();

}  // namespace substrax

#endif  // SUBSTRAX_PROGRAM_H_
