// Membership: registration, heartbeats and leases of worker daemons, their assignment queues,
// and what a lost or restarted worker does to the attempts it takes part in.
#include <algorithm>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/cluster.h"
#include "coordinator/limits.h"
#include "core/data_paths.h"
#include "core/job_spec.h"
#include "core/status.h"
#include "rpc/proto_time.h"

namespace substrax {

namespace {

// What a registration must hold before it is stored: names, devices, roots, Python
// environments. INVALID_ARGUMENT naming the worker and the field.
absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request,
                               const std::string& worker_id) {
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"worker_id",
                                                                              &worker_id},
                                     {"host", &request.host()},
                                     {"address", &request.address()},
                                     {"incarnation", &request.incarnation()}}) {
    SUBSTRAX_RETURN_IF_ERROR(CheckName(field, *value));
  }
  if (request.host().empty()) return absl::InvalidArgumentError("host: must not be empty");
  if (request.devices_size() > limits::kMaxDevicesPerWorker) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, ": devices: ", request.devices_size(),
        " given, more than the limit of ", limits::kMaxDevicesPerWorker));
  }
  if (request.incarnation().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_id, ": incarnation: must not be empty"));
  }
  if (request.devices().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, " (host ", request.host(), "): devices: none given; a worker "
        "needs at least one device"));
  }
  for (const auto& [field, roots] :
       {std::pair{"data_roots", &request.data_roots()},
        std::pair{"checkpoint_roots", &request.checkpoint_roots()},
        std::pair{"programs_dirs", &request.programs_dirs()}}) {
    if (roots->size() > limits::kMaxDataRootsPerWorker) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker_id, ": ", field, ": ", roots->size(),
          " given, more than the limit of ", limits::kMaxDataRootsPerWorker));
    }
    for (int i = 0; i < roots->size(); ++i) {
      const std::string& root = roots->Get(i);
      absl::Status valid = root.size() > limits::kMaxPathBytes
                               ? absl::InvalidArgumentError(absl::StrCat(
                                     root.size(), " bytes, more than the limit of ",
                                     limits::kMaxPathBytes))
                               : CheckNormalizedAbsolute(root);
      if (!valid.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("worker ", worker_id, ": ", field, "[", i,
                                                       "]: '", root.substr(0, 256), "' ",
                                                       valid.message()));
      }
    }
  }
  // Names only (request_limits.cc bounds their count and length): the agent resolves each in
  // its own --python-env DIR.
  for (int i = 0; i < request.python_envs_size(); ++i) {
    if (std::string problem = PythonEnvNameProblem(request.python_envs(i)); !problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker ", worker_id, ": python_envs[", i, "]: ", problem));
    }
  }
  std::set<int> local_indices;
  for (int i = 0; i < request.devices_size(); ++i) {
    const int local = request.devices(i).local_index();
    if (local < 0 || !local_indices.insert(local).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker ", worker_id, " (host ", request.host(), "): devices[", i, "].local_index: ",
          local < 0 ? "must be >= 0" : "repeated", ", got ", local));
    }
  }

  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::RegisterWorkerResponse> Cluster::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  const std::string worker_id = request.worker_id().empty() ? request.host() : request.worker_id();
  SUBSTRAX_RETURN_IF_ERROR(CheckRegistration(request, worker_id));

  EndedAttempts ended;
  v1::RegisterWorkerResponse response;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    if (workers_.count(worker_id) == 0) SUBSTRAX_RETURN_IF_ERROR(MakeRoomLocked(worker_id));
    auto [it, is_new] = workers_.try_emplace(worker_id);
    WorkerEntry& worker = it->second;
    const bool retry = !is_new && worker.proto.incarnation() == request.incarnation();
    if (is_new) worker_order_.push_back(worker_id);
    if (!is_new && !retry) {
      FailAttemptsOfWorkerLocked(
          worker_id,
          absl::StrCat("worker ", worker_id, " restarted (host ", request.host(),
                       ", new incarnation): its runners died with the old process; check its "
                       "log"),
          &ended);
    }
    worker.last_heartbeat = lease_clock_();
    if (!retry || worker.proto.state() != v1::WORKER_STATE_ALIVE) {
      // A new process, or one declared dead: nothing of its old queue applies any more.
      worker.events.clear();
      worker.event_tickets.clear();
      worker.acked = 0;
      worker.dead_since = absl::InfinitePast();
      ++version_;
      changes_.Mark(ChangeFeed::WorkerTopic(worker_id));
      v1::Worker& proto = worker.proto;
      proto.Clear();
      proto.set_worker_id(worker_id);
      proto.set_host(request.host());
      proto.set_address(request.address());
      proto.set_incarnation(request.incarnation());
      proto.set_state(v1::WORKER_STATE_ALIVE);
      *proto.mutable_data_roots() = request.data_roots();
      *proto.mutable_checkpoint_roots() = request.checkpoint_roots();
      *proto.mutable_programs_dirs() = request.programs_dirs();
      *proto.mutable_python_envs() = request.python_envs();
      proto.set_runs_commands(request.runs_commands());
      for (const v1::Device& given : request.devices()) {
        v1::Device* device = proto.add_devices();
        *device = given;
        auto [id, added] = device_ids_.try_emplace({worker_id, given.local_index()},
                                                   next_device_id_);
        if (added) ++next_device_id_;
        device->set_id(id->second);
        device->set_host(request.host());
        device->set_worker_id(worker_id);
      }
      dirty_workers_.insert(worker_id);
      ScheduleLocked();
    }
    *response.mutable_devices() = worker.proto.devices();
    ticket = EnqueueLocked();
  }
  NotifyEnded(ended);
  SUBSTRAX_RETURN_IF_ERROR(writer_->Wait(ticket));
  *response.mutable_heartbeat_interval() = ToProtoDuration(options_.heartbeat_interval);
  *response.mutable_heartbeat_timeout() = ToProtoDuration(options_.heartbeat_timeout);
  return response;
}

absl::Status Cluster::Heartbeat(const std::string& worker_id, const std::string& incarnation) {
  absl::MutexLock lock(&mu_);
  SUBSTRAX_ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorkerLocked(worker_id, incarnation));
  worker->last_heartbeat = lease_clock_();
  return absl::OkStatus();
}

absl::StatusOr<v1::HeartbeatResponse> Cluster::Heartbeat(const v1::HeartbeatRequest& request) {
  const std::string& worker_id = request.worker_id();
  EndedAttempts ended;
  v1::HeartbeatResponse response;
  uint64_t ticket = 0;
  if (request.runners_size() > limits::kMaxRunnersPerHeartbeat) {
    return absl::InvalidArgumentError(absl::StrCat(
        "runners: ", request.runners_size(), " listed, more than the limit of ",
        limits::kMaxRunnersPerHeartbeat));
  }
  {
    absl::MutexLock lock(&mu_);
    SUBSTRAX_ASSIGN_OR_RETURN(WorkerEntry * worker,
                              LiveWorkerLocked(worker_id, request.incarnation()));
    worker->last_heartbeat = lease_clock_();
    if (request.has_clock()) *worker->proto.mutable_clock() = request.clock();
    if (request.has_certificate_not_after()) {
      *worker->proto.mutable_certificate_not_after() = request.certificate_not_after();
    }
    // The daemon has every event up to its cursor and never asks for them again.
    if (request.watch_epoch() == epoch_ && request.watch_cursor() > worker->acked) {
      const int64_t n = std::min<int64_t>(request.watch_cursor() - worker->acked,
                                          static_cast<int64_t>(worker->events.size()));
      worker->events.erase(worker->events.begin(), worker->events.begin() + n);
      worker->event_tickets.erase(worker->event_tickets.begin(),
                                  worker->event_tickets.begin() + n);
      worker->acked += n;
    }
    // (job, attempt, process) the daemon lists.
    std::set<std::tuple<std::string, int, int>> listed;
    for (const v1::RunnerRef& runner : request.runners()) {
      listed.emplace(runner.job_id(), runner.attempt(), runner.process_index());
      auto it = jobs_.find(runner.job_id());
      const int p = runner.process_index();
      const bool ours = it != jobs_.end() && it->second.job.state() == v1::JOB_STATE_RUNNING &&
                        it->second.job.attempt() == runner.attempt() && p >= 0 &&
                        p < static_cast<int>(it->second.processes.size()) &&
                        it->second.processes[p].worker_id == worker_id;
      if (ours) {
        if (!runner.ended()) it->second.processes[p].seen = true;
        Process& process = it->second.processes[p];
        process.suspended = runner.suspended();
        if (runner.has_activity()) {
          process.has_activity = true;
          process.activity = runner.activity();
        }
        continue;
      }
      if (runner.ended()) continue;  // it has exited; its outcome will be refused as stale
      // Slurm's rule: a runner the coordinator does not know as running must go.
      v1::StopAttempt* stop = response.add_stop();
      stop->set_job_id(runner.job_id());
      stop->set_attempt(runner.attempt());
      const absl::Status running = CheckAttemptRunningLocked(runner.job_id(), runner.attempt());
      stop->set_reason(running.ok() ? absl::StrCat("process ", p, " of attempt ",
                                                   runner.attempt(), " is not ",
                                                   DescribeWorkerLocked(worker_id), "'s")
                                    : std::string(running.message()));
    }
    // A runner listed before and gone now without an outcome fails its attempt.
    std::vector<std::pair<std::string, size_t>> missing;
    for (auto& [id, entry] : jobs_) {
      if (entry.job.state() != v1::JOB_STATE_RUNNING) continue;
      for (size_t p = 0; p < entry.processes.size(); ++p) {
        const Process& process = entry.processes[p];
        if (process.worker_id != worker_id || !process.seen || process.succeeded) continue;
        if (listed.count({id, entry.job.attempt(), static_cast<int>(p)}) == 0) {
          missing.emplace_back(id, p);
        }
      }
    }
    for (const auto& [id, p] : missing) {
      JobEntry& entry = jobs_.at(id);
      if (entry.job.state() != v1::JOB_STATE_RUNNING) continue;
      FailAttemptLocked(entry, worker_id,
                        absl::StrCat("the runner of process ", p, " is missing: ",
                                     DescribeWorkerLocked(worker_id),
                                     " no longer runs it and reported no outcome; check its log"),
                        &ended);
    }
    if (!missing.empty()) {
      ScheduleLocked();
      ticket = EnqueueLocked();
    }
  }
  NotifyEnded(ended);
  // Only a heartbeat that changed something waits for the disk; a plain renewal never does.
  SUBSTRAX_RETURN_IF_ERROR(writer_->Wait(ticket));
  return response;
}

void Cluster::Tick() {
  EndedAttempts ended;
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    ExpireLeasesLocked(&ended);
    ForgetDeadWorkersLocked(/*room_for_one=*/false);
    CheckProgressLocked(&ended);
    ExpireFinishedJobsLocked();
    ScheduleLocked();
    ticket = EnqueueLocked();
  }
  NotifyEnded(ended);
  // The writer retries a failed commit by itself; waiting here keeps Tick's changes on disk
  // when it returns (tests rely on that), and costs no lock.
  writer_->Wait(ticket).IgnoreError();
}

absl::StatusOr<std::vector<v1::WatchAssignmentsResponse>> Cluster::PollAssignments(
    const std::string& worker_id, const std::string& incarnation, int64_t* cursor) {
  return PollAssignments(worker_id, incarnation, epoch_, cursor);
}

absl::StatusOr<std::vector<v1::WatchAssignmentsResponse>> Cluster::PollAssignments(
    const std::string& worker_id, const std::string& incarnation, const std::string& epoch,
    int64_t* cursor) {
  absl::MutexLock lock(&mu_);
  SUBSTRAX_ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorkerLocked(worker_id, incarnation));
  if (epoch != epoch_) *cursor = 0;
  // Only events whose changes are on disk: a daemon never acts on what a coordinator restart
  // could forget (a start of an attempt, a stop of a cancelled job).
  // Positions in worker->events: event i has cursor acked + i + 1. Events up to acked were
  // acknowledged (dropped); a cursor before them (never sent by a daemon that acknowledged
  // them) resumes after them.
  const uint64_t committed = writer_->committed();
  const int64_t first = std::max<int64_t>(*cursor - worker->acked, 0);
  int64_t size = static_cast<int64_t>(worker->events.size());
  for (int64_t i = first; i < size; ++i) {
    if (worker->event_tickets[i] > committed) {
      size = i;
      break;
    }
  }
  std::vector<v1::WatchAssignmentsResponse> events;
  for (int64_t i = first; i < size; ++i) {
    events.push_back(worker->events[i]);
    events.back().set_epoch(epoch_);
    events.back().set_cursor(worker->acked + i + 1);
  }
  *cursor = std::max(*cursor, worker->acked + size);
  return events;
}

void Cluster::FailAttemptsOfWorkerLocked(const std::string& worker_id, const std::string& cause,
                                         EndedAttempts* ended) {
  for (auto& [id, entry] : jobs_) {
    if (entry.job.state() != v1::JOB_STATE_RUNNING) continue;
    const bool involved =
        std::any_of(entry.processes.begin(), entry.processes.end(),
                    [&](const Process& p) { return p.worker_id == worker_id; });
    if (involved) FailAttemptLocked(entry, worker_id, cause, ended);
  }
}

void Cluster::ExpireLeasesLocked(EndedAttempts* ended) {
  const absl::Time now = lease_clock_();
  for (const std::string& worker_id : worker_order_) {
    WorkerEntry& worker = workers_.at(worker_id);
    if (worker.proto.state() != v1::WORKER_STATE_ALIVE ||
        now - worker.last_heartbeat <= options_.heartbeat_timeout) {
      continue;
    }
    worker.proto.set_state(v1::WORKER_STATE_DEAD);
    worker.dead_since = now;
    dirty_workers_.insert(worker_id);
    // Its stream ends (PollAssignments answers ABORTED from now on).
    changes_.Mark(ChangeFeed::WorkerTopic(worker_id));
    FailAttemptsOfWorkerLocked(
        worker_id,
        absl::StrCat(DescribeWorkerLocked(worker_id), " missed heartbeats for ",
                     absl::FormatDuration(options_.heartbeat_timeout),
                     ": it died, was preempted or lost the network; check its log"),
        ended);
  }
}

absl::Status Cluster::MakeRoomLocked(const std::string& worker_id) {
  // Churn never fills the cluster: the longest dead worker makes room for a new one.
  if (static_cast<int>(workers_.size()) < options_.max_workers ||
      ForgetDeadWorkersLocked(/*room_for_one=*/true)) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("the coordinator knows ", workers_.size(), " workers, its limit, all of them "
                   "alive; worker ", worker_id, " cannot join"));
}

bool Cluster::ForgetDeadWorkersLocked(bool room_for_one) {
  const absl::Time now = lease_clock_();
  const absl::Duration retention = options_.dead_worker_retention;
  std::set<std::string> forget;
  const std::string* longest_dead = nullptr;
  for (const std::string& worker_id : worker_order_) {
    const WorkerEntry& worker = workers_.at(worker_id);
    if (worker.proto.state() == v1::WORKER_STATE_ALIVE) continue;
    if (retention > absl::ZeroDuration() && now - worker.dead_since > retention) {
      forget.insert(worker_id);
    } else if (longest_dead == nullptr ||
               worker.dead_since < workers_.at(*longest_dead).dead_since) {
      longest_dead = &worker_id;
    }
  }
  if (room_for_one && forget.empty() &&
      static_cast<int>(workers_.size()) >= options_.max_workers) {
    if (longest_dead == nullptr) return false;
    forget.insert(*longest_dead);
  }
  if (forget.empty()) return true;
  for (const std::string& worker_id : forget) {
    // A dead worker runs no attempt (they failed when it died): nothing refers to it but the
    // records of ended attempts, which describe an unknown worker as such.
    workers_.erase(worker_id);
    dirty_workers_.erase(worker_id);
    unstamped_workers_.erase(worker_id);
    unreleased_workers_.erase(worker_id);
    writer_->DeleteWorker(worker_id);
    for (auto it = device_ids_.lower_bound({worker_id, std::numeric_limits<int>::min()});
         it != device_ids_.end() && it->first.first == worker_id;) {
      it = device_ids_.erase(it);
    }
  }
  worker_order_.erase(std::remove_if(worker_order_.begin(), worker_order_.end(),
                                     [&](const std::string& id) { return forget.count(id) > 0; }),
                      worker_order_.end());
  ++version_;
  return true;
}

}  // namespace substrax
