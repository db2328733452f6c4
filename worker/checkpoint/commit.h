// The atomic commit of a sharded checkpoint (sharded.h) in a directory, and finding the newest
// one that is whole:
//
//   <dir>/step-000000000100/manifest.json, process-00000.safetensors, ...   committed
//   <dir>/.staging-step-000000000100/...                                  being written
//
// Every process writes its shard file into the staging directory (WriteShardFile); after a
// barrier, process 0 writes the manifest last and renames the staging directory to its
// committed name (CommitCheckpoint), then drops the oldest beyond `keep_last`. A reader sees
// only committed directories, so a save cut short (a crash, a full disk) leaves nothing that
// looks like a checkpoint; OpenLatestValid also skips a committed one whose files no longer
// match their checksums, saying which and why.
//
// Thread-compatible; one process commits a given step.
#ifndef SUBSTRAX_WORKER_CHECKPOINT_COMMIT_H_
#define SUBSTRAX_WORKER_CHECKPOINT_COMMIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "substrax/v1/checkpoint.pb.h"
#include "worker/checkpoint/sharded.h"

namespace substrax {

std::string CommittedCheckpointDir(const std::string& dir, int64_t step);
std::string StagingCheckpointDir(const std::string& dir, int64_t step);

// Writes `shards`' file into the staging directory of `step` (created), durably. Errors:
// UNAVAILABLE naming the file and the errno text (ENOSPC: a full disk).
absl::Status WriteShardFile(const std::string& dir, int64_t step, const ProcessShards& shards);

// Process 0, once every process's WriteShardFile has returned: checks that the staging
// directory holds every file of `manifest` at its size, writes manifest.json, renames the
// staging directory to the committed one, and removes the oldest committed checkpoints beyond
// `keep_last` (0: keep all) among those of manifest.job_id: another job's checkpoints in the
// same directory are neither counted nor removed. Errors: FAILED_PRECONDITION (a shard file
// missing or of another size; or the directory holds another job's committed checkpoint of
// the same step, which is never replaced: not committed), UNAVAILABLE (a write or rename
// failed; nothing committed).
absl::Status CommitCheckpoint(const std::string& dir, const v1::CheckpointManifest& manifest,
                              int keep_last);

struct CommittedCheckpoint {
  int64_t step = 0;
  std::string path;
};
// The committed checkpoints in `dir`, newest first (an absent directory has none).
std::vector<CommittedCheckpoint> ListCheckpoints(const std::string& dir);

// The newest committed checkpoint whose manifest reads and whose every shard file matches its
// checksum. Each one skipped on the way is described in *skipped ("step 300: checkpoint shard
// file ... is damaged: ..."). Errors: NOT_FOUND (none is whole; the message lists why).
absl::StatusOr<CheckpointReader> OpenLatestValid(const std::string& dir,
                                                 std::vector<std::string>* skipped);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_CHECKPOINT_COMMIT_H_
