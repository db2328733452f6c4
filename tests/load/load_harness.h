// What the load tests and bench/control_plane share: a real substrax-coordinator process, a
// fleet of simulated worker daemons (gRPC clients of CoordinatorService that register, heartbeat,
// watch their assignments and report like real daemons and runners, but run nothing), and
// latency recording. Not testonly, so that //bench:control_plane can use it too.
//
// Threads: a fleet's streams use gRPC's callback API and its heartbeats a completion queue of
// their own, so 10,000 simulated workers cost a few pacing threads, one thread for the answers
// and gRPC's own small pool, not a thread each; a 2-core machine holds them.
#ifndef SUBSTRAX_TESTS_LOAD_LOAD_HARNESS_H_
#define SUBSTRAX_TESTS_LOAD_LOAD_HARNESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "tests/process.h"

namespace substrax::load {

// Latencies of many calls, from any thread; percentiles on demand.
class LatencyRecorder {
 public:
  void Add(absl::Duration latency);
  // Adds everything `other` recorded.
  void AddAll(const LatencyRecorder& other);
  int64_t count() const;
  // The q-quantile (0..1) of what was recorded, nearest rank; zero when nothing was.
  absl::Duration Percentile(double q) const;
  // "n=1234 p50=1.2ms p99=8.9ms max=20.1ms".
  std::string Summary() const;
  // Forgets what was recorded (to measure from now on).
  void Clear();

 private:
  mutable absl::Mutex mu_;
  mutable std::vector<absl::Duration> samples_ ABSL_GUARDED_BY(mu_);
};

// A substrax-coordinator process on 127.0.0.1 with its state in `dir`/state. Restarts keep
// the state directory and the port, so that clients dial the same address.
class CoordinatorProcess {
 public:
  // `binary`: the coordinator's path; `flags`: extra command-line flags. `insecure`: started
  // with --insecure (load, not credentials, is under test); false: `flags` must give --tls-*.
  CoordinatorProcess(std::string binary, std::string dir, std::vector<std::string> flags = {},
                     bool insecure = true);
  ~CoordinatorProcess();

  // Starts it and waits (up to `timeout`) for its address file. Errors: FAILED_PRECONDITION
  // (no binary at its path), DEADLINE_EXCEEDED (no address in time; the log is in the message).
  absl::Status Start(absl::Duration timeout = absl::Seconds(60));
  // SIGTERM, then waits for the exit. Errors: DEADLINE_EXCEEDED, INTERNAL (non-zero exit).
  absl::Status Stop(absl::Duration timeout = absl::Seconds(60));
  // True once grpc.health.v1 Check answers SERVING, polled until `timeout`.
  bool WaitServing(absl::Duration timeout);

  const std::string& address() const { return address_; }
  pid_t pid() const { return process_ == nullptr ? -1 : process_->pid(); }
  // When the latest Start() forked the process.
  absl::Time started() const { return started_; }
  // The process's resident memory (VmRSS) now; -1 when it cannot be read.
  int64_t RssBytes() const;
  // The CPU time (user + system) the process has used so far; zero when it cannot be read.
  absl::Duration CpuTime() const;
  // Every run's log, for failure messages.
  std::string Logs() const;

 private:
  const std::string binary_;
  const std::string dir_;
  const std::vector<std::string> flags_;
  const bool insecure_;
  std::string address_;
  int runs_ = 0;
  absl::Time started_;
  std::unique_ptr<testing::Process> process_;
};

// A fresh directory on tmpfs (/dev/shm) when that has `room` bytes free, else under TEST_TMPDIR
// (testing::TempDir). For state whose durability a test does not check, produced by many small
// transactions: on tmpfs an fsync costs nothing. The caller removes it.
std::string ScratchDir(const std::string& name, int64_t room);

// The coordinator binary inside a test's or a `bazel run` binary's runfiles.
std::string CoordinatorRunfile();

// A synthetic classification job spec (valid, small model) of `devices` data-parallel devices
// and `steps` steps on `backend` (e.g. v1::BACKEND_CPU).
v1::JobSpec LoadJobSpec(const std::string& name, int devices, int64_t steps,
                        v1::Backend backend);

// SubmitJob with a deadline; the job id in *id when OK.
grpc::Status SubmitJob(v1::JobService::Stub& jobs, const v1::JobSpec& spec, std::string* id,
                       absl::Duration timeout = absl::Seconds(30));
// Every job ListJobs returns, page by page (`page_size` each).
absl::StatusOr<std::vector<v1::Job>> ListAllJobs(v1::JobService::Stub& jobs, int page_size);
// The workers ListWorkers returns.
absl::StatusOr<std::vector<v1::Worker>> ListWorkers(v1::JobService::Stub& jobs);

std::shared_ptr<grpc::Channel> Connect(const std::string& address);

// A gRPC deadline `timeout` from now.
std::chrono::system_clock::time_point Deadline(absl::Duration timeout);

struct FleetOptions {
  // Worker ids are "<id_prefix>-<index>", hosts "<id_prefix>-host-<index>".
  std::string id_prefix = "sim";
  int workers = 1;
  int devices_per_worker = 1;
  v1::DeviceKind device_kind = v1::DEVICE_KIND_CPU;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  absl::Duration heartbeat_deadline = absl::Seconds(10);
  // Open a WatchAssignments stream per worker (as daemons do).
  bool watch_assignments = true;
  // gRPC connections the fleet spreads its workers over (daemons would have one each);
  // worker w uses channel w % channels.
  int channels = 8;
  // The credentials of each channel (TLS: a worker certificate whose CN is the id of the one
  // worker on that channel, so then channels == workers); empty: plaintext.
  std::vector<std::shared_ptr<grpc::ChannelCredentials>> channel_credentials;
  // RegisterWorker calls in flight at once during Register().
  int register_parallelism = 1;
};

// One start event a simulated worker received.
struct WorkerAssignment {
  int worker = 0;  // index in the fleet
  std::string worker_id;
  v1::Assignment assignment;
};

// Simulated worker daemons. Register() then Start(), or Start() then Register() for a fleet
// whose registration takes longer than a lease: each worker heartbeats and opens its stream
// once its own registration was answered, as a daemon does. Heartbeats are paced so that worker w
// sends at offset w * interval / workers in each interval, at most one outstanding per worker
// (as a daemon's synchronous loop). Each heartbeat lists the runners AddRunner() gave the
// worker; a stop (in a heartbeat answer or on the stream) removes the runner.
class SimulatedFleet {
 public:
  SimulatedFleet(const std::string& address, FleetOptions options);
  ~SimulatedFleet();  // Stop()

  // Registers every worker (a new incarnation each), register_parallelism at a time, every one
  // tried. Errors: the first failed RegisterWorker (registrations_refused() counts them all).
  absl::Status Register();
  // Starts the heartbeat thread and (if asked) the assignment streams.
  void Start();
  // Stops heartbeats and streams and waits for every outstanding call.
  void Stop();

  int size() const { return options_.workers; }
  const std::string& worker_id(int w) const { return workers_[w].id; }
  const std::string& incarnation(int w) const { return workers_[w].incarnation; }
  v1::CoordinatorService::Stub& stub(int w) const;

  // The next start event any worker received, waiting up to `timeout`.
  std::optional<WorkerAssignment> NextAssignment(absl::Duration timeout);
  // Runners listed in the worker's heartbeats from now on / no longer.
  void AddRunner(int w, const std::string& job_id, int attempt, int process);
  void RemoveRunner(int w, const std::string& job_id, int attempt, int process);
  // ReportAttemptStatus for a runner of `a` (synchronous).
  grpc::Status ReportStatus(const WorkerAssignment& a, v1::RunnerState state);

  // Heartbeat round trips answered OK, and every other answer.
  LatencyRecorder& heartbeat_latency() { return heartbeat_latency_; }
  int64_t heartbeats_ok() const { return heartbeats_ok_.load(); }
  int64_t heartbeats_failed() const { return heartbeats_failed_.load(); }
  // Heartbeats not sent because the worker's previous one was still outstanding.
  int64_t heartbeats_skipped() const { return heartbeats_skipped_.load(); }
  // The first few failures ("sim-3: UNAVAILABLE: ..."), for messages.
  std::vector<std::string> heartbeat_errors() const;
  // Assignment streams that ended while the fleet was running.
  int64_t streams_ended() const { return streams_ended_.load(); }
  // RegisterWorker calls refused in Register().
  int64_t registrations_refused() const { return registrations_refused_.load(); }
  // Workers one of whose heartbeats was answered as by a coordinator that declared them dead
  // or forgot them (ABORTED, NOT_FOUND) although they kept heartbeating: false expiries.
  int64_t workers_declared_dead() const;

 private:
  class Watch;
  struct HeartbeatCall;
  struct SimWorker {
    std::string id;
    std::string incarnation;
    int channel = 0;
    bool heartbeat_outstanding = false;
    // (job, attempt, process) of the runners this worker has.
    std::vector<std::tuple<std::string, int, int>> runners;
    // Where its stream stands: resumed from here when it is reopened.
    std::string epoch;
    int64_t cursor = 0;
    bool watching = false;
    // A heartbeat was answered ABORTED or NOT_FOUND (see workers_declared_dead()).
    bool declared_dead = false;
    // Its RegisterWorker was answered OK: it heartbeats and watches from then on.
    bool registered = false;
  };

  // Paces the heartbeats of workers first, first + stride, ... (one of kPacingThreads).
  void HeartbeatLoop(int first, int stride);
  // Threads that send heartbeats: one cannot start 10,000 TLS calls a second.
  static constexpr int kPacingThreads = 4;
  void SendHeartbeat(int w) ABSL_LOCKS_EXCLUDED(mu_);
  void OpenWatch(int w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A heartbeat call's answer.
  void OnHeartbeatAnswer(int w, absl::Duration latency, const grpc::Status& status,
                         const v1::HeartbeatResponse& response) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the heartbeats' answers off heartbeat_queue_ until it is shut down.
  void HeartbeatAnswers();
  void OnEvent(int w, const v1::WatchAssignmentsResponse& event);
  void OnWatchDone(int w, Watch* watch, const grpc::Status& status);
  void RemoveRunnerLocked(int w, const std::string& job_id, int attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FleetOptions options_;
  std::vector<std::unique_ptr<v1::CoordinatorService::Stub>> stubs_;
  std::vector<std::thread> heartbeats_;
  // The heartbeat calls, on a completion queue of their own (a real agent's blocking call has
  // one too): with gRPC's callback API they would share the process's one callback queue with
  // the 10,000 assignment streams, and a debug build of gRPC (Debian's) scans that queue's
  // outstanding operations at every completion.
  grpc::CompletionQueue heartbeat_queue_;
  std::thread answers_;
  std::atomic<bool> stopping_{false};
  LatencyRecorder heartbeat_latency_;
  std::atomic<int64_t> heartbeats_ok_{0};
  std::atomic<int64_t> heartbeats_failed_{0};
  std::atomic<int64_t> heartbeats_skipped_{0};
  std::atomic<int64_t> streams_ended_{0};
  std::atomic<int64_t> registrations_refused_{0};

  mutable absl::Mutex mu_;
  std::vector<SimWorker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<int, Watch*> watches_ ABSL_GUARDED_BY(mu_);
  int outstanding_heartbeats_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<WorkerAssignment> assignments_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> errors_ ABSL_GUARDED_BY(mu_);
};

struct ReportLoopOptions {
  // Steps each ReportSteps carries (every local device's report of each step).
  int steps_per_request = 1;
  // The last step to report; 0: report until Stop().
  int64_t last_step = 0;
  // Metric values per report besides the 4 timing fields ("loss", "accuracy", ...).
  int values_per_report = 2;
};

// A simulated runner's reports: ReportSteps for its local devices, step after step, each sent
// as soon as the previous one is answered (a closed loop, as fast as the coordinator allows).
// Each device's report holds values_per_report + 4 metric points (MetricsStore keeps the
// timing fields as metrics too).
class ReportLoop {
 public:
  ReportLoop(v1::CoordinatorService::Stub* stub, v1::Assignment assignment,
             ReportLoopOptions options);
  ~ReportLoop();  // Stop()
  void Start();
  // Sends nothing more and waits for the outstanding call.
  void Stop();
  // True once last_step was reported, or a call failed.
  bool WaitDone(absl::Duration timeout);

  const LatencyRecorder& latency() const { return latency_; }
  int64_t points() const { return points_.load(); }
  int64_t requests() const { return requests_.load(); }
  // The first failure (OK while none).
  grpc::Status error() const;

 private:
  struct Call;
  void SendNext(int64_t first_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDone(Call* call, const grpc::Status& status);

  v1::CoordinatorService::Stub* const stub_;
  const v1::Assignment assignment_;
  const ReportLoopOptions options_;
  LatencyRecorder latency_;
  std::atomic<int64_t> points_{0};
  std::atomic<int64_t> requests_{0};
  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool outstanding_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax::load

#endif  // SUBSTRAX_TESTS_LOAD_LOAD_HARNESS_H_
