// WorkerDaemon: the agent on each host (`substrax-agent`), like a kubelet or the TorchElastic
// agent. It registers the host's devices with the coordinator under a random incarnation, keeps
// its lease with heartbeats, watches for assignments and runs one job process per job attempt
// (the built-in trainer `substrax-job run`, or a program job's program), handing it its part
// through the launch contract (launch.h). Cancelling or failing an attempt stops its
// runner: SIGTERM, then SIGKILL after a grace period, to the runner's process group (its own
// children go too); a preemption gets the longer of --stop-grace and the coordinator's grace,
// for a final checkpoint, and says so in the attempt's log (stop_order.h). A runner that crashes never takes the daemon down; its exit status and the
// tail of its stderr go back to the coordinator.
//
// Exactly once: a reopened assignment stream resumes after the last event received (epoch,
// cursor); a (job, attempt, process) is launched at most once in the daemon's life, however
// often its start event arrives; every heartbeat lists the runners the daemon has (running, or
// ended with an outcome not yet acknowledged) and stops those the coordinator names.
//
// Fencing: every runner is started under a supervisor (supervisor.h), a process of its own that
// holds the attempt's lease: each successful heartbeat renews it until the heartbeat's send time
// plus heartbeat_timeout, less a margin (so never later than the coordinator's own count). When
// the lease lapses (the daemon is stopped with SIGSTOP, hung, or cut off from the coordinator)
// or the daemon is gone, the supervisor stops the runner's process group itself (SIGTERM,
// SIGKILL after stop_grace), because the coordinator is about to declare the worker dead and
// restart the attempt elsewhere (a Ray raylet that lost the GCS does the same). A running
// daemon that cannot renew its lease stops its runners too, saying why.
// A daemon told its lease is gone waits for its runners to exit before it registers again, so
// that its devices are never offered while an old runner still uses them. Registration is
// retried forever, whatever the coordinator answers (worker cap reached, unreachable, ...).
//
// Logs: every runner's stdout and stderr go to its log file in the work dir, and a LogShipper
// sends them to the coordinator as they grow; the files of an attempt whose log is not shipped to
// its end are not cleaned up.
//
// Thread-safe: Stop() may be called from any thread (a signal handler thread).
#ifndef SUBSTRAX_AGENT_DAEMON_H_
#define SUBSTRAX_AGENT_DAEMON_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "rpc/health_server.h"
#include "agent/clock_sample.h"
#include "base/stop_flag.h"
#include "rpc/transport.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "agent/launch.h"
#include "agent/log_shipper.h"
#include "agent/stop_order.h"
#include "agent/work_files.h"

namespace substrax {

struct WorkerDaemonOptions {
  // host:port of the coordinator (its worker-facing listener), and how to reach it; the runners
  // get the same credentials.
  std::string coordinator = "127.0.0.1:7070";
  TransportOptions transport;
  // This worker's name (default: its certificate's CN; with --insecure, the host name). With
  // TLS it must be the certificate's CN.
  std::string worker_id;
  // The host name reported with the devices (default: gethostname()).
  std::string host;
  // The devices to offer (see devices.h): "cuda" (every visible GPU; needs a --config=cuda
  // build) or "cpu:N". Empty: "cpu:<cpu_devices>".
  std::string devices;
  // CPU devices to offer when `devices` is empty (the --cpu-devices flag).
  int cpu_devices = 1;
  // Address this host's runners are reachable on by peers (Gloo, peer monitor).
  std::string listen_host = "127.0.0.1";
  // Where the launch, result and log files of job processes are written (work_files.h: created
  // 0700, refused when a symbolic link, not a directory, or another user's). Empty:
  // DefaultWorkDir().
  std::string work_dir;
  // The job binary, started as `<job_binary> run` for built-in jobs (--job-binary). Empty:
  // `substrax-job` in the agent's own directory. Create checks that it can be executed.
  std::string job_binary;
  // Time a runner gets to exit after SIGTERM before SIGKILL; a preempted runner gets the
  // coordinator's grace when that is longer (stop_order.h).
  absl::Duration stop_grace = absl::Seconds(10);
  // Passed to runners: every collective must finish within this time.
  absl::Duration collective_timeout = absl::Seconds(30);
  // host:port of a plaintext grpc.health.v1 server for Kubernetes probes; empty: none. The
  // server as a whole ("") is SERVING while the daemon runs (liveness never depends on peers);
  // "substrax.worker.ready" is SERVING while the worker is registered with the coordinator.
  std::string health_listen;
  // The directories (absolute; normalized by Create, and each must exist) under which runners
  // read job data: reported to the coordinator, which refuses jobs whose data paths lie
  // elsewhere, and handed to each runner, which opens data files only beneath them. None:
  // synthetic data only.
  std::vector<std::string> data_roots;
  // The same for checkpoints (--checkpoint-root): jobs write and read checkpoints only beneath
  // them. None: the worker runs only jobs without checkpoints.
  std::vector<std::string> checkpoint_roots;
  // The directories (absolute; normalized by Create, and each must exist) from which program
  // jobs (spec.program) may run programs: reported to the coordinator, which refuses jobs whose
  // program lies elsewhere, and checked again, symlinks resolved, before each program starts
  // (launch.h). None: the worker runs no program jobs.
  std::vector<std::string> programs_dirs;
  // A program that has not called substrax::Init (its started file, launch.h) this long after
  // it was started is stopped (SIGTERM, SIGKILL after stop_grace) and its attempt fails as
  // stalled.
  absl::Duration program_init_timeout = absl::Seconds(60);
  // Command jobs (spec.command, docs/command-jobs.md). The Python environments a command may
  // name in spec.command.python_env (--python-env NAME=DIR: argv[0] runs as DIR/bin/argv[0]),
  // reported at registration; Create checks each DIR has a bin/ directory.
  std::map<std::string, std::string> python_envs;
  // A command job runs any code its argv names, so the agent runs command jobs only as a user
  // of their own (--job-user) or when its operator allows them as its own user
  // (--allow-command-jobs: the command can then read what the agent can, its TLS key included).
  bool allow_command_jobs = false;
  // The ports process 0's launcher picks the rendezvous ports from (--command-ports
  // FIRST-LAST, for firewalls); 0 and 0: any free port.
  int command_port_first = 0;
  int command_port_last = 0;
  // The user job processes run as (--job-user), with its groups; empty: the agent's own user.
  // Create refuses a user that does not exist, root, and an agent that cannot switch users
  // (launch.h: ResolveJobUser). With one, each attempt's launch, result and started files lie
  // in a directory of the job user's (launch.h: AttemptFiles), and work_dir is made 0711 so
  // that the job user can reach that directory but list nothing.
  std::string job_user;
  // Variables of the agent's own environment given to every job process (--job-env-pass),
  // after the fixed base (launch.h: BaseJobEnvironment) and before the spec's; nothing else
  // of the agent's environment reaches a job.
  std::vector<std::string> job_env_pass;
  // Which ended attempts' files (assignment, log, result) in work_dir are deleted, and when:
  // at start, every cleanup_interval and after each runner ends (work_files.h).
  LogRetention log_retention;
  absl::Duration cleanup_interval = absl::Minutes(1);
  // How long a runner's outcome waits, after it exited, for the rest of its log to reach the
  // coordinator (log_shipper.h), so that a job's logs are complete when it ends.
  absl::Duration log_flush_timeout = absl::Seconds(3);
};

// The health service name that says a worker daemon is registered (readiness).
inline constexpr char kWorkerReadyService[] = "substrax.worker.ready";

class WorkerDaemon {
 public:
  // Discovers the devices to offer (DiscoverDevices). Errors: ResolveJobUser's for a
  // --job-user, INVALID_ARGUMENT (a --job-env-pass that is not a variable name, bad options,
  // unusable credentials, a --worker-id other than the certificate's CN, a bad device spec, a
  // data root that is relative, has a ".." component, or is not an existing directory),
  // FAILED_PRECONDITION ("cuda" without a usable GPU; work_dir unsafe: PrepareWorkDir),
  // UNIMPLEMENTED ("cuda" in a build without --config=cuda), UNAVAILABLE (work_dir cannot be
  // created).
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Create(WorkerDaemonOptions options);
  ~WorkerDaemon();

  // Registers (retrying every failure with backoff and jitter, forever: see Register), then
  // heartbeats, watches assignments and runs runners until Stop(). Errors: CANCELLED (stopped
  // before it registered), the health server's (--health-listen cannot be bound).
  absl::Status Run();
  // Stops every runner and makes Run() return.
  void Stop();

 private:
  struct Runner {
    // The job process (leader of its group), its supervisor (supervisor.h) and the write end of
    // the supervisor's control pipe (-1 once the runner has ended), written under mu_.
    pid_t pid = 0;
    pid_t supervisor = 0;
    int control_fd = -1;
    std::string job_id;
    int attempt = 0;
    int process_index = 0;
    std::string result_path;
    std::string stderr_path;
    // A program job's program (spec.program.path; empty for the built-in runner), the file its
    // substrax::Init creates, and when the daemon checks that it has: InfiniteFuture once done.
    std::string program;
    std::string started_path;
    // Its activity file (contract/activity.h), read with every heartbeat.
    std::string activity_path;
    absl::Time init_deadline = absl::InfiniteFuture();
    // Stopped for not calling substrax::Init in time.
    bool init_timed_out = false;
    // A command job's launcher (runner_outcome.h).
    bool command = false;
    bool stop_requested = false;
    std::string stop_reason;
    // When a runner told to stop gets SIGKILL (its group), unless it has exited by then, and
    // the grace that led to it.
    absl::Time kill_at = absl::InfiniteFuture();
    absl::Duration grace;
    // The agent's descriptor of the attempt's log, the same open file as the job's stdout and
    // stderr (one offset: a line the agent writes never overwrites the job's); -1 once ended.
    int log_fd = -1;
    bool killed = false;
    // The runner has exited; its outcome waits for the coordinator's acknowledgement.
    bool ended = false;
  };

  WorkerDaemon(WorkerDaemonOptions options, JobUser job_user, std::vector<v1::Device> devices);
  // Registers as a new incarnation, retrying every error (unreachable or refused) with backoff
  // until it succeeds or the daemon stops. Errors: CANCELLED (stopped first).
  absl::Status Register();
  void HeartbeatLoop();
  void SetReady(bool ready);
  void WatchLoop();
  void Launch(const v1::Assignment& assignment);
  // After the assignment stream of `incarnation` ended with `status`: when gRPC refused the
  // next event as over the receive limit, moves the cursor past it (with a log line), so that
  // the stream does not re-read it forever.
  void SkipUnreceivableEvent(const grpc::Status& status, const std::string& incarnation)
      ABSL_LOCKS_EXCLUDED(mu_);
  // False, with a log line, when `job_id` (from the coordinator) is not a DNS-1123 label: it
  // names files in the work dir, so anything else ("../x", "a/b") is refused before use.
  bool CheckJobId(const std::string& job_id, absl::string_view what) const;
  // SIGTERM to the runner of `key` (job/attempt), SIGKILL after the order's grace; a
  // preemption's line goes into the attempt's log (StopLogLine). Once per runner.
  void Terminate(const std::string& key, const StopOrder& order);
  void Terminate(const std::string& key, const std::string& reason);
  // Every runner; `fence`: the lease is lost or cannot be renewed (StopOrder::fence).
  void TerminateAll(const std::string& reason, bool fence = false);
  // Waits until no runner is running (ended ones may wait for their acknowledgement), at most
  // `timeout`. False at the deadline.
  bool AwaitRunnersExited(absl::Duration timeout);
  // The reaper of one runner (its own thread, joined by Housekeeping as soon as it is done):
  // waits for the runner to exit and reports its outcome.
  void Reap(int64_t reaper, std::string key, SupervisedChild child);
  // One thread for the whole daemon: SIGKILLs runners whose stop grace is over, stops programs
  // that missed their init timeout, joins finished reapers, and cleans the work dir (at start,
  // every cleanup_interval, after a runner ends).
  // Returns once the daemon is stopping and no runner is running.
  void Housekeeping();
  void CleanWorkDirNow();
  // Stops every program whose init deadline has passed without its started file (Terminate),
  // marking it timed out; done with each one's check.
  void CheckProgramInits(const std::vector<std::string>& due);
  // Reports a runner that could not be started (its files, fork) as FAILED.
  void ReportLaunchFailure(const Runner& runner, const std::string& error);
  // Delivers a runner's final status, retrying while the coordinator is unreachable (until
  // acknowledged, refused, or the daemon stops).
  void ReportStatus(const v1::ReportAttemptStatusRequest& request);
  std::string Incarnation() const;
  // Until when, on the monotonic clock, the runners' supervisors let them run without a new
  // renewal: the last renewal's send time plus the heartbeat timeout, less a margin.
  absl::Duration FenceDeadlineLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const WorkerDaemonOptions options_;
  // What every launch shares (launch.h), from options_.
  const LaunchSettings launch_settings_;
  // What Register offers, discovered once by Create.
  const std::vector<v1::Device> devices_;
  std::shared_ptr<v1::CoordinatorService::Stub> stub_;
  // Declared before the reapers: destroyed after they are joined (a reaper waits for its log).
  std::unique_ptr<GrpcLogSink> log_sink_;
  std::unique_ptr<LogShipper> log_shipper_;
  std::unique_ptr<HealthServer> health_;
  // Its timed waits (the heartbeat interval, retries) run on the monotonic clock: a host clock
  // that steps does not stretch them.
  StopFlag stopped_;

  mutable absl::Mutex mu_;
  std::string incarnation_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Seconds(1);
  absl::Duration heartbeat_timeout_ ABSL_GUARDED_BY(mu_) = absl::Seconds(10);
  // When the last successful heartbeat (or registration) was sent, on the monotonic clock.
  absl::Duration last_renewal_ ABSL_GUARDED_BY(mu_);
  // The runners were stopped because the lease could not be renewed.
  bool fenced_ ABSL_GUARDED_BY(mu_) = false;
  // The assignment stream's position: the (epoch, cursor) of the last event received by the
  // current incarnation.
  std::string watch_epoch_ ABSL_GUARDED_BY(mu_);
  int64_t watch_cursor_ ABSL_GUARDED_BY(mu_) = 0;
  // This host's clock against the coordinator's, from the last heartbeat answered.
  std::optional<v1::ClockSample> clock_ ABSL_GUARDED_BY(mu_);
  // The TLS certificate's expiry, read by the heartbeat thread only.
  CertificateExpiry certificate_expiry_{options_.transport.insecure
                                            ? ""
                                            : options_.transport.cert_file,
                                        options_.transport.reload_interval};
  // Runners by "job/attempt", until their outcome is acknowledged.
  std::map<std::string, Runner> runners_ ABSL_GUARDED_BY(mu_);
  // Every "job/attempt/process" ever launched by this daemon: never a second runner for one.
  std::set<std::string> launched_ ABSL_GUARDED_BY(mu_);
  // Reaper threads by id while their runner is running or its outcome being reported; the ids
  // of those that are done, for Housekeeping to join. So threads never outlive their runner
  // (and report) by more than a wakeup.
  std::map<int64_t, std::thread> reapers_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> finished_reapers_ ABSL_GUARDED_BY(mu_);
  int64_t next_reaper_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread housekeeping_;
};

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_DAEMON_H_
