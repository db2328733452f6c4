#include "coordinator/server.h"

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/failpoint.h"
#include "core/status.h"
#include "proto/health_server.h"
#include "rpc/grpc_status.h"
#include "rpc/keepalive.h"
#include "rpc/pki.h"
#include "rpc/proto_time.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"

namespace substrax {
namespace {

// How long a stream handler waits for a change before it looks at cancellation again.
constexpr absl::Duration kStreamPoll = absl::Milliseconds(250);

// What the connection of `context` proved: a verified client certificate's CN and subject, and
// the authorization header.
PeerCredentials PeerOf(const grpc::ServerContext& context) {
  PeerCredentials peer;
  if (std::shared_ptr<const grpc::AuthContext> auth = context.auth_context()) {
    for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME)) {
      peer.common_name.assign(v.data(), v.size());
    }
    for (const grpc::string_ref& v : auth->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME)) {
      peer.subject.assign(v.data(), v.size());
    }
  }
  auto header = context.client_metadata().find("authorization");
  if (header != context.client_metadata().end()) {
    peer.authorization.emplace(header->second.data(), header->second.size());
  }
  return peer;
}

}  // namespace

// Authorizes `method` (MethodRules) for the call of `context`, or returns the refusal.
#define SUBSTRAX_AUTHORIZE(caller, context, method)                                   \
  absl::StatusOr<Caller> caller = impl_->auth->Authorize(PeerOf(*(context)), method); \
  if (!caller.ok()) return ToGrpcStatus(caller.status())

struct CoordinatorServer::Impl {
  Impl(const CoordinatorServerOptions& o, Cluster* c, Rendezvous* r, Authenticator* a,
       std::atomic<bool>* s)
      : options(o), cluster(c), rendezvous(r), auth(a), stopping(s) {}

  absl::Duration CapWait(const google::protobuf::Duration& d) const {
    return std::min(FromProtoDuration(d), options.max_rendezvous_wait);
  }

  // The secret of an attempt's rendezvous scope (Assignment.rendezvous_secret).
  std::string SecretOf(const std::string& job_id, int attempt) const {
    return pki::HmacSha256Hex(options.rendezvous_key, absl::StrCat(job_id, "/", attempt));
  }

  // OK iff the scope is a running attempt and carries that attempt's secret.
  absl::Status CheckScope(const v1::RendezvousScope& scope) const {
    SUBSTRAX_RETURN_IF_ERROR(cluster->CheckAttemptRunning(scope.job_id(), scope.attempt()));
    if (!pki::ConstantTimeEquals(scope.secret(), SecretOf(scope.job_id(), scope.attempt()))) {
      return absl::PermissionDeniedError(absl::StrCat(
          "wrong or missing rendezvous secret for attempt ", scope.attempt(), " of job ",
          scope.job_id(), "; only that attempt's runners hold it"));
    }
    return absl::OkStatus();
  }

  // A worker acts only as itself: its certificate's CN is its worker id.
  static absl::Status CheckWorker(const Caller& caller, const std::string& worker_id) {
    if (caller.unrestricted || caller.name == worker_id) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "the certificate of worker ", caller.name, " cannot act as worker ", worker_id,
        "; a worker's id is its certificate's common name"));
  }

  // A submitter cancels or deletes only its own jobs; an admin any.
  absl::Status CheckOwner(const Caller& caller, const std::string& job_id,
                          absl::string_view action) const {
    if (caller.Has(Role::kAdmin)) return absl::OkStatus();
    SUBSTRAX_ASSIGN_OR_RETURN(v1::Job job, cluster->GetJob(job_id));
    if (job.owner() == caller.name) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        caller.Describe(), " may not ", action, " job ", job_id, ", which ",
        job.owner().empty() ? std::string("nobody") : job.owner(),
        " submitted; a submitter may ", action, " only its own jobs (an admin any)"));
  }

  // Log streams wait for ShipLogs: log_version counts the pieces stored.
  void NotifyLogs() {
    absl::MutexLock lock(&log_mu);
    ++log_version;
  }
  uint64_t LogVersion() {
    absl::MutexLock lock(&log_mu);
    return log_version;
  }
  void AwaitLogs(uint64_t seen, absl::Duration timeout) {
    absl::MutexLock lock(&log_mu);
    auto changed = [this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(log_mu) {
      return log_version > seen;
    };
    log_mu.AwaitWithTimeout(absl::Condition(&changed), timeout);
  }

  class CoordinatorServiceImpl final : public v1::CoordinatorService::Service {
   public:
    explicit CoordinatorServiceImpl(Impl* impl) : impl_(impl) {}

    grpc::Status RegisterWorker(grpc::ServerContext* context,
                                const v1::RegisterWorkerRequest* request,
                                v1::RegisterWorkerResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/RegisterWorker");
      if (absl::Status s = CheckWorker(*caller, request->worker_id()); !s.ok()) {
        return ToGrpcStatus(s);
      }
      absl::StatusOr<v1::RegisterWorkerResponse> r = impl_->cluster->RegisterWorker(*request);
      if (r.ok()) *response = *std::move(r);
      return ToGrpcStatus(r.status());
    }

    grpc::Status Heartbeat(grpc::ServerContext* context, const v1::HeartbeatRequest* request,
                           v1::HeartbeatResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/Heartbeat");
      if (absl::Status s = CheckWorker(*caller, request->worker_id()); !s.ok()) {
        return ToGrpcStatus(s);
      }
      absl::StatusOr<v1::HeartbeatResponse> r = impl_->cluster->Heartbeat(*request);
      if (r.ok()) *response = *std::move(r);
      return ToGrpcStatus(r.status());
    }

    grpc::Status WatchAssignments(grpc::ServerContext* context,
                                  const v1::WatchAssignmentsRequest* request,
                                  grpc::ServerWriter<v1::WatchAssignmentsResponse>* writer) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/WatchAssignments");
      if (absl::Status s = CheckWorker(*caller, request->worker_id()); !s.ok()) {
        return ToGrpcStatus(s);
      }
      // Resumes after the daemon's last event (Cluster::PollAssignments).
      int64_t cursor = request->cursor();
      std::string epoch = request->epoch();
      uint64_t seen = 0;
      while (!context->IsCancelled() && !impl_->stopping->load()) {
        seen = impl_->cluster->version();
        absl::StatusOr<std::vector<v1::WatchAssignmentsResponse>> events =
            impl_->cluster->PollAssignments(request->worker_id(), request->incarnation(), epoch,
                                            &cursor);
        epoch = impl_->cluster->epoch();
        if (!events.ok()) return ToGrpcStatus(events.status());
        for (auto& event : *events) {
          Failpoint(event.has_start() ? "before_send_start" : "before_send_stop");
          if (event.has_start()) {
            v1::Assignment* a = event.mutable_start();
            a->set_rendezvous_secret(impl_->SecretOf(a->job_id(), a->attempt()));
          }
          if (!writer->Write(event)) return grpc::Status::CANCELLED;
        }
        impl_->cluster->AwaitChange(seen, kStreamPoll);
      }
      return ToGrpcStatus(absl::UnavailableError("the coordinator is shutting down"));
    }

    grpc::Status ReportSteps(grpc::ServerContext* context, const v1::ReportStepsRequest* request,
                             v1::ReportStepsResponse*) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/ReportSteps");
      // A worker reports only its own devices (unchecked with --insecure).
      const absl::Status status =
          impl_->cluster->ReportSteps(*request, caller->unrestricted ? "" : caller->name);
      if (status.ok() && impl_->step_reports != nullptr) {
        impl_->step_reports->Increment(request->reports_size());
      }
      return ToGrpcStatus(status);
    }

    grpc::Status ReportAttemptStatus(grpc::ServerContext* context,
                                     const v1::ReportAttemptStatusRequest* request,
                                     v1::ReportAttemptStatusResponse*) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/ReportAttemptStatus");
      // The cluster checks that this worker runs the reported process.
      if (absl::Status s = CheckWorker(*caller, request->worker_id()); !s.ok()) {
        return ToGrpcStatus(s);
      }
      if (request->state() == v1::RUNNER_STATE_SUCCEEDED &&
          FailpointArmed("between_successes")) {
        // Reports one at a time, so that the first success is stored before the second looks.
        static absl::Mutex serial;
        absl::MutexLock lock(&serial);
        absl::StatusOr<v1::Job> job = impl_->cluster->GetJob(request->job_id());
        if (job.ok() && job->attempt() == request->attempt() &&
            job->succeeded_processes_size() > 0) {
          Failpoint("between_successes");
        }
        return ToGrpcStatus(impl_->cluster->ReportAttemptStatus(*request));
      }
      return ToGrpcStatus(impl_->cluster->ReportAttemptStatus(*request));
    }

    grpc::Status ReportCheckpoints(grpc::ServerContext* context,
                                   const v1::ReportCheckpointsRequest* request,
                                   v1::ReportCheckpointsResponse*) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/ReportCheckpoints");
      // Only the worker of process 0 (unchecked with --insecure).
      return ToGrpcStatus(impl_->cluster->ReportCheckpoints(
          *request, caller->unrestricted ? "" : caller->name));
    }

    grpc::Status KeyValueSet(grpc::ServerContext* context, const v1::KeyValueSetRequest* request,
                             v1::KeyValueSetResponse*) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/KeyValueSet");
      const auto& scope = request->scope();
      if (absl::Status s = impl_->CheckScope(scope); !s.ok()) return ToGrpcStatus(s);
      return ToGrpcStatus(impl_->rendezvous->Set({scope.job_id(), scope.attempt()}, request->key(),
                                           request->value(), request->allow_overwrite()));
    }

    grpc::Status KeyValueGet(grpc::ServerContext* context, const v1::KeyValueGetRequest* request,
                             v1::KeyValueGetResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/KeyValueGet");
      const auto& scope = request->scope();
      if (absl::Status s = impl_->CheckScope(scope); !s.ok()) return ToGrpcStatus(s);
      absl::StatusOr<std::string> value = impl_->rendezvous->Get(
          {scope.job_id(), scope.attempt()}, request->key(), impl_->CapWait(request->timeout()),
          [context] { return context->IsCancelled(); });
      if (value.ok()) response->set_value(*std::move(value));
      return ToGrpcStatus(value.status());
    }

    grpc::Status Barrier(grpc::ServerContext* context, const v1::BarrierRequest* request,
                         v1::BarrierResponse*) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/Barrier");
      const auto& scope = request->scope();
      if (absl::Status s = impl_->CheckScope(scope); !s.ok()) return ToGrpcStatus(s);
      return ToGrpcStatus(impl_->rendezvous->Barrier({scope.job_id(), scope.attempt()},
                                               request->barrier_id(), request->participant(),
                                               request->num_participants(),
                                               impl_->CapWait(request->timeout()),
                                               [context] { return context->IsCancelled(); }));
    }

    grpc::Status ShipLogs(grpc::ServerContext* context, const v1::ShipLogsRequest* request,
                          v1::ShipLogsResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.CoordinatorService/ShipLogs");
      // The cluster checks that this worker ran the process.
      if (absl::Status s = CheckWorker(*caller, request->worker_id()); !s.ok()) {
        return ToGrpcStatus(s);
      }
      absl::StatusOr<int64_t> next = impl_->cluster->ShipLogs(*request);
      if (!next.ok()) return ToGrpcStatus(next.status());
      response->set_next_offset(*next);
      impl_->NotifyLogs();
      return grpc::Status::OK;
    }

   private:
    Impl* const impl_;
  };

  class JobServiceImpl final : public v1::JobService::Service {
   public:
    explicit JobServiceImpl(Impl* impl) : impl_(impl) {}

    grpc::Status SubmitJob(grpc::ServerContext* context, const v1::SubmitJobRequest* request,
                           v1::SubmitJobResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/SubmitJob");
      absl::StatusOr<v1::Job> job = impl_->cluster->SubmitJob(request->spec(), caller->name);
      if (!job.ok()) return ToGrpcStatus(job.status());
      if (impl_->jobs_submitted != nullptr) impl_->jobs_submitted->Increment();
      *response->mutable_job() = *std::move(job);
      return grpc::Status::OK;
    }

    grpc::Status GetJob(grpc::ServerContext* context, const v1::GetJobRequest* request,
                        v1::GetJobResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/GetJob");
      absl::StatusOr<v1::Job> job = impl_->cluster->GetJob(request->job_id());
      if (job.ok()) *response->mutable_job() = *std::move(job);
      return ToGrpcStatus(job.status());
    }

    grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                          v1::ListJobsResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/ListJobs");
      int64_t offset = 0;
      if (!request->page_token().empty() &&
          (!absl::SimpleAtoi(request->page_token(), &offset) || offset < 0)) {
        return ToGrpcStatus(
            absl::InvalidArgumentError("page_token: not a token this coordinator handed out"));
      }
      const int64_t page = request->page_size() <= 0 ? 100 : std::min(request->page_size(), 1000);
      std::vector<v1::JobState> states;
      for (int state : request->states()) states.push_back(static_cast<v1::JobState>(state));
      bool more = false;
      for (v1::Job& job : impl_->cluster->ListJobs(states, offset, page, &more)) {
        *response->add_jobs() = std::move(job);
      }
      if (more) response->set_next_page_token(absl::StrCat(offset + page));
      return grpc::Status::OK;
    }

    grpc::Status CancelJob(grpc::ServerContext* context, const v1::CancelJobRequest* request,
                           v1::CancelJobResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/CancelJob");
      if (absl::Status s = impl_->CheckOwner(*caller, request->job_id(), "cancel"); !s.ok()) {
        return ToGrpcStatus(s);
      }
      absl::StatusOr<v1::Job> job = impl_->cluster->CancelJob(request->job_id(), request->reason());
      if (job.ok()) *response->mutable_job() = *std::move(job);
      return ToGrpcStatus(job.status());
    }

    grpc::Status DeleteJob(grpc::ServerContext* context, const v1::DeleteJobRequest* request,
                           v1::DeleteJobResponse*) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/DeleteJob");
      if (absl::Status s = impl_->CheckOwner(*caller, request->job_id(), "delete"); !s.ok()) {
        return ToGrpcStatus(s);
      }
      return ToGrpcStatus(impl_->cluster->DeleteJob(request->job_id()));
    }

    grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                          grpc::ServerWriter<v1::WatchJobResponse>* writer) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/WatchJob");
      std::string last;
      while (!context->IsCancelled() && !impl_->stopping->load()) {
        const uint64_t seen = impl_->cluster->version();
        absl::StatusOr<v1::Job> job = impl_->cluster->GetJob(request->job_id());
        if (!job.ok()) return ToGrpcStatus(job.status());
        std::string now = job->SerializeAsString();
        if (now != last) {
          v1::WatchJobResponse response;
          *response.mutable_job() = *job;
          if (!writer->Write(response)) return grpc::Status::CANCELLED;
          last = std::move(now);
        }
        if (IsTerminalJobState(job->state())) return grpc::Status::OK;
        impl_->cluster->AwaitChange(seen, kStreamPoll);
      }
      return ToGrpcStatus(absl::UnavailableError("the coordinator is shutting down"));
    }

    grpc::Status ReadLogs(grpc::ServerContext* context, const v1::ReadLogsRequest* request,
                          grpc::ServerWriter<v1::ReadLogsResponse>* writer) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/ReadLogs");
      const int process = request->has_process_index() ? request->process_index() : -1;
      if (request->attempt() < 0 || request->tail_lines() < 0 || process < -1) {
        return ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
            "attempt and tail_lines must be >= 0 and process_index >= -1, got ",
            request->attempt(), ", ", request->tail_lines(), " and ", process)));
      }
      auto notice = [writer](const std::string& text) {
        v1::ReadLogsResponse response;
        response.add_notices(text);
        return writer->Write(response);
      };
      absl::StatusOr<v1::Job> job = impl_->cluster->GetJob(request->job_id());
      if (!job.ok()) return ToGrpcStatus(job.status());
      int attempt = request->attempt();
      if (attempt > job->attempt()) {
        return ToGrpcStatus(absl::NotFoundError(
            absl::StrCat("job ", job->id(), " has no attempt ", attempt, " (its latest is ",
                         job->attempt(), ")")));
      }
      // The latest attempt of a job that has not started: none to read, or (following) the
      // first one once it starts.
      while (attempt == 0 && job->attempt() == 0) {
        if (!request->follow() || IsTerminalJobState(job->state())) {
          notice(absl::StrCat("job ", job->id(), " has not started an attempt: nothing logged"));
          return grpc::Status::OK;
        }
        if (context->IsCancelled() || impl_->stopping->load()) return grpc::Status::CANCELLED;
        const uint64_t seen = impl_->cluster->version();
        job = impl_->cluster->GetJob(request->job_id());
        if (!job.ok()) return ToGrpcStatus(job.status());
        if (job->attempt() == 0) impl_->cluster->AwaitChange(seen, kStreamPoll);
      }
      if (attempt == 0) attempt = job->attempt();
      std::unique_ptr<LogReader> reader =
          impl_->cluster->ReadLogs(job->id(), attempt, process, request->tail_lines());
      absl::Time give_up = absl::InfiniteFuture();
      while (!context->IsCancelled() && !impl_->stopping->load()) {
        const uint64_t seen = impl_->LogVersion();
        std::vector<v1::ReadLogsResponse> responses;
        absl::StatusOr<bool> more = reader->Read(&responses);
        if (!more.ok()) return ToGrpcStatus(more.status());
        for (const v1::ReadLogsResponse& response : responses) {
          if (!writer->Write(response)) return grpc::Status::CANCELLED;
        }
        if (*more) continue;
        if (!request->follow()) return grpc::Status::OK;
        job = impl_->cluster->GetJob(request->job_id());
        if (!job.ok()) return ToGrpcStatus(job.status());
        const bool ended = IsTerminalJobState(job->state()) || job->attempt() > attempt ||
                           job->state() == v1::JOB_STATE_PENDING;
        if (ended) {
          // The attempt's processes: the mesh's distinct workers while it is the job's last
          // attempt; for an older one, the logs the store holds.
          std::set<std::string> workers;
          for (const v1::Device& d : job->mesh().devices()) workers.insert(d.worker_id());
          const int processes = job->attempt() == attempt ? static_cast<int>(workers.size())
                                                          : reader->seen();
          const int expected = process >= 0 ? 1 : processes;
          if (reader->complete() >= expected) return grpc::Status::OK;
          if (give_up == absl::InfiniteFuture()) {
            give_up = absl::Now() + impl_->options.log_follow_grace;
          }
          if (absl::Now() >= give_up) {
            for (const std::string& text :
                 reader->Incomplete(processes, impl_->options.log_follow_grace)) {
              if (!notice(text)) return grpc::Status::CANCELLED;
            }
            return grpc::Status::OK;
          }
        }
        impl_->AwaitLogs(seen, kStreamPoll);
      }
      if (context->IsCancelled()) return grpc::Status::CANCELLED;
      return ToGrpcStatus(absl::UnavailableError("the coordinator is shutting down"));
    }

    grpc::Status ListWorkers(grpc::ServerContext* context, const v1::ListWorkersRequest*,
                             v1::ListWorkersResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/ListWorkers");
      for (v1::Worker& w : impl_->cluster->ListWorkers()) *response->add_workers() = std::move(w);
      return grpc::Status::OK;
    }

    grpc::Status GetMesh(grpc::ServerContext* context, const v1::GetMeshRequest* request,
                         v1::GetMeshResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.JobService/GetMesh");
      absl::StatusOr<v1::GetMeshResponse> mesh = impl_->cluster->GetMesh(request->job_id());
      if (mesh.ok()) *response = *std::move(mesh);
      return ToGrpcStatus(mesh.status());
    }

   private:
    Impl* const impl_;
  };

  class MetricsServiceImpl final : public v1::MetricsService::Service {
   public:
    explicit MetricsServiceImpl(Impl* impl) : impl_(impl) {}

    grpc::Status QueryMetrics(grpc::ServerContext* context,
                              const v1::QueryMetricsRequest* request,
                              v1::QueryMetricsResponse* response) override {
      SUBSTRAX_AUTHORIZE(caller, context, "substrax.v1.MetricsService/QueryMetrics");
      absl::StatusOr<v1::QueryMetricsResponse> r = impl_->cluster->QueryMetrics(*request);
      if (r.ok()) *response = *std::move(r);
      return ToGrpcStatus(r.status());
    }

   private:
    Impl* const impl_;
  };

  // Gauges from a snapshot of the cluster; labels are bounded (states only).
  void UpdateGauges() {
    if (registry == nullptr) return;
    std::map<std::string, double> workers = {{"alive", 0}, {"dead", 0}};
    double devices = 0, busy = 0;
    for (const v1::Worker& w : cluster->ListWorkers()) {
      const bool alive = w.state() == v1::WORKER_STATE_ALIVE;
      workers[alive ? "alive" : "dead"] += 1;
      if (!alive) continue;
      devices += w.devices_size();
      if (!w.job_ids().empty()) busy += w.devices_size();
    }
    for (const auto& [state, n] : workers) worker_gauges->Add({{"state", state}}).Set(n);
    devices_gauge->Set(devices);
    busy_gauge->Set(busy);
    std::map<std::string, double> jobs;
    for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_CANCELLED; ++s) {
      std::string name = v1::JobState_Name(static_cast<v1::JobState>(s)).substr(10);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      jobs[name] = 0;
    }
    for (const auto& [state, n] : cluster->JobCounts()) {
      std::string name = v1::JobState_Name(state).substr(10);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      jobs[name] += n;
    }
    for (const auto& [state, n] : jobs) job_gauges->Add({{"state", state}}).Set(n);
  }

  // Feeds the attempts the scheduler started since the last tick to the histogram (drained
  // without metrics too, so that they do not pile up in the cluster).
  void ObservePlacements() {
    for (const Placement& p : cluster->TakePlacements()) {
      if (registry == nullptr) continue;
      (p.restart ? restart_latency : first_latency)->Observe(absl::ToDoubleSeconds(p.waited));
    }
  }

  const CoordinatorServerOptions options;
  Cluster* const cluster;
  Rendezvous* const rendezvous;
  Authenticator* const auth;
  std::atomic<bool>* const stopping;
  absl::Mutex log_mu;
  uint64_t log_version ABSL_GUARDED_BY(log_mu) = 0;
  CoordinatorServiceImpl coordinator_service{this};
  JobServiceImpl job_service{this};
  MetricsServiceImpl metrics_service{this};

  std::unique_ptr<prometheus::Exposer> exposer;
  std::shared_ptr<prometheus::Registry> registry;
  prometheus::Family<prometheus::Gauge>* worker_gauges = nullptr;
  prometheus::Family<prometheus::Gauge>* job_gauges = nullptr;
  prometheus::Gauge* devices_gauge = nullptr;
  prometheus::Gauge* busy_gauge = nullptr;
  prometheus::Counter* jobs_submitted = nullptr;
  prometheus::Counter* step_reports = nullptr;
  prometheus::Histogram* first_latency = nullptr;
  prometheus::Histogram* restart_latency = nullptr;
};

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorServerOptions& options, Cluster* cluster, Rendezvous* rendezvous,
    Authenticator* auth) {
  if (options.rendezvous_key.size() < 16) {
    return absl::InvalidArgumentError("the rendezvous key must be at least 16 bytes");
  }
  SUBSTRAX_RETURN_IF_ERROR(ValidateTransport(options.transport, /*server=*/true));
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  server->impl_ =
      std::make_unique<Impl>(options, cluster, rendezvous, auth, &server->stopping_);
  Impl& impl = *server->impl_;
  cluster->SetAttemptEndedCallback(
      [rendezvous](const std::string& job, int attempt) { rendezvous->CloseScope({job, attempt}); });

  if (!options.metrics_listen.empty()) {
    try {
      impl.exposer = std::make_unique<prometheus::Exposer>(options.metrics_listen);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("cannot serve Prometheus metrics on ",
                                                 options.metrics_listen, ": ", e.what()));
    }
    impl.registry = std::make_shared<prometheus::Registry>();
    impl.worker_gauges = &prometheus::BuildGauge()
                              .Name("substrax_workers")
                              .Help("Worker daemons known to the coordinator, by lease state.")
                              .Register(*impl.registry);
    impl.job_gauges = &prometheus::BuildGauge()
                           .Name("substrax_jobs")
                           .Help("Jobs by state.")
                           .Register(*impl.registry);
    auto& devices = prometheus::BuildGauge()
                        .Name("substrax_devices")
                        .Help("Devices of alive workers: all, and those running a job.")
                        .Register(*impl.registry);
    impl.devices_gauge = &devices.Add({{"use", "all"}});
    impl.busy_gauge = &devices.Add({{"use", "busy"}});
    impl.jobs_submitted = &prometheus::BuildCounter()
                               .Name("substrax_jobs_submitted_total")
                               .Help("Jobs accepted by SubmitJob.")
                               .Register(*impl.registry)
                               .Add({});
    impl.step_reports = &prometheus::BuildCounter()
                             .Name("substrax_step_reports_total")
                             .Help("Per-device step reports stored.")
                             .Register(*impl.registry)
                             .Add({});
    // 10 ms to 10 min: a job placed at once takes a tick at most; one behind others waits for
    // their devices (minutes).
    const prometheus::Histogram::BucketBoundaries latency_buckets = {
        0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
    auto& latency = prometheus::BuildHistogram()
                        .Name("substrax_scheduling_latency_seconds")
                        .Help("Time a schedulable job waited for its devices, per attempt started: "
                              "from submission (attempt=first), or from the end of the restart "
                              "backoff (attempt=restart).")
                        .Register(*impl.registry);
    impl.first_latency = &latency.Add({{"attempt", "first"}}, latency_buckets);
    impl.restart_latency = &latency.Add({{"attempt", "restart"}}, latency_buckets);
    impl.exposer->RegisterCollectable(impl.registry);
    const std::vector<int> ports = impl.exposer->GetListeningPorts();
    server->metrics_port_ = ports.empty() ? 0 : ports.front();
  }

  if (!options.health_listen.empty()) {
    // Built before gRPC's default health service is switched on (it would be added to this
    // server too, twice); it reports NOT_SERVING until the services below serve.
    SUBSTRAX_ASSIGN_OR_RETURN(server->health_server_, HealthServer::Start(options.health_listen));
    server->health_server_->SetServing("", false);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ResourceQuota quota("substrax-coordinator");
  quota.SetMaxThreads(options.max_rpc_threads);
  quota.Resize(options.max_rpc_memory_bytes);
  const std::shared_ptr<grpc::ServerCredentials> credentials =
      MakeServerCredentials(options.transport);
  // One server per listener, so that each serves only its own services; both share the quota.
  auto build = [&](const std::string& address, const std::vector<grpc::Service*>& services,
                   int* port) -> absl::StatusOr<std::unique_ptr<grpc::Server>> {
    grpc::ServerBuilder builder;
    // A second server on a taken port must fail, not share it (gRPC sets SO_REUSEPORT).
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    EnableKeepalive(builder);
    builder.SetResourceQuota(quota);
    builder.SetMaxReceiveMessageSize(options.max_receive_message_bytes);
    builder.AddListeningPort(address, credentials, port);
    for (grpc::Service* service : services) builder.RegisterService(service);
    std::unique_ptr<grpc::Server> built = builder.BuildAndStart();
    if (built == nullptr || *port == 0) {
      return absl::UnavailableError(absl::StrCat("cannot serve gRPC on ", address,
                                                 ": the address is in use or not local"));
    }
    return built;
  };
  std::vector<grpc::Service*> client_services = {&impl.job_service, &impl.metrics_service};
  if (options.worker_listen.empty()) {
    client_services.push_back(&impl.coordinator_service);
  } else {
    SUBSTRAX_ASSIGN_OR_RETURN(
        server->worker_server_,
        build(options.worker_listen, {&impl.coordinator_service}, &server->worker_port_));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(server->server_,
                            build(options.listen, client_services, &server->port_));
  if (options.worker_listen.empty()) server->worker_port_ = server->port_;
  if (server->health_server_ != nullptr) server->health_server_->SetServing("", true);
  server->ticker_ = std::thread([s = server.get()] {
    while (!s->stopping_.load()) {
      s->impl_->cluster->Tick();
      s->impl_->UpdateGauges();
      s->impl_->ObservePlacements();
      absl::SleepFor(s->impl_->options.tick_interval);  // a periodic ticker, not a wait
    }
  });
  return server;
}

void CoordinatorServer::Shutdown() {
  if (stopping_.exchange(true)) return;
  // Streams notice `stopping_` within kStreamPoll; give handlers that long to finish.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(2);
  if (worker_server_ != nullptr) worker_server_->Shutdown(deadline);
  server_->Shutdown(deadline);
  if (health_server_ != nullptr) health_server_->Shutdown();
  if (ticker_.joinable()) ticker_.join();
}

void CoordinatorServer::Wait() { server_->Wait(); }

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

}  // namespace substrax
