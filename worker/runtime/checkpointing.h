// Checkpointing a training job from its step loop: where a job resumes from, restoring a device's
// state from any checkpoint (resharded onto this job's mesh), and the asynchronous writer that
// saves the processes' state as one sharded checkpoint (worker/checkpoint).
//
// Saving, per process: every device thread copies its state to host memory (SaveState) and hands
// it to the Checkpointer, then goes on training. Once every device of the process has handed its
// state for a step, a background thread encodes the replica-0 blocks into the process's shard
// file and writes it into the step's staging directory, then publishes the file's manifest entry
// in the attempt's store. Process 0 gathers every process's entry, writes the manifest last and
// renames the directory (the atomic commit), keeps the newest keep_last, and says so to
// `on_commit`; the other processes wait (in the background) until it has, so that an error of
// any process reaches all of them. At most one checkpoint is being written while the next is
// copied: a device that hands over a step while two are outstanding waits.
//
// Resuming: process 0 finds the newest whole checkpoint (a damaged one is skipped, and why is
// kept) and publishes its path; the others open the same one. Each device then reads exactly the
// blocks its layout needs.
#ifndef SUBSTRAX_WORKER_RUNTIME_CHECKPOINTING_H_
#define SUBSTRAX_WORKER_RUNTIME_CHECKPOINTING_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/mesh.h"
#include "core/model_catalog.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "worker/checkpoint/sharded.h"
#include "worker/collectives/store.h"
#include "worker/runtime/device_backend.h"

namespace substrax {

// OK when `dir` may hold checkpoints: absolute, normalized and, when `roots` is given (a
// runner: its daemon's --checkpoint-root flags), under one of them, also after resolving the
// symlinks of the part that exists. Errors: INVALID_ARGUMENT naming `field`, the path and the
// roots.
absl::Status CheckCheckpointDirectory(const std::string& field, const std::string& dir,
                                      const std::optional<std::vector<std::string>>& roots);

// The global shape and partition of the state array `name` (as DeviceBackend::SaveState names
// it) of a model with `params`. Errors: NOT_FOUND for a name that is no parameter's.
absl::StatusOr<ParamSpec> StateArraySpec(const std::string& name,
                                         const std::vector<ParamSpec>& params);

// The committed checkpoints of `dir` as the job's listing (newest first): step, time, size, mesh.
v1::CheckpointListing DescribeCheckpoints(const std::string& dir);

// Where an attempt resumes from.
struct ResumePoint {
  v1::CheckpointResume report;
  // Open on the checkpoint when report.step() > 0.
  std::optional<CheckpointReader> reader;
};

// Decides where to resume: the newest whole checkpoint of `directory` (the job's own, when it
// checkpoints), else of `resume_from` (a job's directory or one committed "step-..."
// directory). Process 0 looks (and removes staging directories left by earlier attempts in
// `directory`) and publishes its choice in `store`; the other processes wait for it (up to
// `timeout`) and open the same checkpoint. Errors: NOT_FOUND when `resume_from` is given but
// holds no whole checkpoint; DATA_LOSS for a damaged one named directly; the store's errors.
absl::StatusOr<ResumePoint> FindResumePoint(const std::string& directory,
                                            const std::string& resume_from, int process_index,
                                            Store* store, absl::Duration timeout);

// Fills every tensor of `state` (arrays named as DeviceBackend::SaveState names them, each of
// the device's block shape) with device `device_id`'s block of the checkpoint in `reader`, read
// under `mesh`'s layout of the model's `params` whatever mesh it was saved on. Errors: as
// RestoreDevice, and INVALID_ARGUMENT for a tensor not of its block's shape.
absl::Status ReadDeviceState(CheckpointReader& reader, const Mesh& mesh, int device_id,
                             const std::vector<ParamSpec>& params, TensorTree* state);

// Replaces `backend`'s state with device `device_id`'s blocks of the checkpoint in `reader`,
// read under this job's `mesh` layout whatever mesh it was saved on. Errors: FAILED_PRECONDITION
// naming an array the checkpoint lacks or holds with another shape (another model or
// optimizer); DATA_LOSS for a damaged shard file; the backend's.
absl::Status RestoreDevice(CheckpointReader& reader, int64_t step, const Mesh& mesh,
                           int device_id, DeviceBackend& backend);

struct CheckpointerOptions {
  // The job's checkpoint directory (checked by CheckCheckpointDirectory).
  std::string directory;
  // Committed checkpoints kept (0: all).
  int keep_last = 0;
  // The job writing them (CheckpointManifest.job_id): keep_last counts and removes only its own.
  std::string job_id;
  const Mesh* mesh = nullptr;
  int process_index = 0;
  int num_processes = 1;
  // The mesh devices this process drives: a step is written once each has handed its state.
  std::vector<int> local_devices;
  // The model's parameters (global shapes, partitions): the layout of every state array.
  std::vector<ParamSpec> params;
  // The attempt's store (keys "checkpoint/..."); must outlive the Checkpointer.
  Store* store = nullptr;
  // How long a process waits for the others' shard files and for the commit.
  absl::Duration timeout = absl::Minutes(10);
  // Process 0, from the writer thread, after each commit: the directory's listing.
  std::function<void(const v1::CheckpointListing&)> on_commit;
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointerOptions options);
  // Waits for the writer to finish what it has (Flush first to see its errors).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Device `device_id`'s state after `step` steps (DeviceBackend::SaveState). Returns once it is
  // queued; waits while two checkpoints are outstanding. Errors: the first error of an earlier
  // write (the job should stop), INVALID_ARGUMENT for a device not of this process.
  absl::Status Submit(int device_id, int64_t step, TensorTree state);
  // Waits until everything submitted is committed. Errors: the first write or commit error.
  absl::Status Flush();

 private:
  struct Snapshot {
    int64_t step = 0;
    std::map<int, TensorTree> devices;
  };
  void WriterLoop();
  absl::Status Write(const Snapshot& snapshot);
  // Waits for `key` in the store to hold a value for `step` ("<step> <rest>"); returns the rest.
  absl::StatusOr<std::string> AwaitStep(const std::string& key, int64_t step);

  const CheckpointerOptions options_;
  absl::Mutex mu_;
  // Devices' states of the step being handed over.
  Snapshot gathering_ ABSL_GUARDED_BY(mu_);
  // Whole snapshots waiting for the writer, and whether it is writing one.
  std::deque<Snapshot> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread writer_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_CHECKPOINTING_H_
