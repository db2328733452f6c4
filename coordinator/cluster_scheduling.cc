// Scheduling: what the policy (scheduler.h) is shown of the cluster and how its decisions are
// carried out: gang placement (all or nothing) over the free devices of alive workers, why a
// pending job waits, and how an attempt starts (mesh, process table, assignments).
#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/cluster.h"
#include "coordinator/cluster_internal.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "rpc/proto_time.h"

namespace substrax {

using cluster_internal::Count;
using cluster_internal::kWaitingSeparator;
using cluster_internal::LayoutsFor;
using cluster_internal::PoolName;

namespace {

// For a waiting reason: which workers a command job may run on ("" for other jobs).
std::string CommandWorkerNote(const v1::JobSpec& spec) {
  if (!spec.has_command()) return "";
  const std::string& env = spec.command().python_env();
  return absl::StrCat(", on a worker that runs command jobs",
                      env.empty() ? "" : absl::StrCat(" and has Python environment ", env));
}

}  // namespace

void Cluster::TakeDevicesLocked(JobEntry& entry, Mesh mesh) {
  std::vector<std::string> workers = cluster_internal::ProcessWorkers(mesh);
  std::map<std::string, size_t> index;
  entry.processes.assign(workers.size(), Process());
  for (size_t p = 0; p < workers.size(); ++p) {
    index[workers[p]] = p;
    entry.processes[p].worker_id = workers[p];
    entry.processes[p].last_progress = lease_clock_();
  }
  for (const Device& device : mesh.devices()) {
    entry.processes[index[device.worker_id]].device_ids.push_back(device.id);
    busy_devices_[device.id] = entry.job.id();
  }
  RememberAttemptWorkersLocked(entry, std::move(workers));
  entry.mesh = std::move(mesh);
}

void Cluster::RememberAttemptWorkersLocked(JobEntry& entry, std::vector<std::string> workers) {
  entry.attempt_workers[entry.job.attempt()] = std::move(workers);
  while (entry.attempt_workers.size() > kAttemptsRemembered) {
    entry.attempt_workers.erase(entry.attempt_workers.begin());
  }
}

void Cluster::SetWaitingLocked(JobEntry& entry, const std::string& why) {
  if (entry.job.transitions_size() == 0) return;
  v1::JobTransition* last = entry.job.mutable_transitions(entry.job.transitions_size() - 1);
  const std::string reason = absl::StrCat(entry.pending_reason, kWaitingSeparator, why);
  if (last->reason() == reason) return;
  last->set_reason(reason);
  MarkJobChangedLocked(entry);
}

void Cluster::PushStartEventsLocked(JobEntry& entry) {
  const v1::Job& job = entry.job;
  // Checked by the scheduler before it chose this mesh (or loaded with the running job).
  absl::StatusOr<google::protobuf::Map<std::string, v1::ShardLayout>> layouts =
      LayoutsFor(job.spec(), *entry.mesh);
  const absl::StatusOr<int64_t> data_size = entry.mesh->AxisSize(kDataAxis);
  // The spec as this attempt runs it: an elastic axis may be smaller than the spec's.
  const v1::JobSpec attempt_spec =
      data_size.ok() ? SpecWithDataParallelSize(job.spec(), static_cast<int>(*data_size))
                     : job.spec();
  for (size_t p = 0; p < entry.processes.size(); ++p) {
    v1::WatchAssignmentsResponse event;
    v1::Assignment* a = event.mutable_start();
    a->set_job_id(job.id());
    a->set_attempt(job.attempt());
    *a->mutable_spec() = attempt_spec;
    *a->mutable_mesh() = job.mesh();
    a->set_process_index(static_cast<int32_t>(p));
    a->set_num_processes(static_cast<int32_t>(entry.processes.size()));
    for (int id : entry.processes[p].device_ids) a->add_local_device_ids(id);
    if (layouts.ok()) *a->mutable_layouts() = *layouts;
    a->set_rendezvous_prefix(absl::StrCat(job.id(), "/attempt-", job.attempt()));
    a->set_checkpoint_owner_directory(job.checkpoint_owner_directory());
    PushEventLocked(entry.processes[p].worker_id, std::move(event));
  }
}

void Cluster::StartAttemptLocked(JobEntry& entry, Mesh mesh, const std::string& reason) {
  v1::Job& job = entry.job;
  // Schedulable since it went PENDING, or since its backoff ended (on the lease clock).
  const absl::Time now = lease_clock_();
  const absl::Time schedulable = std::max(
      entry.pending_since == absl::InfinitePast() ? now : entry.pending_since,
      entry.next_attempt_at);
  if (placements_.size() >= kMaxUndrainedPlacements) placements_.erase(placements_.begin());
  placements_.push_back({job.id(), job.attempt() + 1, /*restart=*/job.attempt() > 0,
                         std::max(absl::ZeroDuration(), now - schedulable)});
  job.set_attempt(job.attempt() + 1);
  entry.attempt_start = now;
  job.clear_error();
  job.clear_next_attempt_time();
  entry.next_attempt_at = absl::InfinitePast();
  job.clear_succeeded_processes();
  job.set_resumed_from_step(0);  // the attempt's process 0 reports where it resumed from
  if (entry.first_start == absl::InfinitePast()) entry.first_start = now;
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

  TakeDevicesLocked(entry, std::move(mesh));
  job.clear_stragglers();
  job.clear_doctor();
  StartStragglerDetectorLocked(entry);
  PushStartEventsLocked(entry);
  TransitionLocked(entry, v1::JOB_STATE_RUNNING, reason);
}

std::vector<Placement> Cluster::TakePlacements() {
  absl::MutexLock lock(&mu_);
  return std::exchange(placements_, {});
}

AliveDevices Cluster::AliveDevicesLocked() const {
  AliveDevices alive;
  for (const std::string& worker_id : worker_order_) {
    const v1::Worker& worker = workers_.at(worker_id).proto;
    if (worker.state() != v1::WORKER_STATE_ALIVE) continue;
    ++alive.workers;
    for (const v1::Device& device : worker.devices()) {
      alive.devices.push_back(DeviceFromProto(device));
    }
  }
  return alive;
}

std::vector<Device> Cluster::RunnableDevicesLocked(const v1::JobSpec& spec,
                                                   std::vector<Device> devices) const {
  if (!spec.has_command()) return devices;
  // The agent refuses a command it cannot run; placing it there would only fail the attempt.
  // A loop, not a predicate: the thread-safety analysis cannot see that a lambda runs under mu_.
  const std::string& env = spec.command().python_env();
  std::vector<Device> runnable;
  for (Device& device : devices) {
    const v1::Worker& worker = workers_.at(device.worker_id).proto;
    const bool has_env = env.empty() || std::find(worker.python_envs().begin(),
                                                  worker.python_envs().end(),
                                                  env) != worker.python_envs().end();
    if (worker.runs_commands() && has_env) runnable.push_back(std::move(device));
  }
  return runnable;
}

std::vector<Device> Cluster::CandidateDevicesLocked(const v1::JobSpec& spec,
                                                    const std::vector<Device>& devices) const {
  if (spec.has_doctor()) return cluster_internal::DoctorDevices(spec, devices);
  return RunnableDevicesLocked(spec, DevicesForBackend(SchedulingBackend(spec), devices));
}

void Cluster::NotePendingLocked(const JobEntry& entry) {
  if (entry.job.state() == v1::JOB_STATE_PENDING) {
    pending_.emplace(entry.order, entry.job.id());
  } else {
    pending_.erase({entry.order, entry.job.id()});
  }
}

namespace {

// The Cluster's side of a scheduling pass: meshes over the free devices, preemptions, waiting
// reasons. Its calls run inside ScheduleLocked, which holds the Cluster's lock throughout (the
// thread-safety analysis cannot follow a virtual call).
class PassActions : public scheduling::Actions {
 public:
  using StartFn = std::function<absl::Status(const scheduling::PendingJob&, int64_t,
                                             const std::string&)>;
  using PreemptFn = std::function<void(const scheduling::RunningJob&,
                                       const scheduling::PendingJob&, const std::string&)>;
  using WaitFn = std::function<void(const scheduling::PendingJob&, const std::string&)>;
  PassActions(StartFn start, PreemptFn preempt, WaitFn wait)
      : start_(std::move(start)), preempt_(std::move(preempt)), wait_(std::move(wait)) {}

  bool Start(const scheduling::PendingJob& job, int64_t devices,
             const std::string& reason) override {
    absl::Status started = start_(job, devices, reason);
    if (!started.ok()) misfit_[job.id] = std::string(started.message());
    return started.ok();
  }
  void Preempt(const scheduling::RunningJob& victim, const scheduling::PendingJob& for_job,
               const std::string& reason) override {
    preempt_(victim, for_job, reason);
  }
  void Wait(const scheduling::PendingJob& job, const std::string& why) override {
    auto misfit = misfit_.find(job.id);
    wait_(job, misfit == misfit_.end() ? why : absl::StrCat(why, " (", misfit->second, ")"));
  }

 private:
  StartFn start_;
  PreemptFn preempt_;
  WaitFn wait_;
  // Why the free devices could not hold a job's mesh after all, by job id.
  std::map<std::string, std::string> misfit_;
};

// The policy's pools: alive and free devices per backend.
std::map<std::string, scheduling::PoolDevices> Pools(const std::vector<Device>& alive,
                                                     const std::vector<Device>& free) {
  std::map<std::string, scheduling::PoolDevices> pools;
  for (v1::Backend backend : {v1::BACKEND_CPU, v1::BACKEND_CUDA}) {
    scheduling::PoolDevices& pool = pools[BackendName(backend)];
    pool.alive = static_cast<int64_t>(DevicesForBackend(backend, alive).size());
    pool.free = static_cast<int64_t>(DevicesForBackend(backend, free).size());
  }
  return pools;
}

}  // namespace

void Cluster::ScheduleLocked() {
  // Nothing to place: skip listing every alive device (O(workers); a fleet of 10,000 agents
  // registering would pay it at each registration).
  if (pending_.empty()) return;
  const AliveDevices everything = AliveDevicesLocked();
  const std::vector<Device>& all_alive = everything.devices;
  const size_t alive_workers = everything.workers;
  const absl::Time lease_now = lease_clock_();
  std::vector<Device> all_free;
  for (const Device& device : all_alive) {
    if (busy_devices_.count(device.id) == 0) all_free.push_back(device);
  }
  // The pending jobs that could start now, as the policy sees them; the others say why not.
  std::vector<scheduling::PendingJob> pending;
  std::map<std::string, std::vector<int>> data_sizes;
  for (const auto& [order, job_id] : pending_) {
    JobEntry& entry = jobs_.at(job_id);
    const v1::JobSpec& spec = entry.job.spec();
    // An elastic data axis may be planned smaller (largest first); a fixed one has one size.
    const std::vector<int> sizes = DataParallelSizes(spec);
    const v1::JobSpec smallest = SpecWithDataParallelSize(spec, sizes.back());
    const int64_t need = RequiredDevices(smallest);
    if (entry.next_attempt_at > lease_now) {
      // Backing off after a failed attempt; it does not block younger jobs meanwhile.
      SetWaitingLocked(entry, absl::StrCat("the restart backoff to end (at ",
                                           absl::FormatTime("%H:%M:%E3S",
                                                            FromProtoTime(
                                                                entry.job.next_attempt_time()),
                                                            absl::UTCTimeZone()),
                                           " UTC)"));
      continue;
    }
    // Only devices of the kind the job's backend runs on, on workers that can run it.
    const std::vector<Device> alive = CandidateDevicesLocked(spec, all_alive);
    if (alive.empty()) {
      SetWaitingLocked(entry, all_alive.empty()
                                  ? absl::StrCat(need, " devices: no worker is alive")
                                  : absl::StrCat(need, " devices of the kind backend ",
                                                 BackendName(SchedulingBackend(spec)), " runs on",
                                                 CommandWorkerNote(spec),
                                                 ": no alive worker has any"));
      continue;
    }
    absl::StatusOr<Mesh> could = CreateMeshForJob(smallest.mesh(), alive);
    if (!could.ok()) {
      // Not even an idle cluster could hold it: wait for more workers, without blocking others.
      SetWaitingLocked(entry, absl::StrCat("workers: the ", Count(alive.size(), "device"),
                                           " of ", Count(alive_workers, "alive worker"),
                                           " cannot hold the mesh (", could.status().message(),
                                           ")"));
      continue;
    }
    pending.push_back(
        PendingViewLocked(entry, sizes, PoolName(SchedulingBackend(spec), all_alive)));
    data_sizes[job_id] = sizes;
  }
  if (pending.empty()) return;
  std::vector<scheduling::RunningJob> running;
  for (const std::string& id : job_order_) {
    const JobEntry& entry = jobs_.at(id);
    if (entry.job.state() == v1::JOB_STATE_RUNNING) running.push_back(RunningViewLocked(entry));
  }

  // The policy calls these during the pass, with mu_ still held.
  auto start = [&](const scheduling::PendingJob& job, int64_t devices,
                   const std::string& policy_reason)
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    JobEntry& entry = jobs_.at(job.id);
    const v1::JobSpec& spec = entry.job.spec();
    const std::vector<int>& sizes = data_sizes.at(job.id);
    std::vector<Device> free = CandidateDevicesLocked(spec, all_free);
    int planned_size = sizes.front();
    absl::StatusOr<Mesh> mesh = absl::UnavailableError(
        absl::StrCat(free.size(), " of the free devices can run it"));
    for (int size : sizes) {
      const v1::JobSpec planned = SpecWithDataParallelSize(spec, size);
      if (RequiredDevices(planned) != devices) continue;
      mesh = CreateMeshForJob(planned.mesh(), free);
      planned_size = size;
      break;
    }
    if (!mesh.ok()) return mesh.status();
    if (absl::Status layouts = LayoutsFor(spec, *mesh).status(); !layouts.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("no layout of the batch on that mesh: ", layouts.message()));
    }
    std::set<std::string> workers;
    for (const Device& device : mesh->devices()) workers.insert(device.worker_id);
    std::string reason =
        absl::StrCat("scheduled on ", Count(mesh->devices().size(), "device"), " of ",
                     Count(workers.size(), "worker"), " (", absl::StrJoin(workers, ", "), ")");
    if (planned_size != sizes.front()) {
      absl::StrAppend(&reason, "; elastic: data axis ", planned_size, " of at most ",
                      sizes.front(), ", the global batch kept");
    }
    if (!policy_reason.empty()) absl::StrAppend(&reason, "; ", policy_reason);
    std::set<int> taken;
    for (const Device& device : mesh->devices()) taken.insert(device.id);
    all_free.erase(std::remove_if(all_free.begin(), all_free.end(),
                                  [&](const Device& d) { return taken.count(d.id) > 0; }),
                   all_free.end());
    StartAttemptLocked(entry, *std::move(mesh), reason);
    return absl::OkStatus();
  };
  auto preempt = [&](const scheduling::RunningJob& victim, const scheduling::PendingJob& for_job,
                     const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    PreemptLocked(jobs_.at(victim.id), for_job.id, reason);
  };
  auto wait = [&](const scheduling::PendingJob& job, const std::string& why)
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    SetWaitingLocked(jobs_.at(job.id), why);
  };
  PassActions actions(start, preempt, wait);
  scheduler_.Schedule(lease_now, pending, running, Pools(all_alive, all_free), actions);
}

void Cluster::SetSchedulingConfig(v1::SchedulingConfig config) {
  uint64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    scheduler_.SetConfig(std::move(config));
    ++version_;
    ScheduleLocked();
    ticket = EnqueueLocked();
  }
  writer_->Wait(ticket).IgnoreError();  // retried by the writer
}

v1::SchedulingConfig Cluster::SchedulingConfig() const {
  absl::MutexLock lock(&mu_);
  return scheduler_.config();
}

std::vector<scheduling::QueueStatus> Cluster::Queues() const {
  absl::MutexLock lock(&mu_);
  return scheduler_.Queues();
}
}  // namespace substrax
