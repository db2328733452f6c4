// Preemption: a running attempt asked to checkpoint and stop so that another job can start
// (the policy's decision, scheduler.h), and the policy's view of the jobs.
//
// A preempted attempt stays RUNNING, with Job.preemption set, and keeps its devices: its
// processes get SIGTERM and the grace to write a final checkpoint while their attempt token, the
// rendezvous store and checkpoint reports still work. Once every process has stopped (reported
// an outcome, or vanished from its worker's heartbeats), or past the deadline, the attempt ends
// and the job goes back to PENDING with a transition naming who preempted it and the work lost.
// A preemption is not a failure: it uses no restart and waits no backoff.
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/cluster.h"
#include "coordinator/cluster_internal.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "rpc/proto_time.h"

namespace substrax {

namespace {

// The job's estimate of the time it still needs: what is left of max_duration_seconds, else
// its steps left at its measured pace (Job.progress); InfiniteDuration when neither is known.
absl::Duration RemainingEstimate(const v1::Job& job, absl::Duration ran) {
  const v1::JobSpec& spec = job.spec();
  if (spec.max_duration_seconds() > 0) {
    return std::max(absl::ZeroDuration(), absl::Seconds(spec.max_duration_seconds()) - ran);
  }
  const v1::JobProgress& progress = job.progress();
  const int64_t batch = spec.batch().global_batch_size();
  if (progress.total_steps() > 0 && progress.samples_per_second() > 0 && batch > 0) {
    const int64_t left = std::max<int64_t>(0, progress.total_steps() - progress.step());
    return absl::Seconds(static_cast<double>(left * batch) / progress.samples_per_second());
  }
  return absl::InfiniteDuration();
}

}  // namespace

std::string cluster_internal::PoolName(v1::Backend backend, const std::vector<Device>& alive) {
  const std::vector<Device> devices = DevicesForBackend(backend, alive);
  const bool cuda = backend == v1::BACKEND_CUDA ||
                    (!devices.empty() && devices.front().kind == DeviceKind::kCuda);
  return BackendName(cuda ? v1::BACKEND_CUDA : v1::BACKEND_CPU);
}

scheduling::PendingJob Cluster::PendingViewLocked(const JobEntry& entry,
                                                  const std::vector<int>& sizes,
                                                  const std::string& pool) const {
  const v1::Job& job = entry.job;
  scheduling::PendingJob view;
  view.id = job.id();
  view.queue = job.queue();
  view.priority = job.priority();
  view.priority_class = job.priority_class();
  view.pool = pool;
  for (int size : sizes) {
    view.sizes.push_back(RequiredDevices(SpecWithDataParallelSize(job.spec(), size)));
  }
  view.order = entry.order;
  const absl::Duration ran = entry.first_start == absl::InfinitePast()
                                 ? absl::ZeroDuration()
                                 : lease_clock_() - entry.first_start;
  view.estimate = RemainingEstimate(job, ran);
  return view;
}

scheduling::RunningJob Cluster::RunningViewLocked(const JobEntry& entry) const {
  const v1::Job& job = entry.job;
  const absl::Time now = lease_clock_();
  scheduling::RunningJob view;
  view.id = job.id();
  view.queue = job.queue();
  view.priority = job.priority();
  view.priority_class = job.priority_class();
  view.pool = BackendName(entry.mesh.has_value() && !entry.mesh->devices().empty() &&
                                  entry.mesh->devices().front().kind == DeviceKind::kCuda
                              ? v1::BACKEND_CUDA
                              : v1::BACKEND_CPU);
  for (const Process& process : entry.processes) {
    view.devices += static_cast<int64_t>(process.device_ids.size());
  }
  view.started = entry.attempt_start;
  const absl::Duration left = RemainingEstimate(
      job, entry.first_start == absl::InfinitePast() ? absl::ZeroDuration()
                                                     : now - entry.first_start);
  if (left != absl::InfiniteDuration()) view.expected_end = now + left;
  view.preemptible = !job.spec().has_preemptible() || job.spec().preemptible();
  view.preempting = job.has_preemption();
  if (view.preempting) {
    view.preempted_for = job.preemption().for_job();
    view.expected_end = std::min(view.expected_end, entry.preemption_deadline);
  }
  if (job.checkpoints_size() > 0 && job.checkpoints(0).has_time()) {
    view.last_checkpoint = RebaseLocked(FromProtoTime(job.checkpoints(0).time()));
  }
  return view;
}

void Cluster::ResumeLoadedAttemptLocked(JobEntry& entry) {
  const v1::Job& job = entry.job;
  for (auto t = job.transitions().rbegin(); t != job.transitions().rend(); ++t) {
    if (t->to() == v1::JOB_STATE_RUNNING && t->from() != v1::JOB_STATE_RUNNING) {
      entry.attempt_start = RebaseLocked(FromProtoTime(t->time()));
      break;
    }
  }
  // The detector's window starts again: what it flagged before is flagged again when it still
  // holds (a device cleared meanwhile would never be).
  entry.job.clear_stragglers();
  StartStragglerDetectorLocked(entry);
  if (!job.has_preemption()) return;
  // A preemption in progress goes on: its stop events again (the daemons may not have had
  // them), and at least a grace from now, since the restart may have delayed them.
  entry.preemption_deadline =
      std::max(RebaseLocked(FromProtoTime(job.preemption().deadline_time())),
               lease_clock_() + absl::Seconds(scheduler_.config().preemption_grace_seconds()) +
                   options_.heartbeat_timeout);
  PushPreemptEventsLocked(entry);
}

void Cluster::PushPreemptEventsLocked(JobEntry& entry) {
  const v1::Job& job = entry.job;
  const absl::Duration grace = absl::Seconds(scheduler_.config().preemption_grace_seconds());
  for (const Process& process : entry.processes) {
    if (process.succeeded || process.stopped) continue;
    v1::WatchAssignmentsResponse event;
    v1::StopAttempt* stop = event.mutable_stop();
    stop->set_job_id(job.id());
    stop->set_attempt(job.attempt());
    stop->set_reason(absl::StrCat("preempted for job ", job.preemption().for_job(), ": ",
                                  job.preemption().reason()));
    stop->set_preempt(true);
    *stop->mutable_grace() = ToProtoDuration(grace);
    PushEventLocked(process.worker_id, std::move(event));
  }
}

void Cluster::PreemptLocked(JobEntry& victim, const std::string& for_job,
                            const std::string& reason) {
  v1::Job& job = victim.job;
  const absl::Duration grace = absl::Seconds(scheduler_.config().preemption_grace_seconds());
  // The agents kill the processes after the grace; the heartbeats that say so take up to a
  // heartbeat timeout more.
  const absl::Duration deadline = grace + options_.heartbeat_timeout;
  v1::JobPreemption* preemption = job.mutable_preemption();
  preemption->set_for_job(for_job);
  preemption->set_reason(reason);
  *preemption->mutable_requested_time() = ToProtoTime(clock_());
  *preemption->mutable_deadline_time() = ToProtoTime(clock_() + deadline);
  victim.preemption_deadline = lease_clock_() + deadline;
  PushPreemptEventsLocked(victim);
  TransitionLocked(victim, v1::JOB_STATE_RUNNING,
                   absl::StrCat("preempted for job ", for_job, " (", reason,
                                "): asked to checkpoint and stop within ",
                                absl::FormatDuration(grace)));
}

void Cluster::NotePreemptedStoppedLocked(JobEntry& entry, const std::string& worker_id,
                                         EndedAttempts* ended) {
  for (Process& process : entry.processes) {
    if (worker_id.empty() || process.worker_id == worker_id) process.stopped = true;
  }
  MarkJobChangedLocked(entry);
  const bool all = std::all_of(entry.processes.begin(), entry.processes.end(),
                               [](const Process& p) { return p.stopped || p.succeeded; });
  if (all) FinishPreemptionLocked(entry, "its processes stopped", ended);
}

void Cluster::FinishPreemptionLocked(JobEntry& entry, const std::string& how,
                                     EndedAttempts* ended) {
  v1::Job& job = entry.job;
  const absl::Time now = lease_clock_();
  int64_t devices = 0;
  for (const Process& process : entry.processes) {
    devices += static_cast<int64_t>(process.device_ids.size());
  }
  // The work since the newest checkpoint (of this attempt), or since the attempt started.
  absl::Time kept = entry.attempt_start == absl::InfinitePast() ? now : entry.attempt_start;
  std::string since = "since the attempt started (no checkpoint of it)";
  if (job.checkpoints_size() > 0 && job.checkpoints(0).has_time()) {
    const absl::Time checkpoint = RebaseLocked(FromProtoTime(job.checkpoints(0).time()));
    if (checkpoint >= kept) {
      kept = checkpoint;
      since = absl::StrCat("since its checkpoint of step ", job.checkpoints(0).step());
    }
  }
  const double lost =
      static_cast<double>(devices) * std::max(0.0, absl::ToDoubleSeconds(now - kept));
  const std::string reason =
      absl::StrCat("preempted for job ", job.preemption().for_job(), " (",
                   job.preemption().reason(), "); ", how, "; ",
                   absl::StrFormat("%.0f", lost), " device-seconds of work lost ", since,
                   "; it resumes from its newest checkpoint when it is scheduled again");
  EndAttemptLocked(entry, absl::StrCat("preempted for job ", job.preemption().for_job()), "",
                   ended);
  job.set_preemptions(job.preemptions() + 1);
  job.set_work_lost_device_seconds(job.work_lost_device_seconds() + lost);
  TransitionLocked(entry, v1::JOB_STATE_PENDING, reason);
}

}  // namespace substrax
