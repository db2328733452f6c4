// Exporting a training checkpoint's parameters as one safetensors file, for use outside substrax
// (numpy, PyTorch, JAX, serving):
//
//   array in the checkpoint        tensor in the export
//   params/dense_0/kernel          dense_0/kernel             whole, of its global shape, F32
//   optimizer/dense_0/kernel/mu    optimizer/dense_0/kernel/mu   only with include_optimizer
//   anything else                  left out (listed in ExportResult::left_out)
//
// The file's __metadata__ holds "format" ("substrax-export"), "step", "mesh_axes" ("data,model")
// and "mesh_shape" ("2,2"): the mesh the checkpoint was saved on. Every shard file is checked
// against its checksum before anything is written, and the file appears whole or not at all (a
// temporary file beside it, fsync'd, renamed over it, the directory fsync'd).
//
// The checkpoint's shard files and the export are held in memory while exporting.
#ifndef SUBSTRAX_WORKER_CHECKPOINT_EXPORT_H_
#define SUBSTRAX_WORKER_CHECKPOINT_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace substrax {

struct ExportOptions {
  // With a job's checkpoint directory: the step to export (-1: the newest whole checkpoint).
  // With a step directory: if not -1, the step it must hold.
  int64_t step = -1;
  // Also export the optimizer's state (arrays "optimizer/...", named as in the checkpoint).
  bool include_optimizer = false;
};

struct ExportResult {
  // The committed step directory exported, and its step.
  std::string checkpoint_dir;
  int64_t step = 0;
  // The tensors written, in the file's (name) order, and the file's size.
  std::vector<std::string> tensors;
  int64_t bytes = 0;
  // The checkpoint's arrays not exported (the optimizer's without include_optimizer, arrays
  // neither "params/" nor "optimizer/").
  std::vector<std::string> left_out;
  // Newer checkpoints of the job passed over, and why ("step 300: checkpoint shard file ... is
  // damaged: ..."); only when the newest whole one was looked for.
  std::vector<std::string> skipped;
};

// Writes the parameters of `checkpoint` to `out_path`. `checkpoint` is a committed step
// directory (it has manifest.json: step-000000000100) or a job's checkpoint directory (holding
// step directories: the newest whole one, or options.step's). Errors: NOT_FOUND (no such
// directory, no committed checkpoint, no checkpoint of options.step), DATA_LOSS (the checkpoint
// is damaged: a shard file missing or not matching its checksum; in a job's directory, every
// committed checkpoint is), INVALID_ARGUMENT (a step directory of another step than
// options.step; an unreadable manifest), FAILED_PRECONDITION (no "params/" array; the output
// cannot be written: naming the path and the errno text). Nothing is written on error.
absl::StatusOr<ExportResult> ExportCheckpoint(const std::string& checkpoint,
                                              const std::string& out_path,
                                              const ExportOptions& options);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_CHECKPOINT_EXPORT_H_
