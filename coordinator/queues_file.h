// The --queues file: the scheduling configuration (scheduler.h, docs/scheduling.md) that the
// coordinator reads at start and again whenever its bytes change (a Kubernetes ConfigMap
// update, an edit). A file that does not parse or validate at start refuses the start; on a
// reload it is refused and the configuration in force stays, with the error kept for
// `substraxctl queues` and logged once.
//
// Thread-compatible: one thread polls (the coordinator's reloader).
#ifndef SUBSTRAX_COORDINATOR_QUEUES_FILE_H_
#define SUBSTRAX_COORDINATOR_QUEUES_FILE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "substrax/v1/scheduling.pb.h"

namespace substrax {

class QueuesFile {
 public:
  // Reads and parses `path`. Errors: ReadWholeFile's (NOT_FOUND, PERMISSION_DENIED, ...),
  // INVALID_ARGUMENT (ParseSchedulingConfig's, naming each problem), FAILED_PRECONDITION
  // (larger than kMaxBytes).
  static absl::StatusOr<QueuesFile> Load(const std::string& path, absl::Time now);

  // What one Poll found.
  struct Change {
    // The new configuration, to apply; unset when the file is unchanged or was refused.
    std::optional<v1::SchedulingConfig> config;
    // Why a changed file was refused (empty otherwise); reported once per content.
    std::string refused;
  };
  // Reads the file again; a change of its bytes gives the new configuration or the error.
  Change Poll(absl::Time now);

  const std::string& path() const { return path_; }
  const v1::SchedulingConfig& config() const { return config_; }
  // When the configuration in force was read, and why the file's current bytes are not in force
  // (empty when they are).
  absl::Time loaded_at() const { return loaded_at_; }
  const std::string& error() const { return error_; }

  // Larger files are refused: a configuration is a few kilobytes.
  static constexpr size_t kMaxBytes = 4 << 20;

 private:
  QueuesFile() = default;

  std::string path_;
  // The bytes last read (in force or refused), to see a change.
  std::string bytes_;
  v1::SchedulingConfig config_;
  absl::Time loaded_at_;
  std::string error_;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_QUEUES_FILE_H_
