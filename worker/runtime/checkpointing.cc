#include "worker/runtime/checkpointing.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/data_paths.h"
#include "core/sharding.h"
#include "core/status.h"
#include "rpc/proto_time.h"
#include "worker/checkpoint/commit.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

// Keys in the attempt's store.
constexpr char kResumeKey[] = "checkpoint/resume";
constexpr char kCommitKey[] = "checkpoint/commit";
std::string FileKey(int process) { return absl::StrCat("checkpoint/file/", process); }

// "<step> <rest>" -> (step, rest).
bool ParseStepValue(const std::string& value, int64_t* step, std::string* rest) {
  const size_t space = value.find(' ');
  if (space == std::string::npos || !absl::SimpleAtoi(value.substr(0, space), step)) return false;
  *rest = value.substr(space + 1);
  return true;
}

// The layout of state array `name` over `mesh`.
absl::StatusOr<ShardLayout> StateLayout(const std::string& name, const Mesh& mesh,
                                        const std::vector<ParamSpec>& params,
                                        ParamSpec* spec_out = nullptr) {
  SUBSTRAX_ASSIGN_OR_RETURN(ParamSpec spec, StateArraySpec(name, params));
  SUBSTRAX_ASSIGN_OR_RETURN(NamedSharding sharding, NamedSharding::Create(mesh, spec.partition));
  if (spec_out != nullptr) *spec_out = spec;
  return sharding.Layout(spec.shape);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// Staging directories an earlier attempt left (it stopped while saving): never committed.
void RemoveStaging(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (absl::StartsWith(it->path().filename().string(), ".staging-")) {
      std::error_code ignored;
      fs::remove_all(it->path(), ignored);
    }
  }
}

}  // namespace

absl::Status CheckCheckpointDirectory(const std::string& field, const std::string& dir,
                                      const std::optional<std::vector<std::string>>& roots) {
  if (absl::Status s = CheckNormalizedAbsolute(dir); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": '", dir, "' ", s.message()));
  }
  if (!roots.has_value()) return absl::OkStatus();
  const std::string* root = FindRoot(dir, *roots);
  if (root == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", dir, "' is not under a checkpoint root of this worker (",
        roots->empty() ? "it has none: start the daemon with --checkpoint-root DIR"
                       : absl::StrJoin(*roots, ", "),
        ")"));
  }
  // The part that exists, with its symlinks resolved, must stay beneath the root (resolved too).
  std::error_code ec;
  const fs::path real_root = fs::weakly_canonical(*root, ec);
  const fs::path real_dir = ec ? fs::path() : fs::weakly_canonical(dir, ec);
  if (ec || !IsUnderRoot(real_dir.lexically_normal().string(),
                         real_root.lexically_normal().string())) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", dir, "' leaves the checkpoint root ", *root,
        ec ? absl::StrCat(" or cannot be resolved (", ec.message(), ")")
           : absl::StrCat(" through a symbolic link (it resolves to ", real_dir.string(), ")")));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParamSpec> StateArraySpec(const std::string& name,
                                         const std::vector<ParamSpec>& params) {
  std::string param;
  if (absl::StartsWith(name, kParamsPrefix)) {
    param = name.substr(kParamsPrefix.size());
  } else if (absl::StartsWith(name, kOptimizerPrefix) && name.rfind('/') > kOptimizerPrefix.size()) {
    // "optimizer/<param>/<slot>": a slot has its parameter's shape and layout.
    param = name.substr(kOptimizerPrefix.size(), name.rfind('/') - kOptimizerPrefix.size());
  }
  for (const ParamSpec& p : params) {
    if (p.name == param) return p;
  }
  return absl::NotFoundError(absl::StrCat("state array '", name, "' is no parameter's"));
}

v1::CheckpointListing DescribeCheckpoints(const std::string& dir) {
  v1::CheckpointListing listing;
  for (const CommittedCheckpoint& c : ListCheckpoints(dir)) {
    absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(c.path);
    if (!reader.ok()) continue;  // not readable: not a checkpoint anyone can resume from
    v1::CheckpointRecord* record = listing.add_checkpoints();
    record->set_step(c.step);
    record->set_path(c.path);
    const std::string manifest = c.path + "/manifest.json";
    struct stat st {};
    int64_t size = 0;
    if (stat(manifest.c_str(), &st) == 0) {
      size = st.st_size;
      *record->mutable_time() = ToProtoTime(absl::TimeFromTimespec(st.st_mtim));
    }
    for (const v1::CheckpointFile& f : reader->manifest().files()) size += f.size_bytes();
    record->set_size_bytes(size);
    absl::StatusOr<Mesh> mesh = Mesh::FromProto(reader->manifest().mesh());
    record->set_mesh(mesh.ok() ? mesh->ShapeString() : "unknown");
  }
  return listing;
}

absl::StatusOr<ResumePoint> FindResumePoint(const std::string& directory,
                                            const std::string& resume_from, int process_index,
                                            Store* store, absl::Duration timeout) {
  ResumePoint point;
  if (process_index != 0) {
    SUBSTRAX_ASSIGN_OR_RETURN(std::string value, store->Get(kResumeKey, timeout));
    int64_t step = 0;
    std::string rest;
    if (!ParseStepValue(value, &step, &rest)) {
      return absl::FailedPreconditionError(absl::StrCat("process 0 could not resume: ", value));
    }
    point.report.set_step(step);
    if (step == 0) return point;
    point.report.set_path(rest);
    SUBSTRAX_ASSIGN_OR_RETURN(CheckpointReader reader, CheckpointReader::Open(rest));
    point.reader.emplace(std::move(reader));
    return point;
  }

  auto choose = [&]() -> absl::Status {
    std::vector<std::string> skipped;
    if (!directory.empty()) {
      RemoveStaging(directory);
      absl::StatusOr<CheckpointReader> reader = OpenLatestValid(directory, &skipped);
      for (const std::string& s : skipped) point.report.add_skipped(s);
      if (reader.ok()) {
        point.reader.emplace(*std::move(reader));
        return absl::OkStatus();
      }
    }
    if (resume_from.empty()) return absl::OkStatus();  // from the beginning
    std::error_code ec;
    if (fs::exists(resume_from + "/manifest.json", ec)) {
      absl::StatusOr<CheckpointReader> reader = CheckpointReader::Open(resume_from);
      absl::Status whole = reader.ok() ? reader->VerifyAll() : reader.status();
      if (!whole.ok()) {
        return absl::DataLossError(absl::StrCat("spec.resume_from: the checkpoint ", resume_from,
                                                " is damaged: ", whole.message()));
      }
      point.reader.emplace(*std::move(reader));
      return absl::OkStatus();
    }
    absl::StatusOr<CheckpointReader> reader = OpenLatestValid(resume_from, &skipped);
    if (!reader.ok()) {
      return absl::NotFoundError(
          absl::StrCat("spec.resume_from: ", reader.status().message()));
    }
    for (const std::string& s : skipped) point.report.add_skipped(s);
    point.reader.emplace(*std::move(reader));
    return absl::OkStatus();
  };
  const absl::Status chosen = choose();
  if (!chosen.ok()) {
    // The other processes stop waiting at once, with the reason.
    store->Set(kResumeKey, std::string(chosen.message())).IgnoreError();
    return chosen;
  }
  if (point.reader.has_value()) {
    point.report.set_step(point.reader->manifest().step());
    point.report.set_path(point.reader->dir());
  }
  SUBSTRAX_RETURN_IF_ERROR(
      store->Set(kResumeKey, absl::StrCat(point.report.step(), " ", point.report.path())));
  return point;
}

absl::Status ReadDeviceState(CheckpointReader& reader, const Mesh& mesh, int device_id,
                             const std::vector<ParamSpec>& params, TensorTree* state) {
  std::map<std::string, const v1::CheckpointArray*> saved;
  for (const v1::CheckpointArray& a : reader.manifest().arrays()) saved[a.name()] = &a;
  for (auto& [name, tensor] : *state) {
    ParamSpec spec;
    SUBSTRAX_ASSIGN_OR_RETURN(ShardLayout layout, StateLayout(name, mesh, params, &spec));
    auto it = saved.find(name);
    if (it == saved.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint in ", reader.dir(), " has no array '", name,
          "': it was saved by another model or optimizer; resume from a checkpoint of this "
          "job's model, or use another checkpoint.directory"));
    }
    const std::vector<int64_t> saved_shape(it->second->global_shape().begin(),
                                           it->second->global_shape().end());
    if (saved_shape != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the checkpoint in ", reader.dir(), " holds '", name, "' of shape ",
          ShapeText(saved_shape), ", but this job's model has ", ShapeText(spec.shape)));
    }
    SUBSTRAX_ASSIGN_OR_RETURN(ShardSlice slice, layout.ForDevice(device_id));
    SUBSTRAX_ASSIGN_OR_RETURN(Tensor block, reader.ReadBlock(name, slice.index));
    if (block.shape() != tensor.shape()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "block of '", name, "' read with shape ", block.ShapeString(), ", the device holds ",
          tensor.ShapeString()));
    }
    tensor = std::move(block);
  }
  return absl::OkStatus();
}

absl::Status RestoreDevice(CheckpointReader& reader, int64_t step, const Mesh& mesh,
                           int device_id, DeviceBackend& backend) {
  SUBSTRAX_ASSIGN_OR_RETURN(TensorTree state, backend.SaveState());
  SUBSTRAX_RETURN_IF_ERROR(ReadDeviceState(reader, mesh, device_id, backend.params(), &state));
  return backend.RestoreState(state, step);
}

// ---------------------------------------------------------------------------------------------
// Checkpointer

Checkpointer::Checkpointer(CheckpointerOptions options)
    : options_(std::move(options)), writer_([this] { WriterLoop(); }) {}

Checkpointer::~Checkpointer() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
}

absl::Status Checkpointer::Submit(int device_id, int64_t step, TensorTree state) {
  absl::MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  if (std::find(options_.local_devices.begin(), options_.local_devices.end(), device_id) ==
      options_.local_devices.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("device ", device_id, " is not one of this process's"));
  }
  if (gathering_.devices.empty()) gathering_.step = step;
  if (gathering_.step != step) {
    return absl::InternalError(absl::StrCat("device ", device_id, " saves step ", step,
                                            " while another saves step ", gathering_.step));
  }
  gathering_.devices[device_id] = std::move(state);
  if (gathering_.devices.size() < options_.local_devices.size()) return absl::OkStatus();
  queue_.push_back(std::exchange(gathering_, Snapshot()));
  // One checkpoint written and one queued at most: host memory holds two copies of the state.
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.size() <= 1 || !error_.ok();
  };
  mu_.Await(absl::Condition(&room));
  return error_;
}

absl::Status Checkpointer::Flush() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (queue_.empty() && !writing_) || !error_.ok();
  };
  mu_.Await(absl::Condition(&idle));
  return error_;
}

void Checkpointer::WriterLoop() {
  while (true) {
    Snapshot snapshot;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stop_ || queue_.empty()) return;
      snapshot = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    absl::Status written = Write(snapshot);
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!written.ok() && error_.ok()) error_ = written;
    if (!error_.ok()) queue_.clear();  // the job stops; nothing more is written
  }
}

absl::StatusOr<std::string> Checkpointer::AwaitStep(const std::string& key, int64_t step) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Duration pause = absl::Milliseconds(5);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return absl::CancelledError("the checkpointer is stopping");
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    absl::StatusOr<std::string> value =
        options_.store->Get(key, std::min(left, absl::Milliseconds(200)));
    if (value.ok()) {
      int64_t at = 0;
      std::string rest;
      if (ParseStepValue(*value, &at, &rest) && at >= step) return rest;
      absl::SleepFor(pause);  // the value of an earlier checkpoint: not there yet
      pause = std::min(pause * 2, absl::Milliseconds(100));
    } else if (value.status().code() != absl::StatusCode::kDeadlineExceeded) {
      return value.status();
    }
  }
  return absl::DeadlineExceededError(
      absl::StrCat("checkpoint of step ", step, ": '", key, "' did not arrive within ",
                   absl::FormatDuration(options_.timeout)));
}

absl::Status Checkpointer::Write(const Snapshot& snapshot) {
  const int64_t step = snapshot.step;
  const int p = options_.process_index;
  std::map<std::string, LocalArray> arrays;
  for (const auto& [name, tensor] : snapshot.devices.begin()->second) {
    LocalArray& array = arrays[name];
    SUBSTRAX_ASSIGN_OR_RETURN(array.layout, StateLayout(name, *options_.mesh, options_.params));
    for (const auto& [device, state] : snapshot.devices) array.shards[device] = &state.at(name);
  }
  // This process's shard file; a failure is published so that process 0 need not wait for it.
  absl::StatusOr<ProcessShards> shards = EncodeProcessShards(p, arrays);
  absl::Status written =
      shards.ok() ? WriteShardFile(options_.directory, step, *shards) : shards.status();
  SUBSTRAX_RETURN_IF_ERROR(options_.store->Set(
      FileKey(p), absl::StrCat(step, " ", written.ok() ? "ok " + shards->entry.SerializeAsString()
                                                        : "error " + std::string(written.message()))));
  if (!written.ok()) {
    // Process 0's own file failed: the others learn it from the commit key.
    if (p == 0) {
      options_.store->Set(kCommitKey, absl::StrCat(step, " ", written.message())).IgnoreError();
    }
    return written;
  }

  if (p != 0) {
    SUBSTRAX_ASSIGN_OR_RETURN(std::string outcome, AwaitStep(kCommitKey, step));
    if (outcome == "ok") return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("checkpoint of step ", step,
                                               " was not committed: ", outcome));
  }
  // Process 0: every process's entry, the manifest, the commit.
  auto commit = [&]() -> absl::Status {
    std::vector<v1::CheckpointFile> files;
    for (int q = 0; q < options_.num_processes; ++q) {
      SUBSTRAX_ASSIGN_OR_RETURN(std::string entry, AwaitStep(FileKey(q), step));
      if (absl::StartsWith(entry, "error ")) {
        return absl::UnavailableError(absl::StrCat("process ", q, ": ", entry.substr(6)));
      }
      v1::CheckpointFile file;
      if (!absl::StartsWith(entry, "ok ") || !file.ParseFromString(entry.substr(3))) {
        return absl::InternalError(absl::StrCat("process ", q, " published no shard file entry"));
      }
      files.push_back(std::move(file));
    }
    SUBSTRAX_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest,
                              MakeManifest(step, *options_.mesh, arrays, std::move(files)));
    manifest.set_job_id(options_.job_id);
    return CommitCheckpoint(options_.directory, manifest, options_.keep_last);
  };
  const absl::Status committed = commit();
  SUBSTRAX_RETURN_IF_ERROR(options_.store->Set(
      kCommitKey,
      absl::StrCat(step, " ", committed.ok() ? std::string("ok") : std::string(committed.message()))));
  if (!committed.ok()) {
    return Annotate(committed, absl::StrCat("checkpoint of step ", step, " not committed"));
  }
  if (options_.on_commit) options_.on_commit(DescribeCheckpoints(options_.directory));
  return absl::OkStatus();
}

}  // namespace substrax
