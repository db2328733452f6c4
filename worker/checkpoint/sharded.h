// Sharded checkpoints: what each process of a job writes, the manifest that ties the pieces
// together, and reading any block of any array back, whatever mesh it was saved on.
//
// Saving writes every element of every array exactly once across the job: each process encodes
// the blocks of its devices whose replica id is 0 (EncodeProcessShards) into one safetensors
// file; process 0 assembles the manifest from every process's entries (MakeManifest), which
// checks that the blocks tile each array with no gap and no overlap. Reading (CheckpointReader)
// assembles the block a device needs under its own layout from the files that overlap it, each
// read once and checked against its XXH3: a checkpoint saved on a (2, 2) mesh restores onto
// (4, 1) or onto one device.
//
// The files are written and committed by the caller (the atomic commit and the asynchronous
// writer come with the step loop's checkpointing). Thread-compatible.
#ifndef SUBSTRAX_WORKER_CHECKPOINT_SHARDED_H_
#define SUBSTRAX_WORKER_CHECKPOINT_SHARDED_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/mesh.h"
#include "core/sharding.h"
#include "substrax/v1/checkpoint.pb.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// One array of a process's state: its layout over the job's mesh, and the shard of each of the
// process's devices (device id -> a tensor of that device's slice shape).
struct LocalArray {
  ShardLayout layout;
  std::map<int, const Tensor*> shards;
};

// One process's shard file and its manifest entry.
struct ProcessShards {
  v1::CheckpointFile entry;
  std::string contents;
};

// Encodes the replica-0 blocks of `arrays` this process holds into "process-NNNNN.safetensors".
// Errors: INVALID_ARGUMENT (a shard whose shape is not its device's slice; a device not in the
// layout).
absl::StatusOr<ProcessShards> EncodeProcessShards(int process_index,
                                                  const std::map<std::string, LocalArray>& arrays);

// The manifest of a checkpoint of `arrays` (their layouts; shards ignored) at `step` on `mesh`,
// from every process's entry. Errors: INVALID_ARGUMENT naming the array whose blocks overlap or
// leave elements out (a process missing, or written twice).
absl::StatusOr<v1::CheckpointManifest> MakeManifest(int64_t step, const Mesh& mesh,
                                                    const std::map<std::string, LocalArray>& arrays,
                                                    std::vector<v1::CheckpointFile> files);

class CheckpointReader {
 public:
  // Reads `<dir>/manifest.json`. Errors: NOT_FOUND (no manifest), INVALID_ARGUMENT (not a
  // manifest of a known format version).
  static absl::StatusOr<CheckpointReader> Open(const std::string& dir);
  // The same from a manifest already read.
  CheckpointReader(std::string dir, v1::CheckpointManifest manifest)
      : dir_(std::move(dir)), manifest_(std::move(manifest)) {}

  const v1::CheckpointManifest& manifest() const { return manifest_; }
  // The checkpoint's directory.
  const std::string& dir() const { return dir_; }

  // The block `index` (one range per dimension) of array `name`, from the shard files that
  // overlap it. Errors: NOT_FOUND (no such array, a shard file missing), INVALID_ARGUMENT (the
  // index does not fit the array), DATA_LOSS (a shard file whose checksum or contents do not
  // match the manifest).
  absl::StatusOr<Tensor> ReadBlock(const std::string& name, const std::vector<IndexRange>& index);
  // The whole array `name`: ReadBlock over its global shape. Errors: as ReadBlock's.
  absl::StatusOr<Tensor> ReadWhole(const std::string& name);
  // Every array whose name starts with `prefix`, whole, by its name. Errors: as ReadBlock's.
  absl::StatusOr<TensorTree> ReadArrays(absl::string_view prefix);
  // Reads every shard file once and checks it against the manifest (size, checksum, format).
  // Errors: as ReadBlock's for files.
  absl::Status VerifyAll();

 private:
  // A shard file, read and checked once.
  absl::StatusOr<const SafetensorsFile*> File(const v1::CheckpointFile& entry);

  std::string dir_;
  v1::CheckpointManifest manifest_;
  std::map<std::string, SafetensorsFile> files_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_CHECKPOINT_SHARDED_H_
