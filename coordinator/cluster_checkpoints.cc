// Checkpoints as the runners report them: where an attempt resumed from, and which committed
// checkpoints a job's directory holds. The coordinator reads no checkpoint directory itself
// (they live on the workers' file systems); what it shows is what process 0 last reported.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/cluster.h"
#include "coordinator/cluster_internal.h"
#include "coordinator/limits.h"
#include "core/data_paths.h"
#include "core/status.h"

namespace substrax {
namespace {

// The directories a record of `spec`'s job may name: its checkpoint directory, and what it
// resumed from.
bool UnderJobDirectories(const v1::JobSpec& spec, const std::string& path) {
  for (const auto& [field, dir] : CheckpointPaths(spec)) {
    if (IsUnderRoot(path, dir)) return true;
  }
  return false;
}

absl::Status CheckRecords(const v1::ReportCheckpointsRequest& request, const v1::JobSpec& spec) {
  const auto& records = request.listing().checkpoints();
  if (records.size() > limits::kMaxCheckpointRecords) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listing: ", records.size(), " checkpoints, more than the limit of ",
        limits::kMaxCheckpointRecords));
  }
  std::vector<const v1::CheckpointRecord*> all;
  for (const v1::CheckpointRecord& r : records) all.push_back(&r);
  if (request.has_resumed()) {
    if (request.resumed().step() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("resumed.step: must be >= 0, got ", request.resumed().step()));
    }
    if (request.resumed().skipped_size() > limits::kMaxCheckpointRecords) {
      return absl::InvalidArgumentError("resumed.skipped: too many entries");
    }
  }
  for (size_t i = 0; i < all.size(); ++i) {
    const v1::CheckpointRecord& r = *all[i];
    if (r.step() < 0 || r.size_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("listing.checkpoints[", i, "]: step and size must be >= 0"));
    }
    SUBSTRAX_RETURN_IF_ERROR(CheckName(absl::StrCat("listing.checkpoints[", i, "].mesh"), r.mesh()));
    if (r.path().size() > limits::kMaxPathBytes || !CheckNormalizedAbsolute(r.path()).ok() ||
        !UnderJobDirectories(spec, r.path())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "listing.checkpoints[", i, "].path: '", BoundedText(r.path(), 256),
          "' is not in the job's checkpoint directory"));
    }
  }
  return absl::OkStatus();
}

// What a resume report says, for the job's transitions.
std::string ResumeReason(int attempt, const v1::JobSpec& spec, const v1::CheckpointResume& r) {
  std::string reason =
      r.step() > 0
          ? absl::StrCat("attempt ", attempt, " resumed from the checkpoint of step ", r.step(),
                         " (", r.path(), ")")
          : absl::StrCat("attempt ", attempt, " started from the beginning: no whole checkpoint in ",
                         spec.resume_from().empty() ? spec.checkpoint().directory()
                                                    : spec.resume_from());
  if (r.skipped_size() > 0) {
    absl::StrAppend(&reason, "; skipped ",
                    BoundedText(absl::StrJoin(r.skipped(), "; "), limits::kMaxSkippedBytes));
  }
  return reason;
}

}  // namespace

absl::Status Cluster::ReportCheckpoints(const v1::ReportCheckpointsRequest& request,
                                        const std::string& reporter) {
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    SUBSTRAX_RETURN_IF_ERROR(CheckAttemptRunningLocked(request.job_id(), request.attempt()));
    JobEntry& entry = jobs_.at(request.job_id());
    v1::Job& job = entry.job;
    if (!reporter.empty() &&
        (entry.processes.empty() || entry.processes[0].worker_id != reporter)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", reporter, " does not run process 0 of job ", job.id(), " attempt ",
          job.attempt(), ": only process 0 reports checkpoints"));
    }
    SUBSTRAX_RETURN_IF_ERROR(CheckRecords(request, job.spec()));
    if (request.has_resumed()) {
      const v1::CheckpointResume& resumed = request.resumed();
      job.set_resumed_from_step(resumed.step());
      MarkJobChangedLocked(entry);
      // A note in the job's history (the state stays RUNNING) when there is news: a resume, a
      // skipped checkpoint, or a restart that found nothing to resume from.
      if (resumed.step() > 0 || resumed.skipped_size() > 0 || job.attempt() > 1) {
        TransitionLocked(entry, v1::JOB_STATE_RUNNING,
                         ResumeReason(job.attempt(), job.spec(), resumed));
      }
    }
    if (request.has_listing()) {
      *job.mutable_checkpoints() = request.listing().checkpoints();
      MarkJobChangedLocked(entry);
    }
    ticket = EnqueueLocked();
  }
  NotifyEnded({});
  return writer_->Wait(ticket);
}

}  // namespace substrax
