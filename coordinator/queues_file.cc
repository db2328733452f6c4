#include "coordinator/queues_file.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "coordinator/scheduler.h"
#include "core/status.h"

namespace substrax {

namespace {

absl::StatusOr<std::string> ReadBounded(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadWholeFile(path);
  if (!bytes.ok()) return Annotate(bytes.status(), "--queues");
  if (bytes->size() > QueuesFile::kMaxBytes) {
    return absl::FailedPreconditionError(absl::StrCat("--queues: ", path, " is larger than ",
                                                      QueuesFile::kMaxBytes, " bytes"));
  }
  return bytes;
}

}  // namespace

absl::StatusOr<QueuesFile> QueuesFile::Load(const std::string& path, absl::Time now) {
  QueuesFile file;
  file.path_ = path;
  absl::StatusOr<std::string> bytes = ReadBounded(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<v1::SchedulingConfig> config = scheduling::ParseSchedulingConfig(*bytes, path);
  if (!config.ok()) return config.status();
  file.bytes_ = *std::move(bytes);
  file.config_ = *std::move(config);
  file.loaded_at_ = now;
  return file;
}

QueuesFile::Change QueuesFile::Poll(absl::Time now) {
  Change change;
  absl::StatusOr<std::string> bytes = ReadBounded(path_);
  if (!bytes.ok()) {
    // A file replaced in two steps (a ConfigMap's symlink swap) may be missing for a moment;
    // the configuration in force stays, and the error is reported once.
    const std::string error = std::string(bytes.status().message());
    if (error != error_) change.refused = error;
    error_ = error;
    bytes_.clear();
    return change;
  }
  if (*bytes == bytes_) return change;
  bytes_ = *bytes;
  absl::StatusOr<v1::SchedulingConfig> config = scheduling::ParseSchedulingConfig(*bytes, path_);
  if (!config.ok()) {
    error_ = std::string(config.status().message());
    change.refused = error_;
    return change;
  }
  error_.clear();
  config_ = *config;
  loaded_at_ = now;
  change.config = *std::move(config);
  return change;
}

}  // namespace substrax
