// Job lifecycle: state transitions, how attempts end (success, failure and restart,
// cancellation), runner reports, and the client-facing queries (submission: cluster_submit.cc).
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/cluster.h"
#include "coordinator/cluster_internal.h"
#include "coordinator/limits.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "core/model_catalog.h"
#include "core/sharding.h"
#include "core/status.h"
#include "rpc/proto_time.h"

namespace substrax {

using cluster_internal::LayoutsFor;
using cluster_internal::StateName;

// ---------------------------------------------------------------------------------------------
// State transitions and how attempts end

void Cluster::RefreshProgressLocked(JobEntry& entry) {
  const v1::Job& job = entry.job;
  if (job.attempt() == 0) return;
  // Job.mesh is the attempt's (an elastic one's current size): every device of every process.
  std::optional<v1::JobProgress> latest =
      metrics_.Latest(job.id(), job.attempt(), job.spec().metrics(), DevicesOf(job.mesh()));
  if (!latest.has_value()) return;
  v1::JobProgress* progress = entry.job.mutable_progress();
  progress->set_step(latest->step());
  *progress->mutable_metrics() = latest->metrics();
  progress->set_samples_per_second(latest->samples_per_second());
}

void Cluster::TransitionLocked(JobEntry& entry, v1::JobState to, const std::string& reason) {
  v1::JobTransition* t = entry.job.add_transitions();
  t->set_from(entry.job.state());
  t->set_to(to);
  *t->mutable_time() = ToProtoTime(clock_());
  t->set_reason(reason);
  t->set_attempt(entry.job.attempt());
  auto* transitions = entry.job.mutable_transitions();
  if (transitions->size() > limits::kMaxTransitionsKept) {
    // Keep the submission and the newest ones.
    transitions->DeleteSubrange(1, transitions->size() - limits::kMaxTransitionsKept);
  }
  entry.job.set_state(to);
  if (to != v1::JOB_STATE_RUNNING) {
    // A preemption ends with its attempt, however that ends.
    entry.job.clear_preemption();
    entry.preemption_deadline = absl::InfiniteFuture();
  }
  NotePendingLocked(entry);
  if (to == v1::JOB_STATE_PENDING) {
    entry.pending_reason = reason;
    entry.pending_since = lease_clock_();
  }
  if (IsTerminalJobState(to)) entry.ended_at = lease_clock_();
  // An ended job's progress is final and stored with it; its recent points are not needed.
  if (IsTerminalJobState(to)) metrics_.Forget(entry.job.id());
  MarkJobChangedLocked(entry);
}

void Cluster::EndAttemptLocked(JobEntry& entry, const std::string& why,
                               const std::string& culprit, EndedAttempts* ended) {
  for (const Process& process : entry.processes) {
    for (int id : process.device_ids) busy_devices_.erase(id);
    // A culprit's runner is gone already; succeeded runners have exited.
    if (process.worker_id == culprit || process.succeeded || why.empty()) continue;
    v1::WatchAssignmentsResponse event;
    v1::StopAttempt* stop = event.mutable_stop();
    stop->set_job_id(entry.job.id());
    stop->set_attempt(entry.job.attempt());
    stop->set_reason(why);
    PushEventLocked(process.worker_id, std::move(event));
  }
  entry.processes.clear();
  entry.mesh.reset();
  ended->emplace_back(entry.job.id(), entry.job.attempt());
}

void Cluster::FailAttemptLocked(JobEntry& entry, const std::string& culprit,
                                const std::string& cause, EndedAttempts* ended, bool retryable) {
  v1::Job& job = entry.job;
  if (job.has_preemption()) {
    // A preempted process that exits, is killed or vanishes has stopped, as asked.
    NotePreemptedStoppedLocked(entry, culprit, ended);
    return;
  }
  std::string where = absl::StrCat("attempt ", job.attempt());
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    if (entry.processes[p].worker_id != culprit) continue;
    absl::StrAppend(&where, ", process ", p, " (devices ",
                    absl::StrJoin(entry.processes[p].device_ids, ", "), ")");
  }
  const std::string error = absl::StrCat(where, ": ", cause);
  EndAttemptLocked(entry, error, culprit, ended);
  // Preemptions are not failures: they use no restart.
  const int restarts_used = job.attempt() - 1 - job.preemptions();
  if (retryable && restarts_used < job.spec().max_restarts()) {
    // Kubernetes Jobs' rule: the wait doubles with each restart, up to a cap.
    absl::Duration backoff = options_.restart_backoff;
    for (int i = 0; i < restarts_used && backoff < options_.max_restart_backoff; ++i) {
      backoff *= 2;
    }
    backoff = std::min(backoff, options_.max_restart_backoff);
    std::string reason = absl::StrCat(error, "; restarting (restart ", restarts_used + 1, " of ",
                                      job.spec().max_restarts(), ")");
    if (backoff > absl::ZeroDuration()) {
      // Waited on the lease clock; the wall time is what users see.
      entry.next_attempt_at = lease_clock_() + backoff;
      *job.mutable_next_attempt_time() = ToProtoTime(clock_() + backoff);
      absl::StrAppend(&reason, " after a backoff of ", absl::FormatDuration(backoff));
    }
    TransitionLocked(entry, v1::JOB_STATE_PENDING, reason);
    return;
  }
  job.set_error(error);
  std::string why = error;
  if (!retryable) {
    absl::StrAppend(&why, "; not restarted: retrying cannot help");
  } else if (job.spec().max_restarts() > 0) {
    absl::StrAppend(&why, "; no restarts left (max_restarts ", job.spec().max_restarts(), ")");
  }
  TransitionLocked(entry, v1::JOB_STATE_FAILED, why);
}

std::string Cluster::SuspendedNoteLocked(const JobEntry& entry, int except) const {
  std::string note;
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    const Process& process = entry.processes[p];
    if (!process.suspended || static_cast<int>(p) == except) continue;
    absl::StrAppend(&note, " (process ", p, " on ", DescribeWorkerLocked(process.worker_id),
                    " is suspended (stopped by a signal) at step ", process.last_step,
                    ": its peers wait for it)");
  }
  return note;
}

void Cluster::CheckProgressLocked(EndedAttempts* ended) {
  const absl::Time lease_now = lease_clock_();
  for (const std::string& id : job_order_) {
    JobEntry& entry = jobs_.at(id);
    const v1::JobSpec& spec = entry.job.spec();
    if (IsTerminalJobState(entry.job.state())) continue;
    if (spec.max_duration_seconds() > 0 && entry.first_start != absl::InfinitePast() &&
        lease_now - entry.first_start > absl::Seconds(spec.max_duration_seconds())) {
      const std::string why =
          absl::StrCat("the job ran longer than its max_duration_seconds (",
                       spec.max_duration_seconds(), " s) over ", entry.job.attempt(),
                       entry.job.attempt() == 1 ? " attempt" : " attempts");
      if (entry.job.state() == v1::JOB_STATE_RUNNING) {
        EndAttemptLocked(entry, why, "", ended);
      }
      entry.job.set_error(why);
      entry.job.clear_next_attempt_time();
      entry.next_attempt_at = absl::InfinitePast();
      TransitionLocked(entry, v1::JOB_STATE_FAILED, why);
      continue;
    }
    if (entry.job.state() != v1::JOB_STATE_RUNNING) continue;
    if (entry.job.has_preemption()) {
      // Checkpointing and stopping: no step is expected; past the deadline it is given up on.
      if (lease_now >= entry.preemption_deadline) {
        FinishPreemptionLocked(entry, "its processes did not all stop within the grace", ended);
      }
      continue;
    }
    const absl::Duration timeout = spec.progress_timeout_seconds() > 0
                                       ? absl::Seconds(spec.progress_timeout_seconds())
                                       : options_.default_progress_timeout;
    // The process whose latest step is the oldest is the one the others wait for.
    const Process* stalled = nullptr;
    size_t index = 0;
    for (size_t p = 0; p < entry.processes.size(); ++p) {
      const Process& process = entry.processes[p];
      if (process.succeeded || lease_now - process.last_progress <= timeout) continue;
      // A command that never reported runs until it exits, max_duration_seconds or a cancel:
      // not every command reports (docs/command-jobs.md).
      if (spec.has_command() && !process.reported) continue;
      // A doctor job reports no steps; max_duration_seconds bounds it.
      if (spec.has_doctor()) continue;
      // A suspended process is the one the others wait for; else the oldest step.
      if (stalled == nullptr || (process.suspended && !stalled->suspended) ||
          (process.suspended == stalled->suspended &&
           process.last_progress < stalled->last_progress)) {
        stalled = &process;
        index = p;
      }
    }
    if (stalled == nullptr) continue;
    // Which rank the others wait for, from the collective counts the processes publish (a
    // command job's: which process's report file went silent first).
    if (const HangAttribution hang = AttributeHangLocked(entry); hang.found) {
      const std::string worker = entry.processes[hang.blamed.front()].worker_id;
      FailAttemptLocked(entry, worker,
                        absl::StrCat("stalled at step ", stalled->last_step, ": ", hang.summary,
                                     "; no new step for ", absl::FormatDuration(timeout),
                                     " (the progress timeout)"),
                        ended);
      continue;
    }
    const std::string worker = stalled->worker_id;
    FailAttemptLocked(entry, worker,
                      absl::StrCat("stalled at step ", stalled->last_step, " on process ", index,
                                   " (", DescribeWorkerLocked(worker), "): no new step for ",
                                   absl::FormatDuration(timeout), " (the progress timeout); ",
                                   stalled->suspended
                                       ? "its runner is suspended (stopped by a signal)"
                                       : "the runner hangs; check its log"),
                      ended);
  }
}

// ---------------------------------------------------------------------------------------------
// Runner reports

absl::Status Cluster::CheckAttemptRunning(const std::string& job_id, int attempt) const {
  absl::MutexLock lock(&mu_);
  return CheckAttemptRunningLocked(job_id, attempt);
}

absl::Status Cluster::CheckAttemptRunningLocked(const std::string& job_id, int attempt) const {
  const JobEntry* entry = FindJobOrNullLocked(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  const v1::Job& job = entry->job;
  if (job.state() == v1::JOB_STATE_RUNNING && job.attempt() == attempt) return absl::OkStatus();
  std::string how;
  if (attempt > job.attempt() || attempt <= 0) {
    how = absl::StrCat("job ", job_id, " has no attempt ", attempt, " (", job.attempt(),
                       " started; the job is ", StateName(job.state()), ")");
  } else if (attempt < job.attempt()) {
    how = absl::StrCat("attempt ", attempt, " of job ", job_id, " has ended; attempt ",
                       job.attempt(), " is the current one (", StateName(job.state()), ")");
  } else {
    const std::string& reason =
        job.transitions_size() > 0 ? job.transitions(job.transitions_size() - 1).reason() : "";
    how = absl::StrCat("attempt ", attempt, " of job ", job_id, " has ended: the job is ",
                       StateName(job.state()), " (", reason, ")");
  }
  return absl::FailedPreconditionError(absl::StrCat(how, "; the runner should stop"));
}

absl::StatusOr<std::string> Cluster::WorkerOfProcess(const std::string& job_id, int attempt,
                                                     int process_index) const {
  absl::MutexLock lock(&mu_);
  SUBSTRAX_RETURN_IF_ERROR(CheckAttemptRunningLocked(job_id, attempt));
  const JobEntry& entry = jobs_.at(job_id);
  if (process_index < 0 || process_index >= static_cast<int>(entry.processes.size())) {
    return absl::InvalidArgumentError(absl::StrCat("attempt ", attempt, " of job ", job_id,
                                                   " has no process ", process_index, " (",
                                                   entry.processes.size(), " processes)"));
  }
  return entry.processes[process_index].worker_id;
}

absl::Status Cluster::ReportSteps(const v1::ReportStepsRequest& request,
                                  const std::string& reporter) {
  SUBSTRAX_RETURN_IF_ERROR(CheckReportLimits(request));
  EndedAttempts ended;
  absl::Status status;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    status = ReportStepsLocked(request, reporter, &ended, &ticket);
  }
  NotifyEnded(ended);
  // Acknowledged means stored: wait for the commit that holds the points (never under the lock).
  absl::Status stored = writer_->Wait(ticket);
  if (!status.ok()) return status;
  return Annotate(stored, absl::StrCat("job ", request.job_id(), " attempt ", request.attempt(),
                                       ": reports not stored"));
}

absl::Status Cluster::ReportStepsLocked(const v1::ReportStepsRequest& request,
                                        const std::string& reporter, EndedAttempts* ended,
                                        uint64_t* ticket) {
  SUBSTRAX_RETURN_IF_ERROR(CheckAttemptRunningLocked(request.job_id(), request.attempt()));
  JobEntry* entry = &jobs_.at(request.job_id());
  std::map<int, std::pair<std::string, int>> where;  // device id -> (host, process index)
  for (size_t p = 0; p < entry->processes.size(); ++p) {
    for (int id : entry->processes[p].device_ids) {
      where[id] = {workers_.at(entry->processes[p].worker_id).proto.host(), static_cast<int>(p)};
    }
  }
  const std::string scope = absl::StrCat("job ", request.job_id(), " attempt ", request.attempt());
  std::vector<v1::StepReport> reports;
  for (int i = 0; i < request.reports_size(); ++i) {
    v1::StepReport report = request.reports(i);
    if ((!report.job_id().empty() && report.job_id() != request.job_id()) ||
        (report.attempt() != 0 && report.attempt() != request.attempt())) {
      return absl::InvalidArgumentError(absl::StrCat(
          scope, ": reports[", i, "] is for job ", report.job_id(), " attempt ",
          report.attempt(), "; send each attempt's reports in its own request"));
    }
    auto device = where.find(report.device_id());
    if (device == where.end()) {
      std::vector<int> ids;
      for (const auto& [id, unused] : where) ids.push_back(id);
      return absl::InvalidArgumentError(absl::StrCat(
          scope, ": reports[", i, "].device_id: device ", report.device_id(),
          " is not in the attempt's mesh (devices ", absl::StrJoin(ids, ", "), ")"));
    }
    const std::string& driver = entry->processes[device->second.second].worker_id;
    if (!reporter.empty() && driver != reporter) {
      return absl::PermissionDeniedError(absl::StrCat(
          "worker ", reporter, " reported device ", report.device_id(), " of ", scope,
          ", which worker ", driver, " drives; a worker reports only its own devices"));
    }
    report.set_job_id(request.job_id());
    report.set_attempt(request.attempt());
    report.set_host(device->second.first);
    report.set_process_index(device->second.second);
    if (!report.has_time()) *report.mutable_time() = ToProtoTime(clock_());
    reports.push_back(std::move(report));
  }
  *ticket = writer_->AppendReports(reports);
  const absl::Time now = lease_clock_();
  const v1::StepReport* non_finite = nullptr;
  int64_t highest = 0;
  const ExpectedDevices devices = DevicesOf(entry->job.mesh());
  for (const v1::StepReport& report : reports) {
    metrics_.Add(report, devices);
    highest = std::max(highest, report.step());
    NoteDataFactsLocked(*entry, report);
    Process& process = entry->processes[report.process_index()];
    if (!process.reported && entry->job.spec().has_command()) process.last_progress = now;
    process.reported = true;
    if (report.step() > process.last_step) {
      process.last_step = report.step();
      process.last_progress = now;
    }
    if (entry->stragglers != nullptr) {
      for (const StragglerChange& change : entry->stragglers->Add(
               report.step(), report.device_id(),
               {report.compute_seconds(), report.data_wait_seconds(),
                report.collective_seconds()})) {
        NoteStragglerLocked(*entry, change);
      }
    }
    auto loss = report.values().find("loss");
    if (non_finite == nullptr && loss != report.values().end() && !std::isfinite(loss->second)) {
      non_finite = &report;
    }
  }
  RefreshProgressLocked(*entry);
  PruneMetricsLocked(*entry, highest);
  if (non_finite != nullptr) {
    const int p = non_finite->process_index();
    const std::string worker = entry->processes[p].worker_id;
    FailAttemptLocked(*entry, worker,
                      absl::StrCat("the loss is ", non_finite->values().at("loss"), " at step ",
                                   non_finite->step(), " on device ", non_finite->device_id(),
                                   " (process ", p, ", ", DescribeWorkerLocked(worker),
                                   "): training diverged; lower the learning rate or check the "
                                   "data"),
                      ended);
    ScheduleLocked();
    *ticket = EnqueueLocked();
    return absl::FailedPreconditionError(
        absl::StrCat(scope, " failed: non-finite loss at step ", non_finite->step(),
                     "; the runner should stop"));
  }
  // Progress is derived from the stored points, so the job itself need not be written again
  // (unless NoteDataFactsLocked learnt something: then it is dirty).
  *entry->job.mutable_update_time() = ToProtoTime(clock_());
  ++version_;
  changes_.Mark(ChangeFeed::JobTopic(entry->job.id()));
  *ticket = EnqueueLocked();
  return absl::OkStatus();
}

void Cluster::NoteDataFactsLocked(JobEntry& entry, const v1::StepReport& report) {
  v1::Job& job = entry.job;
  bool changed = false;
  if (report.total_steps() > 0 && job.progress().total_steps() != report.total_steps()) {
    job.mutable_progress()->set_total_steps(report.total_steps());
    changed = true;
  }
  if (report.input_features() > 0 && job.input_features() != report.input_features()) {
    job.set_input_features(report.input_features());
    changed = true;
  }
  if (changed) MarkJobChangedLocked(entry);
}

void Cluster::PruneMetricsLocked(JobEntry& entry, int64_t highest_step) {
  const int64_t window = options_.metrics_raw_steps;
  if (window <= 0 || highest_step <= window) return;
  const int attempt = entry.job.attempt();
  if (entry.pruned.first == attempt && highest_step - entry.pruned.second < window / 4 + 1) {
    return;  // pruned recently: a prune per quarter window keeps the table within 1.25 windows
  }
  entry.pruned = {attempt, highest_step};
  // The history keeps every `every`-th step, rounded up to a step the runner reports.
  const int64_t report_every = std::max<int64_t>(entry.job.spec().report_every_steps(), 1);
  const int64_t every =
      (std::max<int64_t>(options_.metrics_history_every, 1) + report_every - 1) / report_every *
      report_every;
  writer_->Prune({entry.job.id(), attempt, highest_step - window, every});
}

absl::Status Cluster::ReportAttemptStatus(const v1::ReportAttemptStatusRequest& request) {
  if (request.state() == v1::RUNNER_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError("state: unspecified; give RUNNING, SUCCEEDED or FAILED");
  }
  EndedAttempts ended;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    SUBSTRAX_RETURN_IF_ERROR(CheckAttemptRunningLocked(request.job_id(), request.attempt()));
    JobEntry* entry = &jobs_.at(request.job_id());
    v1::Job& job = entry->job;
    const int p = request.process_index();
    if (p < 0 || p >= static_cast<int>(entry->processes.size()) ||
        entry->processes[p].worker_id != request.worker_id()) {
      std::vector<std::string> table;
      for (size_t i = 0; i < entry->processes.size(); ++i) {
        table.push_back(absl::StrCat(i, " on ", entry->processes[i].worker_id));
      }
      return absl::FailedPreconditionError(absl::StrCat(
          "worker ", request.worker_id(), " does not run process ", p, " of job ", job.id(),
          " attempt ", job.attempt(), " (processes: ", absl::StrJoin(table, ", "), ")"));
    }
    Process& process = entry->processes[p];
    switch (request.state()) {
      case v1::RUNNER_STATE_SUCCEEDED: {
        if (process.succeeded) break;  // a retried report, already stored
        if (job.has_preemption() && (job.progress().total_steps() == 0 ||
                                     process.last_step < job.progress().total_steps())) {
          // Asked to stop, it stopped before its last step: a stop, not the job's success.
          NotePreemptedStoppedLocked(*entry, request.worker_id(), &ended);
          break;
        }
        process.succeeded = true;
        if (job.spec().has_doctor() && request.has_doctor()) {
          NoteDoctorReportLocked(*entry, p, request.doctor());
        }
        process.final_metrics.clear();
        process.final_metrics.insert(request.final_metrics().begin(),
                                     request.final_metrics().end());
        // Stored before the answer: an acknowledged outcome survives a restart.
        job.add_succeeded_processes(p);
        if (p == 0) *job.mutable_progress()->mutable_final_metrics() = request.final_metrics();
        MarkJobChangedLocked(*entry);
        const bool all = std::all_of(entry->processes.begin(), entry->processes.end(),
                                     [](const Process& q) { return q.succeeded; });
        if (!all) break;
        auto* final_metrics = job.mutable_progress()->mutable_final_metrics();
        final_metrics->clear();
        final_metrics->insert(entry->processes[0].final_metrics.begin(),
                              entry->processes[0].final_metrics.end());
        const size_t n = entry->processes.size();
        EndAttemptLocked(*entry, "", "", &ended);
        TransitionLocked(*entry, v1::JOB_STATE_SUCCEEDED,
                         absl::StrCat(n == 1 ? "its process" : absl::StrCat("all ", n, " processes"),
                                      " succeeded"));
        break;
      }
      case v1::RUNNER_STATE_FAILED: {
        std::string cause = absl::StrCat("runner of process ", p, " on ",
                                         DescribeWorkerLocked(request.worker_id()),
                                         " exited with status ", request.exit_code());
        if (request.exit_code() > 128) {
          absl::StrAppend(&cause, " (signal ", request.exit_code() - 128, ")");
        }
        if (!request.error().empty()) {
          absl::StrAppend(&cause, ": ", BoundedText(request.error(), limits::kMaxErrorBytes));
        }
        // A peer stopped by a signal is the likelier root cause of a collective timeout.
        absl::StrAppend(&cause, SuspendedNoteLocked(*entry, p));
        // A collective that timed out: the rank it waited for, from the processes' counts.
        std::string culprit = request.worker_id();
        const auto timed_out = static_cast<absl::StatusCode>(request.error_code());
        if (timed_out == absl::StatusCode::kDeadlineExceeded) {
          const HangAttribution hang = AttributeHangLocked(*entry);
          if (hang.found) {
            culprit = entry->processes[hang.blamed.front()].worker_id;
            cause = absl::StrCat("stalled at step ", entry->processes[p].last_step, ": ",
                                 hang.summary, "; a collective timed out (", cause, ")");
          }
        }
        if (!request.stderr_tail().empty()) {
          absl::StrAppend(&cause, "; stderr: ",
                          BoundedText(request.stderr_tail(), limits::kMaxStderrBytes));
        }
        // Errors that cannot get better by retrying fail the job at once (Kubernetes'
        // podFailurePolicy): bad data, a missing file, a spec the runner refuses.
        const auto code = static_cast<absl::StatusCode>(request.error_code());
        const bool retryable = code != absl::StatusCode::kInvalidArgument &&
                               code != absl::StatusCode::kNotFound &&
                               code != absl::StatusCode::kPermissionDenied &&
                               code != absl::StatusCode::kUnimplemented;
        FailAttemptLocked(*entry, culprit, cause, &ended, retryable);
        break;
      }
      default:  // RUNNING: nothing to change.
        break;
    }
    ScheduleLocked();
    ticket = EnqueueLocked();
  }
  NotifyEnded(ended);
  return writer_->Wait(ticket);
}

// ---------------------------------------------------------------------------------------------
// Client-facing

absl::StatusOr<v1::Job> Cluster::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindJobOrNullLocked(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return JobViewLocked(*entry);
}

std::vector<v1::Job> Cluster::ListJobs(const std::vector<v1::JobState>& states, size_t offset,
                                       size_t limit, bool* more) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> jobs;
  size_t matched = 0;
  if (more != nullptr) *more = false;
  for (auto it = job_order_.rbegin(); it != job_order_.rend(); ++it) {
    const JobEntry& entry = jobs_.at(*it);
    if (!states.empty() &&
        std::find(states.begin(), states.end(), entry.job.state()) == states.end()) {
      continue;
    }
    if (matched++ < offset) continue;
    if (jobs.size() == limit) {
      if (more != nullptr) *more = true;
      break;
    }
    jobs.push_back(JobViewLocked(entry));
  }
  return jobs;
}

absl::StatusOr<v1::ListJobsResponse> Cluster::ListJobsPage(
    const v1::ListJobsRequest& request) const {
  int64_t offset = 0;
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &offset) || offset < 0)) {
    return absl::InvalidArgumentError("page_token: not a token this coordinator handed out");
  }
  const int64_t page = request.page_size() <= 0
                           ? limits::kDefaultJobsPageSize
                           : std::min<int64_t>(request.page_size(), limits::kMaxJobsPageSize);
  std::vector<v1::JobState> states;
  for (int state : request.states()) states.push_back(static_cast<v1::JobState>(state));
  bool more = false;
  v1::ListJobsResponse response;
  std::vector<v1::Job> jobs = ListJobs(states, offset, page, &more);
  // A page also ends once its bytes pass kMaxJobsPageBytes (with at least one job in it), so that
  // no number of large jobs makes a page that clients cannot receive.
  size_t bytes = 0;
  for (v1::Job& job : jobs) {
    const size_t size = job.ByteSizeLong();
    if (response.jobs_size() > 0 && bytes + size > limits::kMaxJobsPageBytes) {
      more = true;
      break;
    }
    bytes += size;
    *response.add_jobs() = std::move(job);
  }
  if (more) response.set_next_page_token(absl::StrCat(offset + response.jobs_size()));
  return response;
}

std::map<v1::JobState, int> Cluster::JobCounts() const {
  absl::MutexLock lock(&mu_);
  std::map<v1::JobState, int> counts;
  for (const auto& [id, entry] : jobs_) ++counts[entry.job.state()];
  return counts;
}

int Cluster::ActiveJobsLocked() const {
  int active = 0;
  for (const auto& [id, entry] : jobs_) active += IsTerminalJobState(entry.job.state()) ? 0 : 1;
  return active;
}

absl::Status Cluster::DeleteJob(const std::string& job_id) {
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    SUBSTRAX_ASSIGN_OR_RETURN(JobEntry * entry, FindJobLocked(job_id));
    if (!IsTerminalJobState(entry->job.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " is ", StateName(entry->job.state()),
                       ": only an ended job can be deleted; cancel it first"));
    }
    ticket = DeleteJobsLocked({job_id});
  }
  NotifyEnded({});
  return writer_->Wait(ticket);
}

uint64_t Cluster::DeleteJobsLocked(const std::set<std::string>& job_ids) {
  uint64_t ticket = 0;
  for (const std::string& id : job_ids) {
    if (auto found = jobs_.find(id); found != jobs_.end()) {
      pending_.erase({found->second.order, id});
      // Its request id may make a new job from now on.
      const v1::Job& job = found->second.job;
      if (!job.request_id().empty()) submit_requests_.erase({job.owner(), job.request_id()});
    }
    jobs_.erase(id);
    dirty_jobs_.erase(id);
    metrics_.Forget(id);
    ticket = writer_->DeleteJob(id);
    changes_.Mark(ChangeFeed::JobTopic(id));
    changes_.Mark(ChangeFeed::LogsTopic(id));
    // The job's logs go with it (the writer deletes their chunks).
    for (auto it = log_ends_.lower_bound({id, std::numeric_limits<int>::min(), 0});
         it != log_ends_.end() && std::get<0>(it->first) == id;) {
      it = log_ends_.erase(it);
    }
  }
  // One pass over the order, however many go (expiry may delete thousands at start-up).
  job_order_.erase(std::remove_if(job_order_.begin(), job_order_.end(),
                                  [&](const std::string& id) { return job_ids.count(id) > 0; }),
                   job_order_.end());
  ++version_;
  return ticket;
}

void Cluster::ExpireFinishedJobsLocked() {
  // On the lease clock: a step of the wall clock expires nothing.
  const absl::Time now = lease_clock_();
  std::vector<std::string> finished;  // oldest first
  for (const std::string& id : job_order_) {
    if (IsTerminalJobState(jobs_.at(id).job.state())) finished.push_back(id);
  }
  size_t excess = finished.size() > static_cast<size_t>(std::max(options_.max_finished_jobs, 0))
                      ? finished.size() - options_.max_finished_jobs
                      : 0;
  std::set<std::string> expired;
  for (const std::string& id : finished) {
    const bool too_old = options_.finished_job_ttl > absl::ZeroDuration() &&
                         now - jobs_.at(id).ended_at > options_.finished_job_ttl;
    if (excess > 0 || too_old) {
      expired.insert(id);
      if (excess > 0) --excess;
    }
  }
  if (!expired.empty()) DeleteJobsLocked(expired);
}

absl::StatusOr<v1::Job> Cluster::CancelJob(const std::string& job_id, const std::string& reason) {
  EndedAttempts ended;
  uint64_t ticket = 0;
  v1::Job view;
  {
    absl::MutexLock lock(&mu_);
    SUBSTRAX_ASSIGN_OR_RETURN(JobEntry * entry, FindJobLocked(job_id));
    const v1::Job& job = entry->job;
    if (IsTerminalJobState(job.state())) {
      const v1::JobTransition& last = job.transitions(job.transitions_size() - 1);
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " has already ended: ", StateName(job.state()), " at ",
          absl::FormatTime(absl::FromUnixSeconds(absl::ToUnixSeconds(FromProtoTime(last.time()))),
                           absl::UTCTimeZone()),
          " (", last.reason(), "); nothing to cancel"));
    }
    const std::string why = reason.empty() ? "cancelled by user" : reason;
    if (job.state() == v1::JOB_STATE_RUNNING) EndAttemptLocked(*entry, why, "", &ended);
    TransitionLocked(*entry, v1::JOB_STATE_CANCELLED, why);
    ScheduleLocked();
    ticket = EnqueueLocked();
    view = JobViewLocked(*entry);
  }
  NotifyEnded(ended);
  SUBSTRAX_RETURN_IF_ERROR(writer_->Wait(ticket));
  return view;
}

std::vector<v1::Worker> Cluster::ListWorkers() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = lease_clock_();
  // worker -> the jobs running on it, in submission order (one pass over the jobs).
  std::map<std::string, std::vector<const std::string*>> running;
  for (const std::string& job_id : job_order_) {
    for (const Process& process : jobs_.at(job_id).processes) {
      running[process.worker_id].push_back(&job_id);
    }
  }
  std::vector<v1::Worker> workers;
  for (const std::string& worker_id : worker_order_) {
    const WorkerEntry& entry = workers_.at(worker_id);
    v1::Worker worker = entry.proto;
    worker.set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - entry.last_heartbeat));
    for (const std::string* job_id : running[worker_id]) worker.add_job_ids(*job_id);
    workers.push_back(std::move(worker));
  }
  return workers;
}

absl::StatusOr<v1::GetMeshResponse> Cluster::GetMesh(const std::string& job_id) const {
  v1::JobSpec spec;
  v1::GetMeshResponse response;
  int64_t features = 0;
  {
    absl::MutexLock lock(&mu_);
    const JobEntry* entry = FindJobOrNullLocked(job_id);
    if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
    if (entry->job.mesh().devices().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " has no mesh yet: it is ", StateName(entry->job.state()),
          " and has never started"));
    }
    spec = entry->job.spec();
    *response.mutable_mesh() = entry->job.mesh();
    features = spec.data().format() == v1::DATA_FORMAT_SYNTHETIC
                   ? spec.data().synthetic().num_features()
                   : entry->job.input_features();
  }
  SUBSTRAX_ASSIGN_OR_RETURN(Mesh mesh, Mesh::FromProto(response.mesh()));
  SUBSTRAX_ASSIGN_OR_RETURN(*response.mutable_layouts(), LayoutsFor(spec, mesh));
  // Parameter layouts need the input width: the spec's for synthetic data, else what the runners
  // reported (the coordinator reads no data files); shown once known.
  if (features <= 0) return response;
  absl::StatusOr<std::vector<ParamSpec>> params =
      ModelParams(spec.model(), features, ModelAxisSize(spec));
  if (!params.ok()) return response;
  for (const ParamSpec& p : *params) {
    absl::StatusOr<NamedSharding> sharding = NamedSharding::Create(mesh, p.partition);
    if (!sharding.ok()) continue;
    absl::StatusOr<ShardLayout> layout = sharding->Layout(p.shape);
    if (layout.ok()) (*response.mutable_layouts())[p.name] = layout->ToProto();
  }
  return response;
}

absl::StatusOr<v1::QueryMetricsResponse> Cluster::QueryMetrics(
    const v1::QueryMetricsRequest& request) const {
  DeclaredReductions declared;
  int current_attempt = 0;
  ExpectedDevices current_devices;
  {
    absl::MutexLock lock(&mu_);
    const JobEntry* entry = FindJobOrNullLocked(request.job_id());
    if (entry == nullptr) {
      return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
    }
    declared = entry->job.spec().metrics();
    current_attempt = entry->job.attempt();
    current_devices = DevicesOf(entry->job.mesh());
  }
  if (request.attempt() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "attempt: ", request.attempt(), " is not an attempt: give 0 (the latest) or N >= 1"));
  }
  // From the store, without the lock: a big query never delays heartbeats or reports. The
  // points of one attempt are bounded by retention (metrics_raw_steps, metrics_history_every).
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int> attempts, state_->ReportedAttempts(request.job_id()));
  if (attempts.empty()) {
    return absl::NotFoundError(
        absl::StrCat("job ", request.job_id(), " has reported no metrics yet"));
  }
  const int attempt = request.attempt() != 0 ? request.attempt() : attempts.back();
  if (std::find(attempts.begin(), attempts.end(), attempt) == attempts.end()) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " attempt ", attempt,
                                            " reported no metrics; attempts with metrics: ",
                                            absl::StrJoin(attempts, ", ")));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<v1::StepReport> reports,
                            state_->ReadReports(request.job_id(), attempt));
  MetricsStore points;
  for (const v1::StepReport& r : reports) points.Add(r);
  v1::QueryMetricsRequest query = request;
  query.set_attempt(attempt);
  // Only the current (or last) attempt's mesh is kept; an earlier one expects the devices that
  // reported in it.
  return points.Query(query, declared,
                      attempt == current_attempt ? current_devices : ExpectedDevices());
}
}  // namespace substrax
