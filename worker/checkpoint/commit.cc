#include "worker/checkpoint/commit.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"
#include "rpc/pki.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

constexpr char kCommittedPrefix[] = "step-";

// Makes a rename or a new entry in `dir` durable.
absl::Status SyncDirectory(const std::string& dir) {
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || fsync(fd) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot sync directory ", dir, ": ", std::strerror(error)));
  }
  close(fd);
  return absl::OkStatus();
}

// The job that wrote the committed checkpoint in `dir` (its manifest's job_id); nullopt when
// the manifest cannot be read (no job's: never counted or removed by keep_last, replaced by a
// commit of the same step, since no reader would take it).
std::optional<std::string> JobOfCheckpoint(const std::string& dir) {
  absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(dir);
  if (!reader.ok()) return std::nullopt;
  return reader->manifest().job_id();
}

std::string DescribeJob(const std::string& job_id) {
  return job_id.empty() ? "a run outside any job" : absl::StrCat("job ", job_id);
}

}  // namespace

std::string CommittedCheckpointDir(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/%s%012d", dir, kCommittedPrefix, step);
}

std::string StagingCheckpointDir(const std::string& dir, int64_t step) {
  return absl::StrFormat("%s/.staging-%s%012d", dir, kCommittedPrefix, step);
}

absl::Status WriteShardFile(const std::string& dir, int64_t step, const ProcessShards& shards) {
  const std::string staging = StagingCheckpointDir(dir, step);
  std::error_code ec;
  fs::create_directories(staging, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", staging, ": ", ec.message()));
  }
  const std::string path = absl::StrCat(staging, "/", shards.entry.name());
  if (absl::Status s = pki::WritePublicFile(path, shards.contents); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("checkpoint of step ", step, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status CommitCheckpoint(const std::string& dir, const v1::CheckpointManifest& manifest,
                              int keep_last) {
  const std::string staging = StagingCheckpointDir(dir, manifest.step());
  for (const v1::CheckpointFile& file : manifest.files()) {
    std::error_code ec;
    const std::string path = absl::StrCat(staging, "/", file.name());
    const uintmax_t size = fs::file_size(path, ec);
    if (ec || static_cast<int64_t>(size) != file.size_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint of step ", manifest.step(), " not committed: ", path,
          ec ? " is missing" : absl::StrCat(" has ", size, " bytes, not ", file.size_bytes())));
    }
  }
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(manifest, &json, options).ok()) {
    return absl::InternalError("cannot encode the checkpoint manifest");
  }
  // The manifest is written last: a directory with one is whole.
  if (absl::Status s = pki::WritePublicFile(staging + "/manifest.json", json); !s.ok()) {
    return absl::UnavailableError(absl::StrCat("checkpoint of step ", manifest.step(),
                                               " not committed: ", s.message()));
  }
  const std::string committed = CommittedCheckpointDir(dir, manifest.step());
  std::error_code ec;
  // A previous attempt's checkpoint of the same step is replaced; another job's never is.
  if (fs::exists(committed, ec)) {
    const std::optional<std::string> writer = JobOfCheckpoint(committed);
    if (writer.has_value() && *writer != manifest.job_id()) {
      fs::remove_all(staging, ec);
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint of step ", manifest.step(), " not committed: ", committed, " holds ",
          DescribeJob(*writer), "'s checkpoint of that step, which ", DescribeJob(manifest.job_id()),
          " does not replace; give each job a checkpoint directory of its own"));
    }
  }
  fs::remove_all(committed, ec);
  if (std::rename(staging.c_str(), committed.c_str()) != 0) {
    return absl::UnavailableError(absl::StrCat("checkpoint of step ", manifest.step(),
                                               " not committed: cannot rename ", staging, " to ",
                                               committed, ": ", std::strerror(errno)));
  }
  if (absl::Status s = SyncDirectory(dir); !s.ok()) return s;
  if (keep_last > 0) {
    // Only this job's own count and go: a directory shared with another job (the same owner's
    // earlier run, resumed from) keeps that job's checkpoints.
    size_t kept = 0;
    for (const CommittedCheckpoint& c : ListCheckpoints(dir)) {
      if (JobOfCheckpoint(c.path) != manifest.job_id()) continue;
      if (++kept > static_cast<size_t>(keep_last)) fs::remove_all(c.path, ec);
    }
  }
  return absl::OkStatus();
}

std::vector<CommittedCheckpoint> ListCheckpoints(const std::string& dir) {
  std::vector<CommittedCheckpoint> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int64_t step = 0;
    if (name.rfind(kCommittedPrefix, 0) != 0 || !it->is_directory() ||
        !absl::SimpleAtoi(name.substr(sizeof(kCommittedPrefix) - 1), &step)) {
      continue;
    }
    out.push_back({step, it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.step > b.step; });
  return out;
}

absl::StatusOr<CheckpointReader> OpenLatestValid(const std::string& dir,
                                                 std::vector<std::string>* skipped) {
  std::vector<std::string> why;
  for (const CommittedCheckpoint& c : ListCheckpoints(dir)) {
    absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(c.path);
    absl::Status whole = reader.ok() ? reader->VerifyAll() : reader.status();
    if (whole.ok() && reader->manifest().step() != c.step) {
      whole = absl::DataLossError(absl::StrCat(c.path, " holds the manifest of step ",
                                               reader->manifest().step()));
    }
    if (whole.ok()) {
      if (skipped != nullptr) *skipped = why;
      return reader;
    }
    why.push_back(absl::StrCat("step ", c.step, ": ", whole.message()));
  }
  if (skipped != nullptr) *skipped = why;
  return absl::NotFoundError(
      why.empty() ? absl::StrCat("no committed checkpoint in ", dir)
                  : absl::StrCat("no whole checkpoint in ", dir, ": ", absl::StrJoin(why, "; ")));
}

}  // namespace substrax
