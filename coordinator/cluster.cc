#include "coordinator/cluster.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/input_shape.h"
#include "core/job_spec.h"
#include "core/model_catalog.h"
#include "core/sharding.h"
#include "core/status.h"

namespace substrax {
namespace {

constexpr char kWaitingSeparator[] = "; waiting for ";
constexpr char kBatchLayout[] = "batch/inputs";

// Whole seconds (toward the past) and the nanoseconds left, as Timestamp and Duration keep them.
template <typename Proto>
Proto SecondsAndNanos(absl::Duration d) {
  Proto proto;
  const absl::Duration whole = absl::Floor(d, absl::Seconds(1));
  proto.set_seconds(absl::ToInt64Seconds(whole));
  proto.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d - whole)));
  return proto;
}

google::protobuf::Timestamp ToProtoTime(absl::Time t) {
  return SecondsAndNanos<google::protobuf::Timestamp>(t - absl::UnixEpoch());
}

google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  return SecondsAndNanos<google::protobuf::Duration>(d);
}

// "RUNNING" for JOB_STATE_RUNNING.
std::string StateName(v1::JobState state) {
  const std::string name = v1::JobState_Name(state);
  return absl::StartsWith(name, "JOB_STATE_") ? name.substr(10) : name;
}

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
}

// Steps the job will run: spec.steps, or epochs x steps per epoch when the data's headers say
// how many examples there are (reads a file: call it outside the lock); 0 when unknown.
int64_t TotalSteps(const v1::JobSpec& spec) {
  if (spec.length_case() == v1::JobSpec::kSteps) return spec.steps();
  absl::StatusOr<int64_t> examples = TrainExamples(spec.data());
  const int64_t batch = spec.batch().global_batch_size();
  if (!examples.ok() || batch <= 0) return 0;
  return spec.epochs() * (*examples / batch);
}

// "1 worker", "2 workers".
std::string Count(size_t n, absl::string_view noun) {
  return absl::StrCat(n, " ", noun, n == 1 ? "" : "s");
}

// The shard layouts an attempt's runners need: the global batch split over the data axis.
// Parameter layouts depend on the input width, which only the data knows.
absl::StatusOr<google::protobuf::Map<std::string, v1::ShardLayout>> LayoutsFor(
    const v1::JobSpec& spec, const Mesh& mesh) {
  google::protobuf::Map<std::string, v1::ShardLayout> layouts;
  if (!mesh.HasAxis(kDataAxis)) return layouts;
  int64_t global_batch = spec.batch().global_batch_size();
  if (global_batch == 0) global_batch = PerDeviceBatchSize(spec) * DataAxisSize(spec);
  SUBSTRAX_ASSIGN_OR_RETURN(NamedSharding sharding, CreateDataParallelSharding(mesh));
  SUBSTRAX_ASSIGN_OR_RETURN(ShardLayout layout, sharding.Layout({global_batch}));
  layouts[kBatchLayout] = layout.ToProto();
  return layouts;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Creation and loading

Cluster::Cluster(const ClusterOptions& options, Clock clock, StateStore* state)
    : options_(options), clock_(std::move(clock)), state_(state) {}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Create(const ClusterOptions& options,
                                                         Clock clock, StateStore* state) {
  if (options.heartbeat_interval <= absl::ZeroDuration() ||
      options.heartbeat_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat interval (", absl::FormatDuration(options.heartbeat_interval),
                     ") and timeout (", absl::FormatDuration(options.heartbeat_timeout),
                     ") must be positive"));
  }
  SUBSTRAX_CHECK(state != nullptr, "Cluster::Create needs a StateStore");
  SUBSTRAX_ASSIGN_OR_RETURN(StateStore::Snapshot snapshot, state->Load());
  std::unique_ptr<Cluster> cluster(new Cluster(options, std::move(clock), state));
  EndedAttempts ended;
  {
    absl::MutexLock lock(&cluster->mu_);
    SUBSTRAX_RETURN_IF_ERROR(cluster->LoadLocked(snapshot, &ended));
    cluster->ScheduleLocked();
    SUBSTRAX_RETURN_IF_ERROR(cluster->FlushLocked());
  }
  // No callback can be set yet; `ended` only documents what loading did.
  return cluster;
}

absl::Status Cluster::LoadLocked(const StateStore::Snapshot& snapshot, EndedAttempts* ended) {
  const absl::Time now = clock_();
  for (const v1::Worker& worker : snapshot.workers) {
    WorkerEntry& entry = workers_[worker.worker_id()];
    if (entry.proto.worker_id().empty()) worker_order_.push_back(worker.worker_id());
    entry.proto = worker;
    entry.proto.clear_job_ids();
    entry.proto.clear_seconds_since_heartbeat();
    entry.last_heartbeat = now;
    for (const v1::Device& device : worker.devices()) {
      device_ids_[{worker.worker_id(), device.local_index()}] = device.id();
      next_device_id_ = std::max(next_device_id_, device.id() + 1);
    }
  }
  for (const v1::StepReport& report : snapshot.reports) metrics_.Add(report);

  for (const v1::Job& job : snapshot.jobs) {
    JobEntry& entry = jobs_[job.id()];
    if (entry.job.id().empty()) job_order_.push_back(job.id());
    entry.job = job;
    const size_t dash = job.id().rfind('-');
    int64_t number = 0;
    if (dash != std::string::npos && absl::SimpleAtoi(job.id().substr(dash + 1), &number)) {
      next_job_number_ = std::max(next_job_number_, number + 1);
    }
    for (const v1::Device& device : job.mesh().devices()) {
      next_device_id_ = std::max(next_device_id_, device.id() + 1);
    }
    RefreshProgressLocked(entry);
    if (job.state() == v1::JOB_STATE_PENDING && job.transitions_size() > 0) {
      const std::string& reason = job.transitions(job.transitions_size() - 1).reason();
      entry.pending_reason = reason.substr(0, reason.rfind(kWaitingSeparator));
    }
    if (job.state() != v1::JOB_STATE_RUNNING) continue;

    // A running attempt keeps its devices while all of its workers keep their leases.
    absl::StatusOr<Mesh> mesh = Mesh::FromProto(job.mesh());
    if (!mesh.ok()) {
      FailAttemptLocked(entry, "",
                        absl::StrCat("the stored mesh does not load: ", mesh.status().message()),
                        ended);
      continue;
    }
    TakeDevicesLocked(entry, *std::move(mesh));
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
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Small helpers

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
}

void Cluster::PushEventLocked(const std::string& worker_id, v1::WatchAssignmentsResponse event) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  it->second.events.push_back(std::move(event));
  ++version_;
}

absl::Status Cluster::FlushLocked() {
  for (auto it = dirty_workers_.begin(); it != dirty_workers_.end();) {
    SUBSTRAX_RETURN_IF_ERROR(state_->PutWorker(workers_.at(*it).proto));
    it = dirty_workers_.erase(it);
  }
  for (auto it = dirty_jobs_.begin(); it != dirty_jobs_.end();) {
    SUBSTRAX_RETURN_IF_ERROR(state_->PutJob(jobs_.at(*it).job));
    it = dirty_jobs_.erase(it);
  }
  return absl::OkStatus();
}

void Cluster::NotifyEnded(const EndedAttempts& ended) {
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
// The job state machine

void Cluster::TakeDevicesLocked(JobEntry& entry, Mesh mesh) {
  // Process p is the p-th distinct worker in row-major device order (the runtime's rule).
  entry.processes.clear();
  std::map<std::string, size_t> index;
  for (const Device& device : mesh.devices()) {
    auto [it, inserted] = index.emplace(device.worker_id, entry.processes.size());
    if (inserted) entry.processes.push_back(Process{device.worker_id, {}, false, {}});
    entry.processes[it->second].device_ids.push_back(device.id);
    busy_devices_[device.id] = entry.job.id();
  }
  entry.mesh = std::move(mesh);
}

void Cluster::RefreshProgressLocked(JobEntry& entry) {
  const v1::Job& job = entry.job;
  if (job.attempt() == 0) return;
  std::optional<v1::JobProgress> latest =
      metrics_.Latest(job.id(), job.attempt(), job.spec().metrics());
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
  entry.job.set_state(to);
  if (to == v1::JOB_STATE_PENDING) entry.pending_reason = reason;
  MarkJobChangedLocked(entry);
}

void Cluster::SetWaitingLocked(JobEntry& entry, const std::string& why) {
  if (entry.job.transitions_size() == 0) return;
  v1::JobTransition* last = entry.job.mutable_transitions(entry.job.transitions_size() - 1);
  const std::string reason = absl::StrCat(entry.pending_reason, kWaitingSeparator, why);
  if (last->reason() == reason) return;
  last->set_reason(reason);
  MarkJobChangedLocked(entry);
}

void Cluster::StartAttemptLocked(JobEntry& entry, Mesh mesh, const std::string& reason) {
  v1::Job& job = entry.job;
  job.set_attempt(job.attempt() + 1);
  job.clear_error();
  v1::JobProgress* progress = job.mutable_progress();
  const int64_t total = progress->total_steps();  // computed at submit
  progress->Clear();
  progress->set_total_steps(total);

  // The mesh as clients and runners see it: every device as its worker registered it.
  v1::Mesh mesh_proto = mesh.ToProto();
  for (v1::Device& device : *mesh_proto.mutable_devices()) {
    for (const v1::Device& known : workers_.at(device.worker_id()).proto.devices()) {
      if (known.id() == device.id()) device = known;
    }
  }
  *job.mutable_mesh() = mesh_proto;
  // Checked by the scheduler before it chose this mesh.
  const auto layouts = LayoutsFor(job.spec(), mesh).value();

  TakeDevicesLocked(entry, std::move(mesh));
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    v1::WatchAssignmentsResponse event;
    v1::Assignment* a = event.mutable_start();
    a->set_job_id(job.id());
    a->set_attempt(job.attempt());
    *a->mutable_spec() = job.spec();
    *a->mutable_mesh() = mesh_proto;
    a->set_process_index(static_cast<int32_t>(p));
    a->set_num_processes(static_cast<int32_t>(entry.processes.size()));
    for (int id : entry.processes[p].device_ids) a->add_local_device_ids(id);
    *a->mutable_layouts() = layouts;
    a->set_rendezvous_prefix(absl::StrCat(job.id(), "/attempt-", job.attempt()));
    PushEventLocked(entry.processes[p].worker_id, std::move(event));
  }
  TransitionLocked(entry, v1::JOB_STATE_RUNNING, reason);
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
                                const std::string& cause, EndedAttempts* ended) {
  v1::Job& job = entry.job;
  std::string where = absl::StrCat("attempt ", job.attempt());
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    if (entry.processes[p].worker_id != culprit) continue;
    absl::StrAppend(&where, ", process ", p, " (devices ",
                    absl::StrJoin(entry.processes[p].device_ids, ", "), ")");
  }
  const std::string error = absl::StrCat(where, ": ", cause);
  EndAttemptLocked(entry, error, culprit, ended);
  const int restarts_used = job.attempt() - 1;
  if (restarts_used < job.spec().max_restarts()) {
    TransitionLocked(entry, v1::JOB_STATE_PENDING,
                     absl::StrCat(error, "; restarting (restart ", restarts_used + 1, " of ",
                                  job.spec().max_restarts(), ")"));
    return;
  }
  job.set_error(error);
  TransitionLocked(entry, v1::JOB_STATE_FAILED,
                   job.spec().max_restarts() == 0
                       ? error
                       : absl::StrCat(error, "; no restarts left (max_restarts ",
                                      job.spec().max_restarts(), ")"));
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
  const absl::Time now = clock_();
  for (const std::string& worker_id : worker_order_) {
    WorkerEntry& worker = workers_.at(worker_id);
    if (worker.proto.state() != v1::WORKER_STATE_ALIVE ||
        now - worker.last_heartbeat <= options_.heartbeat_timeout) {
      continue;
    }
    worker.proto.set_state(v1::WORKER_STATE_DEAD);
    dirty_workers_.insert(worker_id);
    FailAttemptsOfWorkerLocked(
        worker_id,
        absl::StrCat(DescribeWorkerLocked(worker_id), " missed heartbeats for ",
                     absl::FormatDuration(options_.heartbeat_timeout),
                     ": the process died or was preempted; check its log"),
        ended);
  }
}

void Cluster::ScheduleLocked() {
  std::vector<Device> all_alive;
  std::vector<Device> all_free;
  size_t alive_workers = 0;
  for (const std::string& worker_id : worker_order_) {
    const v1::Worker& worker = workers_.at(worker_id).proto;
    if (worker.state() != v1::WORKER_STATE_ALIVE) continue;
    ++alive_workers;
    for (const v1::Device& device : worker.devices()) {
      all_alive.push_back(DeviceFromProto(device));
      if (busy_devices_.count(device.id()) == 0) all_free.push_back(all_alive.back());
    }
  }
  // The oldest job that the alive workers could hold but not now; everything younger waits.
  std::string blocked_by;
  for (const std::string& job_id : job_order_) {
    JobEntry& entry = jobs_.at(job_id);
    if (entry.job.state() != v1::JOB_STATE_PENDING) continue;
    const v1::JobSpec& spec = entry.job.spec();
    const int64_t need = RequiredDevices(spec);
    // Only devices of the kind the job's backend runs on.
    const std::vector<Device> alive = DevicesForBackend(spec.backend(), all_alive);
    std::vector<Device> free = DevicesForBackend(spec.backend(), all_free);
    if (!blocked_by.empty()) {
      SetWaitingLocked(entry, absl::StrCat(need, " free devices behind job ", blocked_by,
                                           " (jobs start in submission order)"));
      continue;
    }
    if (alive.empty()) {
      SetWaitingLocked(entry, all_alive.empty()
                                  ? absl::StrCat(need, " devices: no worker is alive")
                                  : absl::StrCat(need, " devices of the kind backend ",
                                                 BackendName(spec.backend()),
                                                 " runs on: no alive worker has any"));
      continue;
    }
    absl::StatusOr<Mesh> could = CreateMeshForJob(spec.mesh(), alive);
    if (!could.ok()) {
      // Not even an idle cluster could hold it: wait for more workers, without blocking others.
      SetWaitingLocked(entry, absl::StrCat("workers: the ", Count(alive.size(), "device"),
                                           " of ", Count(alive_workers, "alive worker"),
                                           " cannot hold the mesh (", could.status().message(),
                                           ")"));
      continue;
    }
    const std::string free_note = absl::StrCat(free.size(), " free on ",
                                               Count(alive_workers, "alive worker"));
    if (static_cast<int64_t>(free.size()) < need) {
      SetWaitingLocked(entry, absl::StrCat(need, " free devices; ", free_note));
      blocked_by = job_id;
      continue;
    }
    absl::StatusOr<Mesh> mesh = CreateMeshForJob(spec.mesh(), free);
    if (!mesh.ok()) {
      SetWaitingLocked(entry, absl::StrCat("free devices that can hold the mesh; ", free_note,
                                           " (", mesh.status().message(), ")"));
      blocked_by = job_id;
      continue;
    }
    if (absl::Status layouts = LayoutsFor(spec, *mesh).status(); !layouts.ok()) {
      SetWaitingLocked(entry, absl::StrCat("a mesh the batch can be laid out on (",
                                           layouts.message(), ")"));
      continue;
    }
    std::set<std::string> workers;
    for (const Device& device : mesh->devices()) workers.insert(device.worker_id);
    const std::string reason =
        absl::StrCat("scheduled on ", Count(mesh->devices().size(), "device"), " of ",
                     Count(workers.size(), "worker"), " (", absl::StrJoin(workers, ", "), ")");
    std::set<int> taken;
    for (const Device& device : mesh->devices()) taken.insert(device.id);
    all_free.erase(std::remove_if(all_free.begin(), all_free.end(),
                                  [&](const Device& d) { return taken.count(d.id) > 0; }),
                   all_free.end());
    StartAttemptLocked(entry, *std::move(mesh), reason);
  }
}

// ---------------------------------------------------------------------------------------------
// Membership

absl::StatusOr<v1::RegisterWorkerResponse> Cluster::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  const std::string worker_id = request.worker_id().empty() ? request.host() : request.worker_id();
  if (request.host().empty()) return absl::InvalidArgumentError("host: must not be empty");
  if (request.incarnation().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", worker_id, ": incarnation: must not be empty"));
  }
  if (request.devices().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", worker_id, " (host ", request.host(), "): devices: none given; a worker "
        "needs at least one device"));
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

  EndedAttempts ended;
  v1::RegisterWorkerResponse response;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
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
    worker.last_heartbeat = clock_();
    if (!retry || worker.proto.state() != v1::WORKER_STATE_ALIVE) {
      // A new process, or one declared dead: nothing of its old queue applies any more.
      worker.events.clear();
      ++version_;
      v1::Worker& proto = worker.proto;
      proto.Clear();
      proto.set_worker_id(worker_id);
      proto.set_host(request.host());
      proto.set_address(request.address());
      proto.set_incarnation(request.incarnation());
      proto.set_state(v1::WORKER_STATE_ALIVE);
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
    status = FlushLocked();
  }
  NotifyEnded(ended);
  SUBSTRAX_RETURN_IF_ERROR(status);
  *response.mutable_heartbeat_interval() = ToProtoDuration(options_.heartbeat_interval);
  *response.mutable_heartbeat_timeout() = ToProtoDuration(options_.heartbeat_timeout);
  return response;
}

absl::Status Cluster::Heartbeat(const std::string& worker_id, const std::string& incarnation) {
  absl::MutexLock lock(&mu_);
  SUBSTRAX_ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorkerLocked(worker_id, incarnation));
  worker->last_heartbeat = clock_();
  return absl::OkStatus();
}

void Cluster::Tick() {
  EndedAttempts ended;
  {
    absl::MutexLock lock(&mu_);
    ExpireLeasesLocked(&ended);
    ScheduleLocked();
    // A failed write stays dirty and is retried at the next Tick or call.
    FlushLocked().IgnoreError();
  }
  NotifyEnded(ended);
}

absl::StatusOr<std::vector<v1::WatchAssignmentsResponse>> Cluster::PollAssignments(
    const std::string& worker_id, const std::string& incarnation, int64_t* cursor) {
  absl::MutexLock lock(&mu_);
  SUBSTRAX_ASSIGN_OR_RETURN(WorkerEntry * worker, LiveWorkerLocked(worker_id, incarnation));
  const int64_t size = static_cast<int64_t>(worker->events.size());
  std::vector<v1::WatchAssignmentsResponse> events;
  for (int64_t i = std::max<int64_t>(*cursor, 0); i < size; ++i) {
    events.push_back(worker->events[i]);
  }
  *cursor = std::max(*cursor, size);
  return events;
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

absl::Status Cluster::ReportSteps(const v1::ReportStepsRequest& request) {
  absl::MutexLock lock(&mu_);
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
    report.set_job_id(request.job_id());
    report.set_attempt(request.attempt());
    report.set_host(device->second.first);
    report.set_process_index(device->second.second);
    if (!report.has_time()) *report.mutable_time() = ToProtoTime(clock_());
    reports.push_back(std::move(report));
  }
  SUBSTRAX_RETURN_IF_ERROR(
      Annotate(state_->AppendReports(reports), absl::StrCat(scope, ": reports not stored")));
  for (const v1::StepReport& report : reports) metrics_.Add(report);
  RefreshProgressLocked(*entry);
  // Progress is derived from the stored points, so the job itself need not be written again.
  *entry->job.mutable_update_time() = ToProtoTime(clock_());
  ++version_;
  return absl::OkStatus();
}

absl::Status Cluster::ReportAttemptStatus(const v1::ReportAttemptStatusRequest& request) {
  if (request.state() == v1::RUNNER_STATE_UNSPECIFIED) {
    return absl::InvalidArgumentError("state: unspecified; give RUNNING, SUCCEEDED or FAILED");
  }
  EndedAttempts ended;
  absl::Status status;
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
        process.succeeded = true;
        process.final_metrics.clear();
        process.final_metrics.insert(request.final_metrics().begin(),
                                     request.final_metrics().end());
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
        if (!request.error().empty()) absl::StrAppend(&cause, ": ", request.error());
        if (!request.stderr_tail().empty()) {
          absl::StrAppend(&cause, "; stderr: ", request.stderr_tail());
        }
        FailAttemptLocked(*entry, request.worker_id(), cause, &ended);
        break;
      }
      default:  // RUNNING: nothing to change.
        break;
    }
    ScheduleLocked();
    status = FlushLocked();
  }
  NotifyEnded(ended);
  return status;
}

// ---------------------------------------------------------------------------------------------
// Client-facing

absl::StatusOr<v1::Job> Cluster::SubmitJob(v1::JobSpec spec) {
  ApplyJobSpecDefaults(&spec);
  SUBSTRAX_RETURN_IF_ERROR(ValidateJobSpec(spec));
  const int64_t total_steps = TotalSteps(spec);
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  v1::Job job;
  job.set_id(absl::StrCat(spec.name(), "-", next_job_number_));
  *job.mutable_spec() = std::move(spec);
  job.set_state(v1::JOB_STATE_PENDING);
  *job.mutable_create_time() = ToProtoTime(now);
  *job.mutable_update_time() = ToProtoTime(now);
  job.mutable_progress()->set_total_steps(total_steps);
  v1::JobTransition* t = job.add_transitions();
  t->set_from(v1::JOB_STATE_UNSPECIFIED);
  t->set_to(v1::JOB_STATE_PENDING);
  *t->mutable_time() = ToProtoTime(now);
  t->set_reason("submitted");
  SUBSTRAX_RETURN_IF_ERROR(Annotate(state_->PutJob(job), "the job was not queued"));
  ++next_job_number_;
  const std::string id = job.id();
  JobEntry& entry = jobs_[id];
  entry.job = std::move(job);
  entry.pending_reason = "submitted";
  job_order_.push_back(id);
  ++version_;
  ScheduleLocked();
  // The job is stored (acknowledged); a failed write of what scheduling changed stays dirty and
  // is retried at the next Tick.
  FlushLocked().IgnoreError();
  return JobViewLocked(jobs_.at(id));
}

absl::StatusOr<v1::Job> Cluster::GetJob(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindJobOrNullLocked(job_id);
  if (entry == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  return JobViewLocked(*entry);
}

std::vector<v1::Job> Cluster::ListJobs(const std::vector<v1::JobState>& states) const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::Job> jobs;
  for (auto it = job_order_.rbegin(); it != job_order_.rend(); ++it) {
    const JobEntry& entry = jobs_.at(*it);
    if (!states.empty() &&
        std::find(states.begin(), states.end(), entry.job.state()) == states.end()) {
      continue;
    }
    jobs.push_back(JobViewLocked(entry));
  }
  return jobs;
}

absl::StatusOr<v1::Job> Cluster::CancelJob(const std::string& job_id, const std::string& reason) {
  EndedAttempts ended;
  absl::Status status;
  v1::Job view;
  {
    absl::MutexLock lock(&mu_);
    SUBSTRAX_ASSIGN_OR_RETURN(JobEntry * entry, FindJobLocked(job_id));
    const v1::Job& job = entry->job;
    if (IsTerminal(job.state())) {
      const v1::JobTransition& last = job.transitions(job.transitions_size() - 1);
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_id, " has already ended: ", StateName(job.state()), " at ",
          absl::FormatTime(absl::FromUnixSeconds(last.time().seconds()), absl::UTCTimeZone()),
          " (", last.reason(), "); nothing to cancel"));
    }
    const std::string why = reason.empty() ? "cancelled by user" : reason;
    if (job.state() == v1::JOB_STATE_RUNNING) EndAttemptLocked(*entry, why, "", &ended);
    TransitionLocked(*entry, v1::JOB_STATE_CANCELLED, why);
    ScheduleLocked();
    status = FlushLocked();
    view = JobViewLocked(*entry);
  }
  NotifyEnded(ended);
  SUBSTRAX_RETURN_IF_ERROR(status);
  return view;
}

std::vector<v1::Worker> Cluster::ListWorkers() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_();
  std::vector<v1::Worker> workers;
  for (const std::string& worker_id : worker_order_) {
    const WorkerEntry& entry = workers_.at(worker_id);
    v1::Worker worker = entry.proto;
    worker.set_seconds_since_heartbeat(absl::ToDoubleSeconds(now - entry.last_heartbeat));
    for (const std::string& job_id : job_order_) {
      const JobEntry& job = jobs_.at(job_id);
      for (const Process& process : job.processes) {
        if (process.worker_id == worker_id) worker.add_job_ids(job_id);
      }
    }
    workers.push_back(std::move(worker));
  }
  return workers;
}

absl::StatusOr<v1::GetMeshResponse> Cluster::GetMesh(const std::string& job_id) const {
  v1::JobSpec spec;
  v1::GetMeshResponse response;
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
  }
  SUBSTRAX_ASSIGN_OR_RETURN(Mesh mesh, Mesh::FromProto(response.mesh()));
  SUBSTRAX_ASSIGN_OR_RETURN(*response.mutable_layouts(), LayoutsFor(spec, mesh));
  // Parameter layouts need the input width, which the data's header gives: shown when this host
  // can read it (outside the lock: it reads a file).
  absl::StatusOr<int64_t> features = InputFeatures(spec.data());
  if (!features.ok()) return response;
  absl::StatusOr<std::vector<ParamSpec>> params =
      ModelParams(spec.model(), *features, ModelAxisSize(spec));
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
  absl::MutexLock lock(&mu_);
  const JobEntry* entry = FindJobOrNullLocked(request.job_id());
  if (entry == nullptr) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " not found"));
  }
  return metrics_.Query(request, entry->job.spec().metrics());
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
