// The coordinator's gRPC layer: CoordinatorService (workers and runners), JobService and
// MetricsService (clients), grpc.health.v1, and Prometheus /metrics, on gRPC's callback API.
// Only threading, streaming and status conversion (//rpc) live here: every decision, the submit
// policy, ReadLogs' follow and ListJobs' pages included, is the Cluster's or the Rendezvous's.
//
// Threads. No call waits on a thread of its own: the server streams (WatchAssignments,
// WatchJob, ReadLogs follow) are write reactors woken by the Cluster's change feed
// (change_feed.h) and, for ReadLogs' grace, an alarm. Calls that may wait for a commit of the
// state store run on a pool of blocking_call_threads; reads of memory (Heartbeat, GetJob, ...)
// run on gRPC's own threads. The one wait that still holds a thread is a rendezvous
// KeyValueGet or Barrier (at most limits::kMaxRendezvousWaiters at once).
//
// Authorization: one step per call, keyed by the method gRPC reports (server_auth.h).
#ifndef SUBSTRAX_COORDINATOR_SERVER_H_
#define SUBSTRAX_COORDINATOR_SERVER_H_

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/auth.h"
#include "coordinator/cluster.h"
#include "coordinator/limits.h"
#include "coordinator/queues_view.h"
#include "coordinator/rendezvous.h"
#include "rpc/health_server.h"
#include "rpc/transport.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace substrax {

struct CoordinatorServerOptions {
  // host:port for the client-facing gRPC services (JobService, MetricsService) and health;
  // port 0 picks a free port (see port()).
  std::string listen = "0.0.0.0:7070";
  // host:port for the worker-facing CoordinatorService (worker daemons, runners) and health;
  // empty: served on `listen` too. Apart, a network policy can admit it from workers only.
  std::string worker_listen;
  // How both listeners are secured (mutual TLS, or --insecure).
  TransportOptions transport;
  // Key of the attempts' rendezvous secrets (HMAC-SHA256 of "job/attempt") and of their
  // processes' attempt tokens (auth.h); stable over restarts (the coordinator keeps it in its
  // state directory), so running attempts keep theirs.
  std::string rendezvous_key;
  // host:port of a plaintext gRPC server with only grpc.health.v1 (for Kubernetes probes);
  // empty: health is served on `listen` only.
  std::string health_listen;
  // host:port for Prometheus' /metrics; empty: not exported. Port 0 picks a free port (see
  // metrics_port()).
  std::string metrics_listen = "0.0.0.0:9090";
  // Longest a KeyValueGet or Barrier may wait, whatever the client asks.
  absl::Duration max_rendezvous_wait = absl::Seconds(limits::kMaxRendezvousWaitSeconds);
  // How often leases are checked and gauges updated.
  absl::Duration tick_interval = absl::Milliseconds(500);
  // The client-facing server's budget (JobService, MetricsService; everything without
  // worker_listen): threads gRPC may run handlers on at the same moment (streams hold none
  // while they wait; past it new calls get RESOURCE_EXHAUSTED), and memory for its buffers
  // (requests, responses, streams in flight).
  int max_rpc_threads = limits::kMaxRpcThreads;
  size_t max_rpc_memory_bytes = limits::kMaxRpcMemoryBytes;
  // The worker-facing server's own budget (CoordinatorService on worker_listen), apart from the
  // clients', so that no number of client streams can starve heartbeats. Unused without
  // worker_listen.
  int max_worker_rpc_threads = limits::kMaxWorkerRpcThreads;
  size_t max_worker_rpc_memory_bytes = limits::kMaxWorkerRpcMemoryBytes;
  // Threads that run the calls which may wait for a commit of the state store (RegisterWorker,
  // ReportSteps, SubmitJob, ...), off gRPC's own threads; more such calls queue for them.
  int blocking_call_threads = limits::kBlockingCallThreads;
  // The largest request accepted.
  int max_receive_message_bytes = limits::kMaxReceiveMessageBytes;
  // What one identity may have in flight on JobService and MetricsService: open server streams
  // (WatchJob, ReadLogs), and unary calls; past either, RESOURCE_EXHAUSTED naming the cap.
  // Workers and --insecure callers are not counted (server_auth.h). 0: no cap.
  int max_streams_per_caller = limits::kDefaultMaxStreamsPerCaller;
  int max_calls_per_caller = limits::kDefaultMaxCallsPerCaller;
};

class CoordinatorServer {
 public:
  // Starts serving. `cluster`, `rendezvous` and `auth` must outlive the server. Errors:
  // UNAVAILABLE when an address cannot be bound (names it); INVALID_ARGUMENT (no rendezvous
  // key).
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(
      const CoordinatorServerOptions& options, Cluster* cluster, Rendezvous* rendezvous,
      Authenticator* auth);
  ~CoordinatorServer();

  // The bound gRPC ports: client-facing, and worker-facing (the same without worker_listen).
  int port() const { return port_; }
  int worker_port() const { return worker_port_; }
  // The bound /metrics port; 0 without metrics_listen.
  int metrics_port() const { return metrics_port_; }
  // What ListQueues says of the scheduling configuration in force: where it was read from (the
  // --queues file's path), when, and why the file's last reload was refused (empty: it was
  // not). Unset: "built-in default". Thread-safe.
  void SetQueuesSource(const std::string& source, absl::Time loaded, const std::string& error);
  // Stops accepting, ends open streams, and returns when every handler has finished.
  void Shutdown();
  // Blocks until Shutdown.
  void Wait();

 private:
  CoordinatorServer() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  // Declared after impl_ so that they go first: the servers' calls use it.
  std::unique_ptr<grpc::Server> server_;
  // The worker-facing server; null without worker_listen.
  std::unique_ptr<grpc::Server> worker_server_;
  std::unique_ptr<HealthServer> health_server_;
  int port_ = 0;
  int worker_port_ = 0;
  int metrics_port_ = 0;
  std::thread ticker_;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_SERVER_H_
