// Internal to //coordinator:server: what its files share. The services (server_calls.cc) and
// the streams (server_streams.cc) run on gRPC's callback API over one ServerState.
#ifndef SUBSTRAX_COORDINATOR_SERVER_INTERNAL_H_
#define SUBSTRAX_COORDINATOR_SERVER_INTERNAL_H_

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/auth.h"
#include "coordinator/cluster.h"
#include "coordinator/rendezvous.h"
#include "coordinator/server.h"
#include "coordinator/server_auth.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/counter.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"

namespace substrax::server_internal {

// Threads for calls that may block (a commit of the state store, a rendezvous wait), so that
// gRPC's own threads never do: started as calls need them, up to `max_threads`, then kept;
// calls beyond wait in a queue. Thread-safe.
class BlockingPool {
 public:
  explicit BlockingPool(int max_threads) : max_threads_(max_threads < 1 ? 1 : max_threads) {}
  ~BlockingPool();  // Stop()
  void Run(std::function<void()> call);
  // Runs what is queued, then joins the threads.
  void Stop();

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const int max_threads_;
  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// What the streams register so that Shutdown can end them, and the change feed and alarms wake
// them: Wake() calls the stream's wake function until the stream is done (Detach).
class StreamHandle {
 public:
  explicit StreamHandle(std::function<void()> wake) : wake_(std::move(wake)) {}
  void Wake() ABSL_LOCKS_EXCLUDED(mu_);
  void Detach() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  std::function<void()> wake_ ABSL_GUARDED_BY(mu_);
};

struct ServerState {
  ServerState(const CoordinatorServerOptions& o, Cluster* c, Rendezvous* r, Authenticator* a)
      : options(o),
        cluster(c),
        rendezvous(r),
        authorizer(a, CallerCaps{o.max_streams_per_caller, o.max_calls_per_caller}),
        pool(o.blocking_call_threads),
        rendezvous_pool(limits::kMaxRendezvousWaiters) {}

  // Answers `context`'s call with `status` at once.
  static grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                          const absl::Status& status);
  // The authorization step, then `call` on this thread (it must not block).
  grpc::ServerUnaryReactor* Inline(grpc::CallbackServerContext* context,
                                   const std::function<absl::Status(const Caller&)>& call);
  // The authorization step, then `call` on `pool` (it may wait for a commit). What `call`
  // captures must outlive the call: the request and response pointers do.
  grpc::ServerUnaryReactor* Blocking(grpc::CallbackServerContext* context,
                                     std::function<absl::Status(const Caller&)> call,
                                     BlockingPool* on = nullptr);

  // A worker acts only as itself (its certificate's CN is its worker id).
  static absl::Status CheckWorker(const Caller& caller, const std::string& worker_id);
  // A submitter cancels or deletes only its own jobs; an admin any.
  absl::Status CheckOwner(const Caller& caller, const std::string& job_id,
                          absl::string_view action) const;
  // An attempt token (a job's process) acts only for its own job and attempt, and only while
  // that attempt is the job's running attempt. Returns the worker its reports count as: for an
  // attempt token the worker that runs its process, for a worker itself, "" with --insecure
  // (unchecked). Errors: PERMISSION_DENIED (another job or attempt; the attempt has ended or
  // the job is gone: the message says so).
  absl::StatusOr<std::string> ReporterOf(const Caller& caller, const std::string& job_id,
                                         int attempt) const;
  // The secret of an attempt's rendezvous scope (Assignment.rendezvous_secret).
  std::string SecretOf(const std::string& job_id, int attempt) const;
  // The attempt token of process `process_index` of an attempt (Assignment.attempt_token).
  std::string TokenOf(const std::string& job_id, int attempt, int process_index) const;
  // OK iff the scope is a running attempt and carries that attempt's secret, and an attempt
  // token's holder asks for its own attempt (ReporterOf).
  absl::Status CheckScope(const Caller& caller, const v1::RendezvousScope& scope) const;
  absl::Duration CapWait(const google::protobuf::Duration& d) const;

  void AddStream(const std::shared_ptr<StreamHandle>& handle) ABSL_LOCKS_EXCLUDED(streams_mu);
  void RemoveStream(const std::shared_ptr<StreamHandle>& handle) ABSL_LOCKS_EXCLUDED(streams_mu);
  // Sets `stopping` and wakes every stream, which then ends UNAVAILABLE.
  void StopStreams() ABSL_LOCKS_EXCLUDED(streams_mu);

  // CoordinatorServer::SetQueuesSource.
  void SetQueuesSource(QueuesConfigStatus status) ABSL_LOCKS_EXCLUDED(queues_mu);
  // ListQueues' answer: the cluster's configuration and queues, and queues_config.
  v1::ListQueuesResponse ListQueues() const ABSL_LOCKS_EXCLUDED(queues_mu);

  const CoordinatorServerOptions options;
  Cluster* const cluster;
  Rendezvous* const rendezvous;
  CallAuthorizer authorizer;
  std::atomic<bool> stopping{false};
  // Calls that wait for a commit; and rendezvous waits (Get, Barrier), which may last minutes.
  BlockingPool pool;
  BlockingPool rendezvous_pool;
  // Counters; null without /metrics.
  prometheus::Counter* jobs_submitted = nullptr;
  prometheus::Counter* step_reports = nullptr;

  absl::Mutex streams_mu;
  std::set<std::shared_ptr<StreamHandle>> streams ABSL_GUARDED_BY(streams_mu);

  mutable absl::Mutex queues_mu;
  QueuesConfigStatus queues_config ABSL_GUARDED_BY(queues_mu);
};

// Env values a reader who is neither the job's owner nor an admin sees, in place of each value
// of spec.program.env and spec.command.env (the names stay): a spec's env may hold a
// submitter's secrets.
inline constexpr char kRedactedEnvValue[] = "<redacted>";
// `job` as `caller` may see it (GetJob, ListJobs, WatchJob, CancelJob's answer).
void RedactForCaller(const Caller& caller, v1::Job* job);

// The worker-facing service: every method on gRPC's callback API but Heartbeat, which is served
// on a completion queue of its own (HeartbeatServer).
// (CallbackService with Heartbeat async: wrapping CallbackService would not do, since
// MarkMethodAsync keeps the callback handler, and gRPC registers a method with a handler as a
// callback method. A method added to the proto must be added here, or it answers UNIMPLEMENTED.)
using CoordinatorServiceBase = v1::CoordinatorService::WithCallbackMethod_RegisterWorker<
    v1::CoordinatorService::WithAsyncMethod_Heartbeat<
        v1::CoordinatorService::WithCallbackMethod_WatchAssignments<
            v1::CoordinatorService::WithCallbackMethod_ReportSteps<
                v1::CoordinatorService::WithCallbackMethod_ReportAttemptStatus<
                    v1::CoordinatorService::WithCallbackMethod_KeyValueSet<
                        v1::CoordinatorService::WithCallbackMethod_KeyValueGet<
                            v1::CoordinatorService::WithCallbackMethod_Barrier<
                                v1::CoordinatorService::WithCallbackMethod_ReportCheckpoints<
                                    v1::CoordinatorService::WithCallbackMethod_ShipLogs<
                                        v1::CoordinatorService::Service>>>>>>>>>>;

// Serves the Heartbeat calls of `service` on `queue` (from the ServerBuilder that built the
// server hosting `service`) with limits::kHeartbeatThreads threads. Why not the callback API:
// its completions all go through one queue per process, shared with every open stream (10,000
// agents hold 10,000 assignment streams), and a build of gRPC without NDEBUG (Debian's) scans
// that queue's outstanding operations at every completion; a heartbeat's own queue holds only
// the calls in flight. Each heartbeat takes the authorization step, the worker check, then
// Cluster::Heartbeat, on the thread that took it (it waits for a commit only when it changed
// something, as before).
class HeartbeatServer {
 public:
  HeartbeatServer(ServerState* state, CoordinatorServiceBase* service,
                  std::unique_ptr<grpc::ServerCompletionQueue> queue);
  // Requests the first calls and starts the threads.
  void Start();
  // After the server's Shutdown: shuts the queue down, drains it and joins the threads.
  void Shutdown();
  ~HeartbeatServer();  // Shutdown()

 private:
  struct Call;
  void Request();
  void Loop();
  void Answer(Call* call);

  ServerState* const state_;
  CoordinatorServiceBase* const service_;
  std::unique_ptr<grpc::ServerCompletionQueue> queue_;
  std::vector<std::thread> threads_;
  bool shut_down_ = false;
};

// The services; each method takes the authorization step first.
std::unique_ptr<CoordinatorServiceBase> MakeCoordinatorService(ServerState* state);
std::unique_ptr<v1::JobService::CallbackService> MakeJobService(ServerState* state);
std::unique_ptr<v1::MetricsService::CallbackService> MakeMetricsService(ServerState* state);

// The server streams (server_streams.cc), each started after the authorization step and the
// per-request checks passed.
grpc::ServerWriteReactor<v1::WatchAssignmentsResponse>* StartAssignmentStream(
    ServerState* state, const v1::WatchAssignmentsRequest& request);
grpc::ServerWriteReactor<v1::WatchJobResponse>* StartJobStream(
    ServerState* state, const v1::WatchJobRequest& request, const Caller& caller);
grpc::ServerWriteReactor<v1::ReadLogsResponse>* StartLogStream(
    ServerState* state, const v1::ReadLogsRequest& request);
// A stream refused before it started: answers `status` and deletes itself.
template <typename Response>
class Refusal final : public grpc::ServerWriteReactor<Response> {
 public:
  explicit Refusal(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace substrax::server_internal

#endif  // SUBSTRAX_COORDINATOR_SERVER_INTERNAL_H_
