#include "worker/checkpoint/export.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "rpc/pki.h"
#include "worker/checkpoint/commit.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/sharded.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

constexpr absl::string_view kParamsPrefix = "params/";
constexpr absl::string_view kOptimizerPrefix = "optimizer/";

// Opens the committed checkpoint in `dir` and checks every shard file against the manifest, so
// that nothing is written from a damaged checkpoint.
absl::StatusOr<CheckpointReader> OpenWhole(const std::string& dir) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return reader.status();
  if (absl::Status s = reader->VerifyAll(); !s.ok()) {
    // A missing shard file (NOT_FOUND from the reader) is damage too: the commit had it.
    return absl::DataLossError(absl::StrCat("the checkpoint of step ", reader->manifest().step(),
                                            " in ", dir, " is damaged: ", s.message()));
  }
  return reader;
}

// The checkpoint `checkpoint` and `options` name, verified; *dir is set to its step directory.
absl::StatusOr<CheckpointReader> OpenForExport(const std::string& checkpoint,
                                               const ExportOptions& options, std::string* dir,
                                               std::vector<std::string>* skipped) {
  std::error_code ec;
  if (fs::exists(checkpoint + "/manifest.json", ec)) {
    *dir = checkpoint;
    absl::StatusOr<CheckpointReader> reader = OpenWhole(checkpoint);
    if (reader.ok() && options.step >= 0 && reader->manifest().step() != options.step) {
      return absl::InvalidArgumentError(absl::StrCat(checkpoint, " holds the checkpoint of step ",
                                                     reader->manifest().step(), ", not of step ",
                                                     options.step));
    }
    return reader;
  }
  if (!fs::is_directory(checkpoint, ec)) {
    return absl::NotFoundError(
        absl::StrCat("no checkpoint at ", checkpoint, ": no such directory"));
  }
  const std::vector<CommittedCheckpoint> committed = ListCheckpoints(checkpoint);
  if (committed.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "no checkpoint at ", checkpoint,
        ": neither a manifest.json nor a committed step-NNNNNNNNNNNN directory"));
  }
  if (options.step < 0) {
    absl::StatusOr<CheckpointReader> reader = OpenLatestValid(checkpoint, skipped);
    // Committed checkpoints exist, so none being whole means every one is damaged.
    if (!reader.ok()) return absl::DataLossError(reader.status().message());
    *dir = CommittedCheckpointDir(checkpoint, reader->manifest().step());
    return reader;
  }
  *dir = CommittedCheckpointDir(checkpoint, options.step);
  if (!fs::is_directory(*dir, ec)) {
    std::vector<int64_t> steps;
    for (const CommittedCheckpoint& c : committed) steps.push_back(c.step);
    return absl::NotFoundError(absl::StrCat("no committed checkpoint of step ", options.step,
                                            " in ", checkpoint, " (it has steps ",
                                            absl::StrJoin(steps, ", "), ")"));
  }
  absl::StatusOr<CheckpointReader> reader = OpenWhole(*dir);
  if (reader.ok() && reader->manifest().step() != options.step) {
    return absl::DataLossError(absl::StrCat(*dir, " holds the manifest of step ",
                                            reader->manifest().step()));
  }
  return reader;
}

}  // namespace

absl::StatusOr<ExportResult> ExportCheckpoint(const std::string& checkpoint,
                                              const std::string& out_path,
                                              const ExportOptions& options) {
  ExportResult result;
  absl::StatusOr<CheckpointReader> reader =
      OpenForExport(checkpoint, options, &result.checkpoint_dir, &result.skipped);
  if (!reader.ok()) return reader.status();
  const v1::CheckpointManifest& manifest = reader->manifest();
  result.step = manifest.step();

  std::vector<SafetensorsTensor> tensors;
  for (const v1::CheckpointArray& array : manifest.arrays()) {
    SafetensorsTensor t;
    if (absl::StartsWith(array.name(), kParamsPrefix)) {
      t.name = array.name().substr(kParamsPrefix.size());
    } else if (options.include_optimizer && absl::StartsWith(array.name(), kOptimizerPrefix)) {
      t.name = array.name();
    } else {
      result.left_out.push_back(array.name());
      continue;
    }
    absl::StatusOr<Tensor> value = reader->ReadWhole(array.name());
    if (!value.ok()) return value.status();
    t.dtype = SafetensorsDtype::kF32;
    t.shape = value->shape();
    t.bytes.assign(reinterpret_cast<const char*>(value->data()),
                   static_cast<size_t>(value->size()) * sizeof(float));
    result.tensors.push_back(t.name);
    tensors.push_back(std::move(t));
  }
  if (tensors.empty()) {
    std::vector<std::string> names;
    for (const v1::CheckpointArray& array : manifest.arrays()) names.push_back(array.name());
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint of step ", result.step, " in ", result.checkpoint_dir, " has no ",
        kParamsPrefix, " array to export (it has ",
        names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
  }
  std::sort(result.tensors.begin(), result.tensors.end());

  std::vector<std::string> axes(manifest.mesh().axis_names().begin(),
                                manifest.mesh().axis_names().end());
  absl::StatusOr<std::string> contents =
      EncodeSafetensors(tensors, {{"format", "substrax-export"},
                                  {"step", absl::StrCat(result.step)},
                                  {"mesh_axes", absl::StrJoin(axes, ",")},
                                  {"mesh_shape", absl::StrJoin(manifest.mesh().shape(), ",")}});
  if (!contents.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot export the checkpoint in ",
                                                   result.checkpoint_dir, ": ",
                                                   contents.status().message()));
  }
  tensors.clear();  // the bytes are in `contents` now
  // A temporary file beside out_path, fsync'd, renamed over it, the directory fsync'd.
  if (absl::Status s = pki::WritePublicFile(out_path, *contents); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("cannot export the checkpoint of step ",
                                                      result.step, ": ", s.message()));
  }
  result.bytes = static_cast<int64_t>(contents->size());
  return result;
}

}  // namespace substrax
