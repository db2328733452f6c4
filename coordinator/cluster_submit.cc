// Job submission: the submit policy against the cluster as it is, ids from the stored counter,
// and idempotent submits by request id.
#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "coordinator/cluster.h"
#include "coordinator/cluster_internal.h"
#include "coordinator/limits.h"
#include "coordinator/submit_policy.h"
#include "core/data_paths.h"
#include "core/job_spec.h"
#include "core/status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "rpc/proto_time.h"

namespace substrax {

absl::StatusOr<v1::JobSpec> Cluster::AdmitJobSpec(v1::JobSpec spec,
                                                  const std::string& owner_dir) const {
  AliveDevices alive;
  WorkerOffers offers;
  {
    absl::MutexLock lock(&mu_);
    alive = AliveDevicesLocked();
    // Every known worker's roots and environments, alive or not: a dead worker may come back,
    // and a job whose data it holds waits for it like one that waits for devices.
    std::set<std::string> data, checkpoints, programs, python_envs;
    for (const auto& [id, worker] : workers_) {
      const v1::Worker& w = worker.proto;
      data.insert(w.data_roots().begin(), w.data_roots().end());
      checkpoints.insert(w.checkpoint_roots().begin(), w.checkpoint_roots().end());
      programs.insert(w.programs_dirs().begin(), w.programs_dirs().end());
      python_envs.insert(w.python_envs().begin(), w.python_envs().end());
      offers.runs_commands = offers.runs_commands || w.runs_commands();
    }
    offers.data_roots.assign(data.begin(), data.end());
    offers.checkpoint_roots.assign(checkpoints.begin(), checkpoints.end());
    offers.programs_dirs.assign(programs.begin(), programs.end());
    offers.python_envs.assign(python_envs.begin(), python_envs.end());
  }
  // Without the lock: a worker that dies meanwhile only makes the admitted job wait.
  return substrax::AdmitJobSpec(std::move(spec), alive, offers, owner_dir, options_.job_env_allow,
                                options_.refuse_jobs_that_cannot_fit);
}

namespace {

absl::Status CheckRequestId(const std::string& request_id) {
  if (request_id.size() > limits::kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id: ", request_id.size(),
                                                   " bytes, more than the limit of ",
                                                   limits::kMaxRequestIdBytes));
  }
  for (char c : request_id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') {
      return absl::InvalidArgumentError(
          "request_id: only letters, digits, '-' and '_' are allowed (substraxctl draws one at "
          "random)");
    }
  }
  return absl::OkStatus();
}

// 64-bit FNV-1a of the spec's deterministic serialization, in hex: a retry sends the same
// bytes, and a different spec under the same owner and request id is what it tells apart.
std::string SpecFingerprint(const v1::JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&coded);
  }
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return absl::StrCat(absl::Hex(hash, absl::kZeroPad16));
}

}  // namespace

absl::StatusOr<v1::Job> Cluster::RepeatedSubmitLocked(const std::string& job_id,
                                                      const std::string& request_id,
                                                      const std::string& fingerprint) const {
  if (job_id.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "a submit with request id ", request_id,
        " is still being stored; retry with the same request id to get its job"));
  }
  const JobEntry& entry = jobs_.at(job_id);
  if (entry.job.request_fingerprint() != fingerprint) {
    return absl::AlreadyExistsError(absl::StrCat(
        "request id ", request_id, " already made job ", job_id,
        " from another spec; submit a changed spec with a new request id"));
  }
  return JobViewLocked(entry);
}

absl::Status Cluster::AdmitToQueueLocked(const v1::JobSpec& spec, const std::string& owner,
                                          bool admin, const std::vector<std::string>& roles,
                                          v1::Job* job) const {
  // An admin by role (or an --insecure caller) may submit anywhere and pin its job.
  const bool queue_admin =
      admin || std::find(roles.begin(), roles.end(), "admin") != roles.end();
  if (spec.has_preemptible() && !spec.preemptible() && !queue_admin) {
    return absl::PermissionDeniedError(
        "spec.preemptible: false is for admins only: a job that cannot be preempted holds its "
        "devices against every priority; leave it out (true)");
  }
  // Its queue and class, as the configuration in force says now.
  const std::vector<int> sizes = DataParallelSizes(spec);
  SUBSTRAX_ASSIGN_OR_RETURN(
      scheduling::Scheduler::Admission admission,
      scheduler_.Admit(spec.queue(), spec.priority_class(),
                       cluster_internal::PoolName(SchedulingBackend(spec),
                                                  AliveDevicesLocked().devices),
                       RequiredDevices(SpecWithDataParallelSize(spec, sizes.back())), owner,
                       roles, queue_admin));
  job->set_queue(admission.queue);
  job->set_priority_class(admission.priority_class);
  job->set_priority(admission.priority);
  return absl::OkStatus();
}

absl::StatusOr<v1::Job> Cluster::SubmitJob(v1::JobSpec submitted, const std::string& owner,
                                           bool admin, const std::string& request_id,
                                           const std::vector<std::string>& roles) {
  if (submitted.has_doctor()) {
    return absl::InvalidArgumentError(
        "spec.doctor: doctor jobs are made by the coordinator; run `substraxctl doctor` "
        "(an admin's command) instead of submitting one");
  }
  return SubmitChecked(std::move(submitted), owner, admin, request_id, roles);
}

absl::StatusOr<v1::Job> Cluster::SubmitChecked(v1::JobSpec submitted, const std::string& owner,
                                               bool admin, const std::string& request_id,
                                               const std::vector<std::string>& roles) {
  if (submitted.ByteSizeLong() > limits::kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("spec: ", submitted.ByteSizeLong(),
                                                   " bytes, more than the limit of ",
                                                   limits::kMaxSpecBytes));
  }
  SUBSTRAX_RETURN_IF_ERROR(CheckRequestId(request_id));
  // Checkpoints belong to their owner: another submitter must not read a job's weights, poison
  // its next resume or rotate its checkpoints away. Admins may write anywhere under the roots.
  const std::string owner_dir = admin ? "" : OwnerDirectoryName(owner);
  if (owner_dir.size() > kMaxDirectoryNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the submitter's name '", BoundedText(owner, 64), "' makes a directory name of ",
        owner_dir.size(), " bytes, more than a file system allows (", kMaxDirectoryNameBytes,
        "): checkpoint directories are named after their owner; use a shorter name"));
  }
  const std::pair<std::string, std::string> request_key{owner, request_id};
  std::string fingerprint;
  if (!request_id.empty()) {
    fingerprint = SpecFingerprint(submitted);
    absl::MutexLock lock(&mu_);
    auto made = submit_requests_.find(request_key);
    if (made != submit_requests_.end()) {
      return RepeatedSubmitLocked(made->second, request_id, fingerprint);
    }
  }
  SUBSTRAX_ASSIGN_OR_RETURN(v1::JobSpec spec, AdmitJobSpec(std::move(submitted), owner_dir));
  const int64_t total_steps = TotalSteps(spec);
  v1::Job job;
  StateBatch batch;
  {
    absl::MutexLock lock(&mu_);
    if (!request_id.empty()) {
      // A retry may have arrived while this one was admitted.
      auto made = submit_requests_.find(request_key);
      if (made != submit_requests_.end()) {
        return RepeatedSubmitLocked(made->second, request_id, fingerprint);
      }
    }
    const int active = ActiveJobsLocked() + submits_in_flight_;
    if (active >= options_.max_active_jobs) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the coordinator holds ", active, " pending or running jobs, its limit (",
          "--max-active-jobs ", options_.max_active_jobs,
          "); wait for some to end, or cancel some"));
    }
    SUBSTRAX_RETURN_IF_ERROR(AdmitToQueueLocked(spec, owner, admin, roles, &job));
    ++submits_in_flight_;
    if (!request_id.empty()) submit_requests_[request_key] = "";  // being stored
    const absl::Time now = clock_();
    // A number burnt by a failed write is never handed out again; the counter is stored with
    // the job, so a restart never hands out the number of a job deleted since.
    batch.next_job_number = next_job_number_ + 1;
    job.set_id(absl::StrCat(spec.name(), "-", next_job_number_++));
    job.set_owner(owner);
    job.set_checkpoint_owner_directory(owner_dir);
    job.set_request_id(request_id);
    job.set_request_fingerprint(fingerprint);
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
  }
  // Stored before it exists in memory, so a failed write leaves no job behind (the client's
  // retry makes the only one). Written here, without the lock; the store serializes it with the
  // writer's commits.
  batch.jobs.push_back(job);
  absl::Status stored = Annotate(state_->Commit(batch), "the job was not queued");
  uint64_t ticket = 0;
  v1::Job view;
  {
    absl::MutexLock lock(&mu_);
    --submits_in_flight_;
    if (!stored.ok()) {
      if (!request_id.empty()) submit_requests_.erase(request_key);
      return stored;
    }
    const std::string id = job.id();
    if (!request_id.empty()) submit_requests_[request_key] = id;
    JobEntry& entry = jobs_[id];
    entry.job = std::move(job);
    entry.pending_reason = "submitted";
    entry.pending_since = lease_clock_();
    entry.order = next_order_++;
    NotePendingLocked(entry);
    job_order_.push_back(id);
    ++version_;
    ScheduleLocked();
    ticket = EnqueueLocked();
    view = JobViewLocked(jobs_.at(id));
  }
  // The job is stored (acknowledged); what scheduling changed is retried by the writer if this
  // commit fails.
  writer_->Wait(ticket).IgnoreError();
  return view;
}

}  // namespace substrax
