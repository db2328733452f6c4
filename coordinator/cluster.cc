// The Cluster's creation and loading, its small shared helpers and change notification. The
// rest of the state machine is split by concern: cluster_membership.cc (registration, leases),
// cluster_scheduling.cc (the gang scheduler and attempts' start), cluster_submit.cc
// (submission), cluster_jobs.cc (job lifecycle, runner reports, queries); the submit policy is
// submit_policy.cc.
#include "coordinator/cluster.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/cluster_internal.h"
#include "core/device_mesh_manager.h"
#include "core/job_env.h"
#include "core/job_spec.h"
#include "core/sharding.h"
#include "core/status.h"
#include "rpc/proto_time.h"

namespace substrax {

bool IsTerminalJobState(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

namespace cluster_internal {

std::string StateName(v1::JobState state) {
  const std::string name = v1::JobState_Name(state);
  return absl::StartsWith(name, "JOB_STATE_") ? name.substr(10) : name;
}

std::string Count(size_t n, absl::string_view noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

std::vector<std::string> ProcessWorkers(const Mesh& mesh) {
  std::vector<std::string> workers;
  std::set<std::string> seen;
  for (const Device& device : mesh.devices()) {
    if (seen.insert(device.worker_id).second) workers.push_back(device.worker_id);
  }
  return workers;
}

absl::StatusOr<google::protobuf::Map<std::string, v1::ShardLayout>> LayoutsFor(
    const v1::JobSpec& spec, const Mesh& mesh) {
  google::protobuf::Map<std::string, v1::ShardLayout> layouts;
  if (!mesh.HasAxis(kDataAxis)) return layouts;
  // A program job may have no batch: then there is none to lay out.
  if (spec.batch().global_batch_size() <= 0 && spec.batch().per_device_batch_size() <= 0) {
    return layouts;
  }
  int64_t global_batch = spec.batch().global_batch_size();
  if (global_batch == 0) global_batch = PerDeviceBatchSize(spec) * DataAxisSize(spec);
  SUBSTRAX_ASSIGN_OR_RETURN(NamedSharding sharding, CreateDataParallelSharding(mesh));
  SUBSTRAX_ASSIGN_OR_RETURN(ShardLayout layout, sharding.Layout({global_batch}));
  layouts[kBatchLayout] = layout.ToProto();
  return layouts;
}

}  // namespace cluster_internal

using cluster_internal::kWaitingSeparator;

// ---------------------------------------------------------------------------------------------
// Creation and loading

namespace {

std::string NewEpoch() {
  absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

}  // namespace

Cluster::Cluster(const ClusterOptions& options, Clock clock, Clock lease_clock,
                 StateStore* state)
    : options_(options),
      clock_(std::move(clock)),
      lease_clock_(lease_clock ? std::move(lease_clock) : clock_),
      epoch_(NewEpoch()),
      state_(state),
      scheduler_(options.scheduling) {}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const ClusterOptions& options,
                                                         Clock clock, StateStore* state,
                                                         Clock lease_clock) {
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat interval (", absl::FormatDuration(options.heartbeat_interval),
                     ") and timeout (", absl::FormatDuration(options.heartbeat_timeout),
                     ") must be positive"));
  }
  SUBSTRAX_RETURN_IF_ERROR(ValidateJobEnvAllow(options.job_env_allow));
  SUBSTRAX_CHECK(state != nullptr, "Cluster::Create needs a StateStore");
  SUBSTRAX_ASSIGN_OR_RETURN(StateStore::Snapshot snapshot, state->Load());
  std::unique_ptr<Cluster> cluster(
      new Cluster(options, std::move(clock), std::move(lease_clock), state));
  if (options.max_active_jobs <= 0 || options.max_finished_jobs < 0 ||
      options.metrics_raw_steps < 0 || options.metrics_history_every <= 0 ||
      options.max_workers <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_active_jobs (", options.max_active_jobs, "), max_workers (", options.max_workers,
        ") and metrics_history_every (", options.metrics_history_every,
        ") must be positive, max_finished_jobs (",
        options.max_finished_jobs, ") and metrics_raw_steps (", options.metrics_raw_steps,
        ") not negative"));
  }
  cluster->writer_ = std::make_unique<StateWriter>(state);
  // A commit may release assignment events: wake the streams.
  // (The writer by its pointer: during ~Cluster's writer_.reset() the unique_ptr is already
  // null while the writer's last commits call back.)
  cluster->writer_->SetCommitCallback([c = cluster.get(), writer = cluster->writer_.get()] {
    const uint64_t committed = writer->committed();
    {
      absl::MutexLock lock(&c->mu_);
      ++c->version_;
      c->MarkReleasedEventsLocked(committed);
    }
    c->changes_.Flush();
  });
  EndedAttempts ended;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&cluster->mu_);
    SUBSTRAX_RETURN_IF_ERROR(cluster->LoadLocked(snapshot, &ended));
    cluster->ExpireFinishedJobsLocked();
    cluster->ScheduleLocked();
    ticket = cluster->EnqueueLocked();
  }
  SUBSTRAX_RETURN_IF_ERROR(cluster->writer_->Wait(ticket));
  // No callback can be set yet; `ended` only documents what loading did.
  return cluster;
}

Cluster::~Cluster() { writer_.reset(); }

absl::Status Cluster::LoadLocked(const StateStore::Snapshot& snapshot, EndedAttempts* ended) {
  const absl::Time now = lease_clock_();
  for (const v1::Worker& worker : snapshot.workers) {
    WorkerEntry& entry = workers_[worker.worker_id()];
    if (entry.proto.worker_id().empty()) worker_order_.push_back(worker.worker_id());
    entry.proto = worker;
    entry.proto.clear_job_ids();
    entry.proto.clear_seconds_since_heartbeat();
    entry.last_heartbeat = now;
    // Its retention counts from the load: when it died is not stored.
    if (worker.state() != v1::WORKER_STATE_ALIVE) entry.dead_since = now;
    for (const v1::Device& device : worker.devices()) {
      device_ids_[{worker.worker_id(), device.local_index()}] = device.id();
      next_device_id_ = std::max(next_device_id_, device.id() + 1);
    }
  }

  // Ids already handed out are never handed out again: the stored counter, or (for a store
  // written before the counter was) past every stored id.
  next_job_number_ = std::max(next_job_number_, snapshot.next_job_number);
  for (const v1::Job& job : snapshot.jobs) {
    JobEntry& entry = jobs_[job.id()];
    if (entry.job.id().empty()) {
      job_order_.push_back(job.id());
      entry.order = next_order_++;
    }
    entry.job = job;
    NotePendingLocked(entry);
    const size_t dash = job.id().rfind('-');
    int64_t number = 0;
    if (dash != std::string::npos && absl::SimpleAtoi(job.id().substr(dash + 1), &number)) {
      next_job_number_ = std::max(next_job_number_, number + 1);
    }
    if (!job.request_id().empty()) submit_requests_[{job.owner(), job.request_id()}] = job.id();
    if (job.has_next_attempt_time()) {
      entry.next_attempt_at = RebaseLocked(FromProtoTime(job.next_attempt_time()));
    }
    if (job.transitions_size() > 0) {
      const absl::Time last = RebaseLocked(FromProtoTime(job.transitions().rbegin()->time()));
      if (IsTerminalJobState(job.state())) entry.ended_at = last;
      if (job.state() == v1::JOB_STATE_PENDING) entry.pending_since = last;
    }
    for (const v1::Device& device : job.mesh().devices()) {
      next_device_id_ = std::max(next_device_id_, device.id() + 1);
    }
    // A job that has not ended gets its progress from its latest stored points (an ended one
    // was stored with its final progress); history stays on disk.
    if (!IsTerminalJobState(job.state()) && job.attempt() > 0) {
      SUBSTRAX_ASSIGN_OR_RETURN(std::vector<v1::StepReport> latest,
                                state_->LatestReports(job.id(), job.attempt(), kProgressSteps));
      const ExpectedDevices devices = DevicesOf(job.mesh());
      for (const v1::StepReport& report : latest) metrics_.Add(report, devices);
      RefreshProgressLocked(entry);
    }
    for (const v1::JobTransition& t : job.transitions()) {
      if (t.to() == v1::JOB_STATE_RUNNING) {
        entry.first_start = RebaseLocked(FromProtoTime(t.time()));
        break;
      }
    }
    if (job.state() == v1::JOB_STATE_PENDING && job.transitions_size() > 0) {
      const std::string& reason = job.transitions(job.transitions_size() - 1).reason();
      entry.pending_reason = reason.substr(0, reason.rfind(kWaitingSeparator));
    }
    if (job.state() != v1::JOB_STATE_RUNNING) {
      // Who ran the stored attempt's processes, for its logs that arrive after a restart.
      if (job.attempt() > 0 && job.mesh().devices_size() > 0) {
        if (absl::StatusOr<Mesh> mesh = Mesh::FromProto(job.mesh()); mesh.ok()) {
          RememberAttemptWorkersLocked(entry, cluster_internal::ProcessWorkers(*mesh));
        }
      }
      continue;
    }

    // A running attempt keeps its devices while all of its workers keep their leases.
    absl::StatusOr<Mesh> mesh = Mesh::FromProto(job.mesh());
    if (!mesh.ok()) {
      FailAttemptLocked(entry, "",
                        absl::StrCat("the stored mesh does not load: ", mesh.status().message()),
                        ended);
      continue;
    }
    TakeDevicesLocked(entry, *std::move(mesh));
    for (int p : job.succeeded_processes()) {
      if (p < 0 || p >= static_cast<int>(entry.processes.size())) continue;
      entry.processes[p].succeeded = true;
      if (p == 0) {
        entry.processes[p].final_metrics.insert(job.progress().final_metrics().begin(),
                                                job.progress().final_metrics().end());
      }
    }
    for (const Process& process : entry.processes) {
      auto worker = workers_.find(process.worker_id);
      if (worker == workers_.end() || worker->second.proto.state() != v1::WORKER_STATE_ALIVE) {
        FailAttemptLocked(entry, process.worker_id,
                          absl::StrCat(DescribeWorkerLocked(process.worker_id),
                                       " was not alive when the coordinator restarted; check its "
                                       "log"),
                          ended);
        break;
      }
    }
    // The start events may not have reached the daemons before the restart; those that did
    // are ignored there (launches are idempotent).
    if (entry.job.state() == v1::JOB_STATE_RUNNING) {
      PushStartEventsLocked(entry);
      ResumeLoadedAttemptLocked(entry);
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Small helpers

absl::Time Cluster::RebaseLocked(absl::Time wall) const {
  return lease_clock_() + (wall - clock_());
}

std::string Cluster::DescribeWorkerLocked(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return absl::StrCat("worker ", worker_id, " (unknown host)");
  return absl::StrCat("worker ", worker_id, " (host ", it->second.proto.host(), ")");
}

absl::StatusOr<Cluster::WorkerEntry*> Cluster::LiveWorkerLocked(const std::string& worker_id,
                                                                const std::string& incarnation) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " is not registered: register it first"));
  }
  WorkerEntry& worker = it->second;
  if (worker.proto.incarnation() != incarnation) {
    return absl::AbortedError(absl::StrCat(
        DescribeWorkerLocked(worker_id), ": incarnation ", incarnation,
        " is stale (the current one is ", worker.proto.incarnation(),
        "): this process was replaced; re-register"));
  }
  if (worker.proto.state() != v1::WORKER_STATE_ALIVE) {
    return absl::AbortedError(absl::StrCat(
        DescribeWorkerLocked(worker_id), " was declared dead after missing heartbeats for ",
        absl::FormatDuration(options_.heartbeat_timeout), "; re-register"));
  }
  return &worker;
}

absl::StatusOr<Cluster::JobEntry*> Cluster::FindJobLocked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return &it->second;
}

const Cluster::JobEntry* Cluster::FindJobOrNullLocked(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

v1::Job Cluster::JobViewLocked(const JobEntry& entry) const { return entry.job; }

void Cluster::MarkJobChangedLocked(JobEntry& entry) {
  *entry.job.mutable_update_time() = ToProtoTime(clock_());
  dirty_jobs_.insert(entry.job.id());
  ++version_;
  changes_.Mark(ChangeFeed::JobTopic(entry.job.id()));
}

void Cluster::PushEventLocked(const std::string& worker_id, v1::WatchAssignmentsResponse event) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  it->second.events.push_back(std::move(event));
  it->second.event_tickets.push_back(kUnstamped);
  unstamped_workers_.insert(worker_id);
  ++version_;
}

uint64_t Cluster::EnqueueLocked() {
  for (const std::string& id : dirty_workers_) writer_->PutWorker(workers_.at(id).proto);
  for (const std::string& id : dirty_jobs_) writer_->PutJob(jobs_.at(id).job);
  dirty_workers_.clear();
  dirty_jobs_.clear();
  // Everything this call changed is at or before the last ticket (earlier calls' too, which
  // only makes the wait as long as theirs). Its events go out once that is committed.
  const uint64_t ticket = writer_->last_ticket();
  for (const std::string& id : unstamped_workers_) {
    auto worker = workers_.find(id);
    if (worker == workers_.end()) continue;
    // Only the newest events are unstamped: stop at the first stamped one from the back.
    auto& tickets = worker->second.event_tickets;
    for (auto t = tickets.rbegin(); t != tickets.rend() && *t == kUnstamped; ++t) *t = ticket;
    // Already on disk (this call wrote nothing new): readable now, and no commit will say so.
    if (ticket <= writer_->committed()) {
      changes_.Mark(ChangeFeed::WorkerTopic(id));
    } else {
      unreleased_workers_.insert(id);
    }
  }
  unstamped_workers_.clear();
  return ticket;
}

void Cluster::MarkReleasedEventsLocked(uint64_t committed) {
  for (auto it = unreleased_workers_.begin(); it != unreleased_workers_.end();) {
    auto worker = workers_.find(*it);
    const bool released = worker == workers_.end() || worker->second.event_tickets.empty() ||
                          worker->second.event_tickets.back() <= committed;
    // Woken only when this commit made one of its events readable: a commit of something else
    // (an earlier write) would wake a stream that then finds nothing to send.
    bool readable = false;
    if (worker != workers_.end()) {
      for (uint64_t t : worker->second.event_tickets) {
        readable = readable || (t > events_released_through_ && t <= committed);
      }
    }
    if (readable) changes_.Mark(ChangeFeed::WorkerTopic(*it));
    it = released ? unreleased_workers_.erase(it) : std::next(it);
  }
  events_released_through_ = std::max(events_released_through_, committed);
}

void Cluster::NotifyEnded(const EndedAttempts& ended) {
  changes_.Flush();
  if (ended.empty()) return;
  std::function<void(const std::string&, int)> callback;
  {
    absl::MutexLock lock(&mu_);
    callback = attempt_ended_;
  }
  if (!callback) return;
  for (const auto& [job_id, attempt] : ended) callback(job_id, attempt);
}

void Cluster::SetAttemptEndedCallback(std::function<void(const std::string&, int)> callback) {
  absl::MutexLock lock(&mu_);
  attempt_ended_ = std::move(callback);
}

// ---------------------------------------------------------------------------------------------
// Change notification

uint64_t Cluster::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

uint64_t Cluster::AwaitChange(uint64_t seen, absl::Duration timeout) const {
  struct Args {
    const uint64_t* version;
    uint64_t seen;
  };
  Args args{&version_, seen};
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(+[](Args* a) { return *a->version > a->seen; }, &args),
                       timeout);
  return version_;
}

}  // namespace substrax
