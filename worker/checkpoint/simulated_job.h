// A job's checkpoint written by one process, as each of the job's processes would write its
// part: for tests, test tools and benchmarks. Each host of the mesh is one process (numbered in
// the order of Mesh::Hosts()); its devices' blocks are cut from the global values, and saving
// goes through the library's own path (EncodeProcessShards and WriteShardFile for every process,
// then MakeManifest and CommitCheckpoint), so what is read back is what a job would have left.
//
// Thread-compatible. Move-only: the processes' arrays point into the blocks it owns.
#ifndef SUBSTRAX_WORKER_CHECKPOINT_SIMULATED_JOB_H_
#define SUBSTRAX_WORKER_CHECKPOINT_SIMULATED_JOB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mesh.h"
#include "core/sharding.h"
#include "worker/checkpoint/sharded.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// One array of the simulated state: its whole value and how it is partitioned over the mesh.
struct GlobalArray {
  Tensor value;
  PartitionSpec spec;
};

class SimulatedJob {
 public:
  // Errors: INVALID_ARGUMENT (a spec that does not fit the mesh or its array's shape).
  static absl::StatusOr<SimulatedJob> Create(const Mesh& mesh,
                                             const std::map<std::string, GlobalArray>& arrays);
  SimulatedJob(SimulatedJob&&) = default;
  SimulatedJob& operator=(SimulatedJob&&) = default;

  int processes() const { return static_cast<int>(processes_.size()); }

  // Saves the state as the checkpoint of `step` in the job's checkpoint directory `dir`
  // (created), keeping the last `keep_last` (0: all). Errors: as WriteShardFile and
  // CommitCheckpoint.
  absl::Status Save(const std::string& dir, int64_t step, int keep_last = 0) const;

 private:
  explicit SimulatedJob(Mesh mesh) : mesh_(std::move(mesh)) {}

  Mesh mesh_;
  // Every array's layout (no shards), as MakeManifest takes them.
  std::map<std::string, LocalArray> layouts_;
  // Per process: its devices' blocks, pointing into blocks_.
  std::vector<std::map<std::string, LocalArray>> processes_;
  std::vector<std::unique_ptr<Tensor>> blocks_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_CHECKPOINT_SIMULATED_JOB_H_
