// The coordinator's services on gRPC's callback API: each method takes the authorization step
// (ServerState::Inline/Blocking), the per-request checks, then one call into the Cluster or the
// Rendezvous. Calls that may wait for a commit run on the blocking pool; the streams are in
// server_streams.cc.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/failpoint.h"
#include "core/status.h"
#include "coordinator/request_limits.h"
#include "coordinator/server_internal.h"
#include "rpc/grpc_status.h"
#include "rpc/pki.h"
#include "rpc/proto_time.h"

namespace substrax::server_internal {

// --- BlockingPool, StreamHandle ---

BlockingPool::~BlockingPool() { Stop(); }

void BlockingPool::Run(std::function<void()> call) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(call));
  // Every queued call needs an idle thread of its own: an idle thread woken for an earlier call
  // still counts as idle until it takes that call, and a call may block until a later one runs
  // (a Barrier waits for the other processes' Barrier calls), so queueing it behind another
  // could hold it until its timeout.
  if (static_cast<int>(queue_.size()) > idle_ &&
      static_cast<int>(threads_.size()) < max_threads_) {
    threads_.emplace_back([this] { Loop(); });
  }
}

void BlockingPool::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    ++idle_;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !queue_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    --idle_;
    if (queue_.empty()) return;  // stopping, nothing left
    std::function<void()> call = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    call();
    mu_.Lock();
  }
}

void BlockingPool::Stop() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void StreamHandle::Wake() {
  absl::MutexLock lock(&mu_);
  if (wake_) wake_();
}

void StreamHandle::Detach() {
  absl::MutexLock lock(&mu_);
  wake_ = nullptr;
}

// --- ServerState ---

grpc::ServerUnaryReactor* ServerState::Answer(grpc::CallbackServerContext* context,
                                              const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* ServerState::Inline(
    grpc::CallbackServerContext* context,
    const std::function<absl::Status(const Caller&)>& call) {
  absl::StatusOr<Caller> caller = authorizer.Decision(context);
  return Answer(context, caller.ok() ? call(*caller) : caller.status());
}

grpc::ServerUnaryReactor* ServerState::Blocking(
    grpc::CallbackServerContext* context, std::function<absl::Status(const Caller&)> call,
    BlockingPool* on) {
  absl::StatusOr<Caller> caller = authorizer.Decision(context);
  if (!caller.ok()) return Answer(context, caller.status());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  (on != nullptr ? on : &pool)->Run([reactor, call = std::move(call), who = *caller] {
    reactor->Finish(ToGrpcStatus(call(who)));
  });
  return reactor;
}

absl::Status ServerState::CheckWorker(const Caller& caller, const std::string& worker_id) {
  if (caller.unrestricted || caller.name == worker_id) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "the certificate of worker ", caller.name, " cannot act as worker ", worker_id,
      "; a worker's id is its certificate's common name"));
}

absl::Status ServerState::CheckOwner(const Caller& caller, const std::string& job_id,
                                     absl::string_view action) const {
  if (caller.Has(Role::kAdmin)) return absl::OkStatus();
  SUBSTRAX_ASSIGN_OR_RETURN(v1::Job job, cluster->GetJob(job_id));
  if (job.owner() == caller.name) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      caller.Describe(), " may not ", action, " job ", job_id, ", which ",
      job.owner().empty() ? std::string("nobody") : job.owner(),
      " submitted; a submitter may ", action, " only its own jobs (an admin any)"));
}

absl::StatusOr<std::string> ServerState::ReporterOf(const Caller& caller,
                                                   const std::string& job_id,
                                                   int attempt) const {
  if (caller.unrestricted) return std::string();
  if (!caller.attempt.has_value()) return caller.name;
  const AttemptScope& own = *caller.attempt;
  if (own.job_id != job_id || own.attempt != attempt) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the attempt token of ", own.Describe(), " cannot act for job ", job_id, " attempt ",
        attempt, "; a job's process acts only for its own attempt"));
  }
  // Checked at every call, against the cluster: the token itself never expires, but what it
  // admits ends with the attempt (cancelled, failed, restarted, the job deleted).
  absl::StatusOr<std::string> worker =
      cluster->WorkerOfProcess(own.job_id, own.attempt, own.process_index);
  if (!worker.ok()) {
    return absl::PermissionDeniedError(
        absl::StrCat("the attempt token of ", own.Describe(),
                     " is valid only while that attempt runs: ", worker.status().message()));
  }
  return worker;
}

void RedactForCaller(const Caller& caller, v1::Job* job) {
  if (caller.Has(Role::kAdmin) || job->owner() == caller.name) return;
  if (!job->has_spec()) return;
  v1::JobSpec& spec = *job->mutable_spec();
  for (auto* env : {spec.has_program() ? spec.mutable_program()->mutable_env() : nullptr,
                    spec.has_command() ? spec.mutable_command()->mutable_env() : nullptr}) {
    if (env == nullptr) continue;
    for (auto& [name, value] : *env) value = kRedactedEnvValue;
  }
}

std::string ServerState::SecretOf(const std::string& job_id, int attempt) const {
  return pki::HmacSha256Hex(options.rendezvous_key, absl::StrCat(job_id, "/", attempt));
}

std::string ServerState::TokenOf(const std::string& job_id, int attempt,
                                 int process_index) const {
  return AttemptToken(options.rendezvous_key, AttemptScope{job_id, attempt, process_index});
}

absl::Status ServerState::CheckScope(const Caller& caller,
                                     const v1::RendezvousScope& scope) const {
  SUBSTRAX_RETURN_IF_ERROR(ReporterOf(caller, scope.job_id(), scope.attempt()).status());
  SUBSTRAX_RETURN_IF_ERROR(cluster->CheckAttemptRunning(scope.job_id(), scope.attempt()));
  if (!pki::ConstantTimeEquals(scope.secret(), SecretOf(scope.job_id(), scope.attempt()))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "wrong or missing rendezvous secret for attempt ", scope.attempt(), " of job ",
        scope.job_id(), "; only that attempt's runners hold it"));
  }
  return absl::OkStatus();
}

absl::Duration ServerState::CapWait(const google::protobuf::Duration& d) const {
  return std::min(FromProtoDuration(d), options.max_rendezvous_wait);
}

void ServerState::AddStream(const std::shared_ptr<StreamHandle>& handle) {
  absl::MutexLock lock(&streams_mu);
  streams.insert(handle);
}

void ServerState::RemoveStream(const std::shared_ptr<StreamHandle>& handle) {
  absl::MutexLock lock(&streams_mu);
  streams.erase(handle);
}

void ServerState::SetQueuesSource(QueuesConfigStatus status) {
  absl::MutexLock lock(&queues_mu);
  queues_config = std::move(status);
}

v1::ListQueuesResponse ServerState::ListQueues() const {
  QueuesConfigStatus source;
  {
    absl::MutexLock lock(&queues_mu);
    source = queues_config;
  }
  return MakeListQueuesResponse(cluster->SchedulingConfig(), cluster->Queues(), source);
}

void ServerState::StopStreams() {
  stopping.store(true);
  std::set<std::shared_ptr<StreamHandle>> all;
  {
    absl::MutexLock lock(&streams_mu);
    all = streams;
  }
  for (const auto& handle : all) handle->Wake();
}

namespace {

// Copies a StatusOr's value into *out when OK; its status.
template <typename T>
absl::Status Into(absl::StatusOr<T> value, T* out) {
  if (value.ok()) *out = *std::move(value);
  return value.status();
}

class CoordinatorServiceImpl final : public CoordinatorServiceBase {
 public:
  explicit CoordinatorServiceImpl(ServerState* state) : s_(state) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override {
    return s_->Blocking(context, [this, request, response](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      SUBSTRAX_RETURN_IF_ERROR(ServerState::CheckWorker(caller, request->worker_id()));
      return Into(s_->cluster->RegisterWorker(*request), response);
    });
  }

  // Heartbeat: HeartbeatServer (server_heartbeats.cc).

  grpc::ServerWriteReactor<v1::WatchAssignmentsResponse>* WatchAssignments(
      grpc::CallbackServerContext* context, const v1::WatchAssignmentsRequest* request) override {
    absl::StatusOr<Caller> caller = s_->authorizer.Decision(context);
    absl::Status allowed =
        caller.ok() ? ServerState::CheckWorker(*caller, request->worker_id()) : caller.status();
    if (allowed.ok()) allowed = CheckRequest(*request);
    if (!allowed.ok()) return new Refusal<v1::WatchAssignmentsResponse>(ToGrpcStatus(allowed));
    return StartAssignmentStream(s_, *request);
  }

  grpc::ServerUnaryReactor* ReportSteps(grpc::CallbackServerContext* context,
                                        const v1::ReportStepsRequest* request,
                                        v1::ReportStepsResponse*) override {
    return s_->Blocking(context, [this, request](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      // A worker reports only its own devices, a job's process only its process's (unchecked
      // with --insecure).
      SUBSTRAX_ASSIGN_OR_RETURN(std::string reporter,
                                s_->ReporterOf(caller, request->job_id(), request->attempt()));
      const absl::Status status = s_->cluster->ReportSteps(*request, reporter);
      if (status.ok() && s_->step_reports != nullptr) {
        s_->step_reports->Increment(request->reports_size());
      }
      return status;
    });
  }

  grpc::ServerUnaryReactor* ReportAttemptStatus(grpc::CallbackServerContext* context,
                                                const v1::ReportAttemptStatusRequest* request,
                                                v1::ReportAttemptStatusResponse*) override {
    return s_->Blocking(context, [this, request](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      // The cluster checks that this worker runs the reported process.
      SUBSTRAX_RETURN_IF_ERROR(ServerState::CheckWorker(caller, request->worker_id()));
      if (request->state() == v1::RUNNER_STATE_SUCCEEDED &&
          FailpointArmed("between_successes")) {
        // Reports one at a time, so that the first success is stored before the second looks.
        static absl::Mutex serial;
        absl::MutexLock lock(&serial);
        absl::StatusOr<v1::Job> job = s_->cluster->GetJob(request->job_id());
        if (job.ok() && job->attempt() == request->attempt() &&
            job->succeeded_processes_size() > 0) {
          Failpoint("between_successes");
        }
        return s_->cluster->ReportAttemptStatus(*request);
      }
      return s_->cluster->ReportAttemptStatus(*request);
    });
  }

  grpc::ServerUnaryReactor* ReportCheckpoints(grpc::CallbackServerContext* context,
                                              const v1::ReportCheckpointsRequest* request,
                                              v1::ReportCheckpointsResponse*) override {
    return s_->Blocking(context, [this, request](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      // Only the worker of process 0, or process 0's attempt token (unchecked with --insecure).
      SUBSTRAX_ASSIGN_OR_RETURN(std::string reporter,
                                s_->ReporterOf(caller, request->job_id(), request->attempt()));
      if (caller.attempt.has_value() && caller.attempt->process_index != 0) {
        return absl::PermissionDeniedError(absl::StrCat(
            "the attempt token of ", caller.attempt->Describe(),
            " cannot report checkpoints: only process 0 of an attempt does"));
      }
      return s_->cluster->ReportCheckpoints(*request, reporter);
    });
  }

  grpc::ServerUnaryReactor* KeyValueSet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueSetRequest* request,
                                        v1::KeyValueSetResponse*) override {
    return s_->Inline(context, [&](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      const auto& scope = request->scope();
      SUBSTRAX_RETURN_IF_ERROR(s_->CheckScope(caller, scope));
      return s_->rendezvous->Set({scope.job_id(), scope.attempt()}, request->key(),
                                 request->value(), request->allow_overwrite());
    });
  }

  // Rendezvous waits hold a thread of their own pool (Rendezvous blocks), never gRPC's.
  grpc::ServerUnaryReactor* KeyValueGet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueGetRequest* request,
                                        v1::KeyValueGetResponse* response) override {
    return s_->Blocking(
        context,
        [this, context, request, response](const Caller& caller) {
          SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
          const auto& scope = request->scope();
          SUBSTRAX_RETURN_IF_ERROR(s_->CheckScope(caller, scope));
          absl::StatusOr<std::string> value = s_->rendezvous->Get(
              {scope.job_id(), scope.attempt()}, request->key(),
              s_->CapWait(request->timeout()), [context] { return context->IsCancelled(); });
          if (value.ok()) response->set_value(*std::move(value));
          return value.status();
        },
        &s_->rendezvous_pool);
  }

  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* context,
                                    const v1::BarrierRequest* request,
                                    v1::BarrierResponse*) override {
    return s_->Blocking(
        context,
        [this, context, request](const Caller& caller) {
          SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
          const auto& scope = request->scope();
          SUBSTRAX_RETURN_IF_ERROR(s_->CheckScope(caller, scope));
          // A job's process stands in a barrier only as itself.
          if (caller.attempt.has_value() &&
              request->participant() != caller.attempt->process_index) {
            return absl::PermissionDeniedError(absl::StrCat(
                "the attempt token of ", caller.attempt->Describe(),
                " cannot enter barrier '", request->barrier_id(), "' as participant ",
                request->participant(), "; a process takes part as its own index"));
          }
          return s_->rendezvous->Barrier(
              {scope.job_id(), scope.attempt()}, request->barrier_id(), request->participant(),
              request->num_participants(), s_->CapWait(request->timeout()),
              [context] { return context->IsCancelled(); });
        },
        &s_->rendezvous_pool);
  }

  grpc::ServerUnaryReactor* ShipLogs(grpc::CallbackServerContext* context,
                                     const v1::ShipLogsRequest* request,
                                     v1::ShipLogsResponse* response) override {
    return s_->Blocking(context, [this, request, response](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      // The cluster checks that this worker ran the process.
      SUBSTRAX_RETURN_IF_ERROR(ServerState::CheckWorker(caller, request->worker_id()));
      SUBSTRAX_ASSIGN_OR_RETURN(int64_t next, s_->cluster->ShipLogs(*request));
      response->set_next_offset(next);
      return absl::OkStatus();
    });
  }

 private:
  ServerState* const s_;
};

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  explicit JobServiceImpl(ServerState* state) : s_(state) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override {
    return s_->Blocking(context, [this, request, response](const Caller& caller) {
      // An admin's job may use any checkpoint path under the roots; everyone else's stays in
      // their own directory. On an --insecure cluster every caller is "anonymous", and all
      // jobs share its directory (docs/checkpoints.md).
      const bool admin = !caller.unrestricted && caller.Has(Role::kAdmin);
      // Queues admit by role: the caller's role names ("admin" for an --insecure caller, whom
      // every check passes).
      std::vector<std::string> roles;
      for (Role role : {Role::kAdmin, Role::kSubmitter, Role::kViewer}) {
        if (caller.Has(role)) roles.push_back(RoleName(role));
      }
      SUBSTRAX_ASSIGN_OR_RETURN(
          v1::Job job, s_->cluster->SubmitJob(request->spec(), caller.name, admin,
                                              request->request_id(), roles));
      if (s_->jobs_submitted != nullptr) s_->jobs_submitted->Increment();
      *response->mutable_job() = std::move(job);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override {
    return s_->Inline(context, [&](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      SUBSTRAX_RETURN_IF_ERROR(Into(s_->cluster->GetJob(request->job_id()), response->mutable_job()));
      RedactForCaller(caller, response->mutable_job());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* DiagnoseJob(grpc::CallbackServerContext* context,
                                        const v1::DiagnoseJobRequest* request,
                                        v1::DiagnoseJobResponse* response) override {
    return s_->Inline(context, [&](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      SUBSTRAX_RETURN_IF_ERROR(Into(s_->cluster->DiagnoseJob(request->job_id()), response));
      RedactForCaller(caller, response->mutable_job());
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* RunDoctor(grpc::CallbackServerContext* context,
                                      const v1::RunDoctorRequest* request,
                                      v1::RunDoctorResponse* response) override {
    return s_->Blocking(context, [this, request, response](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      SUBSTRAX_ASSIGN_OR_RETURN(
          v1::Job job, s_->cluster->RunDoctor({request->workers().begin(),
                                               request->workers().end()},
                                              caller.name));
      if (s_->jobs_submitted != nullptr) s_->jobs_submitted->Increment();
      *response->mutable_job() = std::move(job);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override {
    return s_->Inline(context, [&](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      SUBSTRAX_RETURN_IF_ERROR(Into(s_->cluster->ListJobsPage(*request), response));
      for (v1::Job& job : *response->mutable_jobs()) RedactForCaller(caller, &job);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override {
    return s_->Blocking(context, [this, request, response](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      SUBSTRAX_RETURN_IF_ERROR(s_->CheckOwner(caller, request->job_id(), "cancel"));
      return Into(s_->cluster->CancelJob(request->job_id(), request->reason()),
                  response->mutable_job());
    });
  }

  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse*) override {
    return s_->Blocking(context, [this, request](const Caller& caller) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      SUBSTRAX_RETURN_IF_ERROR(s_->CheckOwner(caller, request->job_id(), "delete"));
      return s_->cluster->DeleteJob(request->job_id());
    });
  }

  grpc::ServerWriteReactor<v1::WatchJobResponse>* WatchJob(
      grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) override {
    absl::StatusOr<Caller> caller = s_->authorizer.Decision(context);
    absl::Status allowed = caller.ok() ? CheckRequest(*request) : caller.status();
    if (!allowed.ok()) return new Refusal<v1::WatchJobResponse>(ToGrpcStatus(allowed));
    return StartJobStream(s_, *request, *caller);
  }

  grpc::ServerWriteReactor<v1::ReadLogsResponse>* ReadLogs(
      grpc::CallbackServerContext* context, const v1::ReadLogsRequest* request) override {
    absl::StatusOr<Caller> caller = s_->authorizer.Decision(context);
    absl::Status allowed = caller.ok() ? CheckRequest(*request) : caller.status();
    if (!allowed.ok()) return new Refusal<v1::ReadLogsResponse>(ToGrpcStatus(allowed));
    return StartLogStream(s_, *request);
  }

  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest*,
                                        v1::ListWorkersResponse* response) override {
    return s_->Inline(context, [&](const Caller&) {
      for (v1::Worker& w : s_->cluster->ListWorkers()) *response->add_workers() = std::move(w);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* ListQueues(grpc::CallbackServerContext* context,
                                       const v1::ListQueuesRequest* request,
                                       v1::ListQueuesResponse* response) override {
    return s_->Inline(context, [&](const Caller&) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      *response = s_->ListQueues();
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetMesh(grpc::CallbackServerContext* context,
                                    const v1::GetMeshRequest* request,
                                    v1::GetMeshResponse* response) override {
    return s_->Inline(context, [&](const Caller&) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      return Into(s_->cluster->GetMesh(request->job_id()), response);
    });
  }

 private:
  ServerState* const s_;
};

class MetricsServiceImpl final : public v1::MetricsService::CallbackService {
 public:
  explicit MetricsServiceImpl(ServerState* state) : s_(state) {}

  // On the pool: it reads the store.
  grpc::ServerUnaryReactor* QueryMetrics(grpc::CallbackServerContext* context,
                                         const v1::QueryMetricsRequest* request,
                                         v1::QueryMetricsResponse* response) override {
    return s_->Blocking(context, [this, request, response](const Caller&) {
      SUBSTRAX_RETURN_IF_ERROR(CheckRequest(*request));
      return Into(s_->cluster->QueryMetrics(*request), response);
    });
  }

 private:
  ServerState* const s_;
};

}  // namespace

std::unique_ptr<CoordinatorServiceBase> MakeCoordinatorService(ServerState* state) {
  return std::make_unique<CoordinatorServiceImpl>(state);
}

std::unique_ptr<v1::JobService::CallbackService> MakeJobService(ServerState* state) {
  return std::make_unique<JobServiceImpl>(state);
}

std::unique_ptr<v1::MetricsService::CallbackService> MakeMetricsService(ServerState* state) {
  return std::make_unique<MetricsServiceImpl>(state);
}

}  // namespace substrax::server_internal
