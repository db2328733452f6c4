// The SDK's checkpoints: the built-in trainer's format and writer (worker/runtime/checkpointing)
// over a program's own parameters and optimizer.
#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "worker/runtime/device_state.h"
#include "worker/sdk/program_impl.h"

namespace substrax {
namespace {

// How long processes other than 0 wait for process 0 to choose the checkpoint to resume from
// (it reads every shard file of the checkpoints it checks).
constexpr absl::Duration kResumeTimeout = absl::Minutes(10);

}  // namespace

void ProgramImpl::ReportCheckpoints(v1::ReportCheckpointsRequest request) const {
  if (stub_ == nullptr) return;
  request.set_job_id(settings_.job_id);
  request.set_attempt(settings_.attempt);
  // Retries UNAVAILABLE and DEADLINE_EXCEEDED (a coordinator restarting, the network), backing
  // off exponentially, for about a minute.
  absl::Duration backoff = absl::Milliseconds(100);
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::ReportCheckpointsResponse response;
    const grpc::Status status = stub_->ReportCheckpoints(&context, request, &response);
    if (status.ok()) return;
    const bool retry = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                       status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    if (!retry || absl::Now() + backoff > give_up) {
      std::fprintf(stderr, "substrax: checkpoint report not delivered: %s\n",
                   status.error_message().c_str());
      return;
    }
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

void ProgramImpl::ReportResume(const v1::CheckpointResume& resume) const {
  if (resume.step() > 0) {
    std::fprintf(stderr, "substrax: resuming from the checkpoint of step %lld (%s)\n",
                 static_cast<long long>(resume.step()), resume.path().c_str());
  }
  for (const std::string& skipped : resume.skipped()) {
    std::fprintf(stderr, "substrax: checkpoint skipped: %s\n", skipped.c_str());
  }
  v1::ReportCheckpointsRequest request;
  *request.mutable_resumed() = resume;
  ReportCheckpoints(std::move(request));
}

absl::Status ProgramImpl::ConfigureCheckpoints(const CheckpointOptions& options) {
  if (ran_) {
    return absl::FailedPreconditionError(
        "ConfigureCheckpoints must be called before RunOnDevices");
  }
  if (checkpoints_configured_) {
    return absl::FailedPreconditionError("ConfigureCheckpoints was called before");
  }
  const std::string directory =
      options.directory.empty() ? settings_.checkpoint_directory : options.directory;
  const std::string resume_from =
      options.resume_from.empty() ? settings_.resume_from : options.resume_from;
  const int keep_last = options.keep_last >= 0 ? options.keep_last : settings_.checkpoint_keep_last;
  if (directory.empty() && resume_from.empty()) {
    return absl::InvalidArgumentError(
        "ConfigureCheckpoints: no checkpoint directory and nothing to resume from (set "
        "CheckpointOptions::directory, or spec.checkpoint.directory in a job)");
  }
  if (options.shapes.empty()) {
    return absl::InvalidArgumentError(
        "ConfigureCheckpoints: CheckpointOptions::shapes is empty: give every parameter's "
        "global shape");
  }
  // In a job, only under the worker's checkpoint roots (symlinks resolved); standalone anywhere.
  std::optional<std::vector<std::string>> roots;
  if (launch_.has_value()) {
    roots.emplace(launch_->checkpoint_roots().begin(), launch_->checkpoint_roots().end());
  }
  if (!directory.empty()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckCheckpointDirectory("checkpoint directory", directory, roots));
  }
  if (!resume_from.empty()) {
    SUBSTRAX_RETURN_IF_ERROR(CheckCheckpointDirectory("resume_from", resume_from, roots));
  }
  for (const auto& [name, spec] : options.specs) {
    if (options.shapes.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ConfigureCheckpoints: specs names '", name, "', which shapes does not have"));
    }
  }
  checkpoint_params_.clear();
  for (const auto& [name, shape] : options.shapes) {
    ParamSpec param;
    param.name = name;
    param.shape = shape;
    if (auto it = options.specs.find(name); it != options.specs.end()) param.partition = it->second;
    checkpoint_params_.push_back(std::move(param));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(resume_, FindResumePoint(directory, resume_from, process_index_,
                                                     store_.get(), kResumeTimeout));
  if (process_index_ == 0) ReportResume(resume_->report);
  if (resume_->reader.has_value()) {
    absl::MutexLock lock(&mu_);
    printed_step_ = resume_->report.step();  // standalone throughput counts from there
  }
  if (!directory.empty()) {
    CheckpointerOptions writer;
    writer.directory = directory;
    writer.keep_last = keep_last;
    writer.job_id = settings_.job_id;
    writer.mesh = &mesh_;
    writer.process_index = process_index_;
    writer.num_processes = num_processes();
    writer.local_devices = local_device_ids();
    writer.params = checkpoint_params_;
    writer.store = store_.get();
    if (process_index_ == 0) {
      writer.on_commit = [this](const v1::CheckpointListing& listing) {
        v1::ReportCheckpointsRequest request;
        *request.mutable_listing() = listing;
        ReportCheckpoints(std::move(request));
      };
    }
    checkpointer_ = std::make_unique<Checkpointer>(std::move(writer));
  }
  checkpoints_configured_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ProgramImpl::RestoreCheckpoint(const DeviceContext& ctx,
                                                       TensorTree* params, Optimizer& optimizer) {
  if (!checkpoints_configured_) {
    return absl::FailedPreconditionError(
        "RestoreCheckpoint: call ConfigureCheckpoints before RunOnDevices first");
  }
  if (!resume_.has_value() || !resume_->reader.has_value()) return 0;
  const int64_t step = resume_->report.step();
  TensorTree state = DeviceState(*params, optimizer);
  {
    absl::MutexLock lock(&reader_mu_);
    SUBSTRAX_RETURN_IF_ERROR(Annotate(
        ReadDeviceState(*resume_->reader, mesh_, ctx.device.id, checkpoint_params_, &state),
        absl::StrCat("resuming from the checkpoint of step ", step)));
  }
  SUBSTRAX_RETURN_IF_ERROR(Annotate(RestoreDeviceState(state, step, params, optimizer),
                                    absl::StrCat("resuming from the checkpoint of step ", step)));
  return step;
}

absl::Status ProgramImpl::SaveCheckpoint(const DeviceContext& ctx, int64_t step,
                                         const TensorTree& params, const Optimizer& optimizer) {
  if (checkpointer_ == nullptr) {
    return absl::FailedPreconditionError(
        "SaveCheckpoint: no checkpoint directory (ConfigureCheckpoints with a directory, or "
        "spec.checkpoint.directory in a job)");
  }
  return checkpointer_->Submit(ctx.device.id, step, DeviceState(params, optimizer));
}

}  // namespace substrax
