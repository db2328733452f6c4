// Cluster: the coordinator's state machine. Membership and leases of worker daemons, the job
// queue and gang scheduler, the attempts that run and how they end, and the metric points
// runners report. Pure: no RPC, no threads of its own, time from an injected clock; the gRPC
// services are thin layers on top (docs/architecture.md).
//
// Jobs. SubmitJob admits the spec by the submit policy (submit_policy.h: defaults, full
// validation, refusals, whether the alive workers could hold it), then queues the job
// (PENDING). Scheduling is gang (all or nothing) and FIFO: the oldest pending job that the
// alive workers could hold blocks every younger one until enough of their devices are free; a
// job the whole cluster of alive workers could not hold even when idle does not block the
// queue (it waits for more workers). An attempt gets the mesh CreateMeshForJob builds over the
// free devices of alive workers, and each worker holding devices of the mesh gets one
// Assignment. Process p of an attempt is the p-th distinct worker_id in order of first
// appearance in mesh.devices() (row-major); the runtime derives its process table with the
// same rule.
//
// States: PENDING -> RUNNING -> SUCCEEDED | FAILED | CANCELLED, and RUNNING -> PENDING when a
// failed attempt is restarted. Every change is a JobTransition with its reason and attempt.
// Job.attempt counts attempts started (0 while the first waits); a restarted job waits with
// the number of its failed attempt and gets the next when it starts again.
//
// Why a job waits: the reason of its latest (PENDING) transition ends with
// "; waiting for ..." (e.g. "submitted; waiting for 4 free devices: 2 free on 1 alive
// worker"), updated in place whenever the answer changes. No other field is used.
//
// Failures. A runner that reports FAILED, a worker whose lease expires and a worker that
// registers with a new incarnation each fail the attempts they take part in: the other
// workers of the attempt get a stop event, and the job goes back to PENDING while its restarts
// (attempts - 1) are below spec.max_restarts, else ends FAILED with Job.error naming the
// attempt, process, worker, host, devices and cause. So do a process that reports no new step
// for the progress timeout ("stalled at step S on process P (worker w, host h)"; a command
// job's process only from its first report on: one that never reports is never stalled) and a
// non-finite loss in a report (naming the step and device). A restart waits an exponential
// backoff (Job.next_attempt_time, and the waiting reason). A runner error that cannot get
// better by retrying (error_code INVALID_ARGUMENT, NOT_FOUND, PERMISSION_DENIED,
// UNIMPLEMENTED) and a job past spec.max_duration_seconds end the job FAILED at once.
//
// Progress. Job.progress comes from the latest reports (MetricsStore::Latest): the newest step
// every device of the attempt's mesh reported, never one only some did; total_steps is
// TotalSteps(spec) (0 for jobs given in epochs whose data headers the coordinator cannot read).
// final_metrics are process 0's at success.
//
// Persistence. Every change of a job or worker, and every report batch, is written to the
// StateStore before the call that made it returns OK, by a StateWriter thread (state_writer.h):
// the lock is never held across a disk write, and one commit serves every call waiting. When a
// write fails the call returns the store's error (UNAVAILABLE); the change stays in memory and
// the writer commits it again (a submitted job is the exception: it is written before it exists
// in memory, so a failed submit leaves nothing). Progress is not written on every report: a
// running job's is recomputed from its latest stored points at load; an ended job's is stored
// with it. Metric history stays on disk (retention per ClusterOptions) and QueryMetrics reads it
// there, without the lock; memory holds each running attempt's steps from its newest complete
// one (every device reported it), at most kProgressSteps.
//
// Retention. Ended jobs expire after finished_job_ttl and beyond max_finished_jobs (Tick), or
// when deleted (DeleteJob); their metric points go with them. Dead workers are forgotten after
// dead_worker_retention, and the longest dead at once when a new worker would pass
// max_workers. A worker's assignment events are dropped once its daemon has them (its
// next PollAssignments starts after them). Job ids are "<name>-<n>" with n from a counter stored
// with each submitted job: never handed out twice, not even after a delete and a restart.
//
// Idempotent submits. A SubmitJob with a request_id is remembered (with the job, so as long as
// the job exists, over restarts) per owner: the same owner and request id with the same spec
// returns that job; with another spec it gets ALREADY_EXISTS naming the job.
//
// Clocks. `clock` stamps what is recorded and shown (transitions, times); every duration the
// Cluster measures runs on `lease_clock` (monotonic in production): leases, progress timeouts,
// restart backoffs, max_duration_seconds, finished_job_ttl, dead_worker_retention and the
// scheduling wait. Instants loaded from the store (wall times) are re-based once at load: an
// instant t becomes lease_now - (wall_now - t); from then on a step of the wall clock moves
// nothing. Assignment queues and lease times live only in memory: loaded workers
// start with a fresh lease at now(), and a loaded RUNNING job keeps its devices while its
// workers keep their leases; its start events are queued again (in a new stream epoch), and
// the daemons, whose launches are idempotent, start only what they do not run yet. Which
// processes of a running attempt have succeeded is stored with the job (succeeded_processes)
// before the report is acknowledged. Stop events are not stored: a restarted coordinator
// derives them from the stored job states through heartbeat reconciliation.
//
// Exactly once. Each assignment event carries (epoch, cursor): a reopened stream resumes after
// the last event the daemon received. Heartbeats reconcile: they list the daemon's runners; a
// runner of no running attempt of this worker is told to stop; a process of a running attempt
// that an earlier heartbeat listed, that a later one does not and that has no final status
// fails its attempt.
//
// Scheduling latency. Every attempt the scheduler starts is recorded as a Placement: how long
// its job had been schedulable before it got its devices (TakePlacements; the server feeds the
// histogram substrax_scheduling_latency_seconds from it, docs/metrics.md).
//
// Thread-safe. The attempt-ended callback is called without the lock held.
#ifndef SUBSTRAX_COORDINATOR_CLUSTER_H_
#define SUBSTRAX_COORDINATOR_CLUSTER_H_

#include <cstdint>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/change_feed.h"
#include "coordinator/limits.h"
#include "coordinator/log_lines.h"
#include "coordinator/metrics_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/state_store.h"
#include "coordinator/state_writer.h"
#include "coordinator/hang_attribution.h"
#include "coordinator/stragglers.h"
#include "coordinator/submit_policy.h"
#include "core/mesh.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/job_service.pb.h"
#include "substrax/v1/metrics_service.pb.h"

namespace substrax {

using Clock = std::function<absl::Time()>;

struct ClusterOptions {
  // How often workers should heartbeat; told to them at registration.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A lease expires when no heartbeat arrived for longer than this.
  absl::Duration heartbeat_timeout = absl::Seconds(10);
  // SubmitJob refuses (RESOURCE_EXHAUSTED) a job whose mesh the alive workers could not hold even
  // when idle. Off, such a job is queued and waits for more workers, without blocking younger
  // jobs (for clusters whose workers join after jobs are submitted).
  bool refuse_jobs_that_cannot_fit = true;
  // Patterns ("WANDB_*", "HF_HOME") a job's spec.program.env and spec.command.env may set
  // beyond the default allowlist (--job-env-allow; core/job_env.h): never a denied name. Create
  // checks them.
  std::vector<std::string> job_env_allow;
  // An attempt fails as stalled when a process reports no new step for this long, unless the
  // spec sets progress_timeout_seconds.
  absl::Duration default_progress_timeout = absl::Minutes(5);
  // A dead worker is forgotten (with its device ids) this long after it died; one that comes
  // back later registers as new. Zero: only when room is needed at max_workers.
  absl::Duration dead_worker_retention = absl::Hours(limits::kDefaultDeadWorkerRetentionHours);
  // Workers known at most (alive or dead); a new one beyond makes room by forgetting the longest
  // dead, else is refused (RESOURCE_EXHAUSTED).
  int max_workers = limits::kMaxWorkers;
  // The wait before restart n (1, 2, ...) of a job is restart_backoff * 2^(n-1), at most
  // max_restart_backoff. Zero: restart at once.
  absl::Duration restart_backoff = absl::Seconds(1);
  absl::Duration max_restart_backoff = absl::Minutes(2);
  // Retention and limits (docs/operations.md). SubmitJob answers RESOURCE_EXHAUSTED while this
  // many jobs are PENDING or RUNNING.
  int max_active_jobs = limits::kDefaultMaxActiveJobs;
  // Ended jobs are deleted (with their metric points) this long after they ended, and beyond
  // this many, oldest first. Zero TTL: no expiry by age.
  absl::Duration finished_job_ttl = absl::Hours(limits::kDefaultFinishedJobTtlHours);
  int max_finished_jobs = limits::kDefaultMaxFinishedJobs;
  // Metric points of an attempt: every point of its last metrics_raw_steps steps; before those,
  // only steps that are multiples of metrics_history_every (rounded up to a multiple of the
  // job's report_every_steps). metrics_raw_steps 0: keep everything.
  int64_t metrics_raw_steps = limits::kDefaultMetricsRawSteps;
  int64_t metrics_history_every = limits::kDefaultMetricsHistoryEvery;
  // Each process's log (ShipLogs) keeps at most this many of its newest bytes (the oldest
  // chunks are deleted; readers are told how many bytes were dropped). At least
  // limits::kMaxLogChunkBytes; 0: unbounded.
  int64_t log_max_bytes_per_process = limits::kDefaultLogMaxBytesPerProcess;
  // A followed log (ReadLogs) waits this long after its attempt ended for every process's last
  // piece; a daemon that died never ships it.
  absl::Duration log_follow_grace = absl::Seconds(limits::kLogFollowGraceSeconds);
  // Queues, priority classes and the policy (scheduler.h; --queues FILE). Replaced at run time
  // by SetSchedulingConfig.
  v1::SchedulingConfig scheduling = scheduling::DefaultSchedulingConfig();
};

// How a followed ReadLogs goes on once it has read everything stored (Cluster::FollowLogs).
struct LogFollow {
  // The stream ends, after `notices`.
  bool done = false;
  // "process 1 (host b): the log may be incomplete ...", sent before ending.
  std::vector<std::string> notices;
  // Look again by then even if nothing changes (the end of the grace); InfiniteFuture: on a
  // change of the job or its logs only.
  absl::Time recheck = absl::InfiniteFuture();
};

// An attempt the scheduler started, and how long its job waited for it while schedulable.
struct Placement {
  std::string job_id;
  int attempt = 0;
  // A restart (attempt > 1) waited from the end of its restart backoff (Job.next_attempt_time)
  // or from going back to PENDING, whichever is later: the backoff is a chosen wait, not one
  // for devices. A first attempt waited from its submission (its PENDING transition; for a job
  // loaded by a restarted coordinator that includes the time the coordinator was down).
  bool restart = false;
  // On the lease clock; never negative.
  absl::Duration waited;
};

// SUCCEEDED, FAILED and CANCELLED: the job has ended and will not change again.
bool IsTerminalJobState(v1::JobState state);

class Cluster {
 public:
  // Loads everything `state` holds (it must outlive the Cluster and may not be null) and
  // schedules. Loaded alive workers start with a fresh lease at clock(); a RUNNING job whose
  // worker is dead or unknown has its attempt failed at once. Errors: the store's Load errors;
  // INVALID_ARGUMENT for a non-positive heartbeat interval or timeout, or a job_env_allow
  // pattern ValidateJobEnvAllow refuses.
  // `lease_clock` (default: `clock`) measures leases and progress timeouts; in production a
  // monotonic clock, so that a wall-clock step never expires or extends a lease. `clock` stamps
  // what is recorded (transitions, times shown to users).
  static absl::StatusOr<std::unique_ptr<Cluster>> Create(const ClusterOptions& options,
                                                         Clock clock, StateStore* state,
                                                         Clock lease_clock = nullptr);
  // Commits what is still queued, then stops the writer (before the state it calls back into).
  ~Cluster();

  // --- membership (worker-facing) ---

  // Registers a worker daemon (worker_id: request.worker_id, or the host when empty) and its
  // devices. Devices get cluster-wide ids, stable for a (worker_id, local_index) over
  // re-registrations and coordinator restarts; their host and worker_id are set here. The same
  // incarnation again is a retry and answers as before (reviving a worker declared dead); a new
  // incarnation replaces the old process and fails its attempts ("worker w-2 restarted ...").
  // Errors: INVALID_ARGUMENT (no devices, empty host or incarnation, repeated or negative
  // local_index), UNAVAILABLE (the state store failed).
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);
  // Renews the lease. Errors: NOT_FOUND (unknown worker: register), ABORTED (stale
  // incarnation, or the worker was declared dead: re-register).
  // Renews the lease without reconciling runners (tests; the daemon sends the request form).
  absl::Status Heartbeat(const std::string& worker_id, const std::string& incarnation);
  // Renews the lease and reconciles the runners the request lists (see the class comment):
  // the answer names those to stop; a running process that an earlier heartbeat listed and
  // this one does not, and that reported no outcome, fails its attempt ("runner ... is
  // missing"). Errors: as the form above, and UNAVAILABLE (the state store failed).
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request);
  // Expires leases without a heartbeat for longer than heartbeat_timeout (failing their
  // attempts), retries failed state-store writes, then schedules. The gRPC layer calls it every
  // heartbeat_interval / 2; tests call it after advancing the fake clock.
  void Tick();
  // The worker's assignment events after *cursor (exclusive; start at 0), advancing *cursor
  // to the last one returned; each event carries its epoch and cursor. Non-blocking (pair
  // with AwaitChange). A new incarnation starts a new queue. An `epoch` other than epoch()
  // (the daemon's position is from before a coordinator restart) starts from the first event.
  // Errors: NOT_FOUND, ABORTED (as Heartbeat).
  absl::StatusOr<std::vector<v1::WatchAssignmentsResponse>> PollAssignments(
      const std::string& worker_id, const std::string& incarnation, const std::string& epoch,
      int64_t* cursor);
  // The same within the current epoch.
  absl::StatusOr<std::vector<v1::WatchAssignmentsResponse>> PollAssignments(
      const std::string& worker_id, const std::string& incarnation, int64_t* cursor);
  // Drawn at random when the Cluster is created: names this coordinator run's event queues.
  const std::string& epoch() const { return epoch_; }

  // --- runner reports (worker-facing) ---

  // Stores the reports of a running attempt (persisted first, then served). Each report's
  // job_id and attempt must be empty/0 or match the request; host and process_index are set
  // from the attempt's mesh, time from the clock when unset. A non-finite "loss" fails the
  // attempt (then FAILED_PRECONDITION: the runner should stop). Errors: NOT_FOUND (unknown job),
  // FAILED_PRECONDITION (the attempt is not running: the runner should stop), INVALID_ARGUMENT
  // (a device outside the attempt's mesh, a report of another job or attempt), PERMISSION_DENIED
  // (`reporter` given and not the worker that drives a reported device: a worker reports only
  // its own devices), UNAVAILABLE (the state store failed: retry the same call).
  absl::Status ReportSteps(const v1::ReportStepsRequest& request,
                           const std::string& reporter = "");
  // RUNNING: noted. SUCCEEDED: once every process of the attempt has succeeded the job is
  // SUCCEEDED, with process 0's final_metrics in Job.progress.final_metrics. FAILED: the
  // attempt fails (see the class comment). Errors: NOT_FOUND (unknown job),
  // FAILED_PRECONDITION (the attempt is not the job's running attempt, e.g. it was cancelled or
  // already failed: nothing changes and the daemon may ignore this; or the worker does not run
  // that process of the attempt), INVALID_ARGUMENT (state UNSPECIFIED), UNAVAILABLE.
  absl::Status ReportAttemptStatus(const v1::ReportAttemptStatusRequest& request);
  // Process 0 of the running attempt says where it resumed from (Job.resumed_from_step, and a
  // RUNNING -> RUNNING transition that says so, naming every checkpoint skipped and why) and
  // which committed checkpoints the job's directory holds (Job.checkpoints). `reporter`, when
  // not empty, must be the worker that runs process 0. Errors: NOT_FOUND (unknown job),
  // FAILED_PRECONDITION (not the running attempt, or not its process 0's worker),
  // INVALID_ARGUMENT (more than limits::kMaxCheckpointRecords records, a negative step, a path
  // outside the job's checkpoint directory), UNAVAILABLE.
  absl::Status ReportCheckpoints(const v1::ReportCheckpointsRequest& request,
                                 const std::string& reporter = "");
  // Stores a piece of a process's log (ShipLogs; cluster_logs.cc): the bytes after those already
  // stored, as one chunk that the writer commits with everything else (bounded per process by
  // ClusterOptions::log_max_bytes_per_process). `request.worker_id` must be the worker that ran
  // that process of the attempt; the attempt may have ended (logs arrive after their runner
  // exits). Returns the offset expected next. Errors: INVALID_ARGUMENT (negative offset or
  // process index, data over limits::kMaxLogChunkBytes, names too long), NOT_FOUND (unknown job;
  // an attempt it never had, or one this coordinator no longer knows the processes of: one
  // before the current attempt when the coordinator restarted since), PERMISSION_DENIED (the
  // worker did not run that process), FAILED_PRECONDITION (a gap: "expected offset N"),
  // UNAVAILABLE (the state store failed; the bytes stay queued, and a retry is acknowledged).
  absl::StatusOr<int64_t> ShipLogs(const v1::ShipLogsRequest& request);

  // A reader of the stored logs of (job, attempt) (log_lines.h): it reads the store, never the
  // Cluster's state, so it needs no lock. `process_index` -1: every process.
  std::unique_ptr<LogReader> ReadLogs(const std::string& job_id, int attempt, int process_index,
                                      int tail_lines) const;

  // Which attempt a ReadLogs reads: request.attempt(), or the job's latest for 0. Returns 0
  // when the job has not started an attempt: with *notice set when there is nothing to wait
  // for (not following, or the job ended unstarted), else the caller waits for a change of the
  // job and asks again. Errors: INVALID_ARGUMENT (attempt or tail_lines negative,
  // process_index below -1), NOT_FOUND (unknown job; an attempt it never had).
  absl::StatusOr<int> LogAttempt(const v1::ReadLogsRequest& request, std::string* notice) const;
  // For a followed ReadLogs of `attempt` (process `process_index`, -1: all) whose reader has
  // read everything stored: whether it ends now, with which notices, and when to look again
  // even without a change. An attempt has ended once its job ended, restarted or went back to
  // PENDING; the stream then ends when every process's log has its end (the mesh's workers for
  // the latest attempt, the logs stored for an older one), or log_follow_grace after it first
  // saw the end (*give_up, on the clock; start it at InfiniteFuture) with the notices.
  // Errors: NOT_FOUND (the job was deleted).
  absl::StatusOr<LogFollow> FollowLogs(const std::string& job_id, int attempt, int process_index,
                                       const LogReader& reader, absl::Time* give_up) const;

  // OK iff (job_id, attempt) is the job's current running attempt. Errors: NOT_FOUND (unknown
  // job), FAILED_PRECONDITION (the message says how the attempt or job stands).
  absl::Status CheckAttemptRunning(const std::string& job_id, int attempt) const;
  // The worker that runs process `process_index` of (job_id, attempt), which must be the job's
  // running attempt (an attempt token's holder reports as that worker). Errors: those of
  // CheckAttemptRunning; INVALID_ARGUMENT (the attempt has no such process).
  absl::StatusOr<std::string> WorkerOfProcess(const std::string& job_id, int attempt,
                                              int process_index) const;

  // --- client-facing ---

  // Admits the spec by the submit policy (AdmitJobSpec in submit_policy.h: defaults, validation,
  // refusals, mesh fit against the alive workers), and queues it as "<spec.name>-<n>" (n counts
  // the jobs of the cluster's whole life, over restarts), scheduling at once if devices are
  // free. OK once the queued job is stored (a failed write of what scheduling then changed is
  // retried at the next Tick). Errors: AdmitJobSpec's (UNIMPLEMENTED, INVALID_ARGUMENT,
  // RESOURCE_EXHAUSTED), UNAVAILABLE (the state store failed; the job was not queued). `owner`
  // (the submitter's identity) is kept in Job.owner; unless `admin` or `owner` is empty, the
  // job's checkpoint, resume and TensorBoard paths must lie in the owner's directory under a
  // checkpoint root (Job.checkpoint_owner_directory; INVALID_ARGUMENT naming the field and the
  // allowed directories, or an owner name too long for a directory). `request_id`
  // (SubmitJobRequest.request_id; empty: none) makes the submit idempotent per owner while its
  // job exists: the same spec again returns that job as it is now; more errors:
  // INVALID_ARGUMENT (a request id longer than limits::kMaxRequestIdBytes or not of
  // [A-Za-z0-9_-]), ALREADY_EXISTS (the request id made job J from another spec: the message
  // names J), UNAVAILABLE (a submit with the same request id is still being stored: retry).
  //
  // Queues (docs/scheduling.md): the job gets spec.queue and spec.priority_class, or the
  // defaults (Job.queue, Job.priority_class, Job.priority); more errors: Scheduler::Admit's
  // (INVALID_ARGUMENT for an unknown queue or class, PERMISSION_DENIED for a submitter the queue
  // does not take, given the caller's `roles`, RESOURCE_EXHAUSTED for a job larger than its
  // queue could ever hold), PERMISSION_DENIED for spec.preemptible false from a non-admin.
  // A spec with spec.doctor is refused (INVALID_ARGUMENT): RunDoctor makes doctor jobs.
  absl::StatusOr<v1::Job> SubmitJob(v1::JobSpec spec, const std::string& owner = "",
                                    bool admin = false, const std::string& request_id = "",
                                    const std::vector<std::string>& roles = {});
  // Submits a doctor job for `owner` (an admin; `substraxctl doctor`, cluster_doctor.cc): one
  // process on each of `workers` (empty: every alive worker with a free device, at most
  // kMaxDoctorWorkers), scheduled as a job of the default queue; the workers not tested (dead,
  // every device busy, past the limit) are named with why in its spec.doctor.untested.
  // Errors: INVALID_ARGUMENT (a worker named twice or unknown, more than limits::kMaxWorkers),
  // FAILED_PRECONDITION (no worker can be tested: each named with why), and SubmitJob's.
  absl::StatusOr<v1::Job> RunDoctor(const std::vector<std::string>& workers,
                                    const std::string& owner);
  // Errors: NOT_FOUND.
  // The job and, while it runs, its processes' relayed activity and which rank the others wait
  // for (cluster_hangs.cc; JobService.DiagnoseJob). Errors: NOT_FOUND.
  absl::StatusOr<v1::DiagnoseJobResponse> DiagnoseJob(const std::string& job_id) const;
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) const;
  // Newest first; an empty filter means every state. Skips `offset` matching jobs and returns
  // at most `limit`; *more (when given) says whether more match after them.
  std::vector<v1::Job> ListJobs(const std::vector<v1::JobState>& states, size_t offset = 0,
                                size_t limit = SIZE_MAX, bool* more = nullptr) const;
  // One page of ListJobs: `page_size` jobs (limits::kDefaultJobsPageSize when <= 0, at most
  // limits::kMaxJobsPageSize; fewer once the page passes limits::kMaxJobsPageBytes) after the
  // page token, newest first, and the next token when more match. Errors: INVALID_ARGUMENT (a page token this coordinator did not hand out).
  absl::StatusOr<v1::ListJobsResponse> ListJobsPage(const v1::ListJobsRequest& request) const;
  // How many jobs are in each state (for gauges: copies nothing).
  std::map<v1::JobState, int> JobCounts() const;
  // Deletes an ended job and its metric points. Errors: NOT_FOUND, FAILED_PRECONDITION (not
  // ended: cancel it first), UNAVAILABLE.
  absl::Status DeleteJob(const std::string& job_id);
  // Cancels a PENDING or RUNNING job (its workers get stop events). `reason` defaults to
  // "cancelled by user". Errors: NOT_FOUND, FAILED_PRECONDITION (the job has ended: the message
  // says how), UNAVAILABLE.
  absl::StatusOr<v1::Job> CancelJob(const std::string& job_id, const std::string& reason);
  // In registration order, with state, seconds_since_heartbeat (from the clock) and the jobs
  // running on each.
  std::vector<v1::Worker> ListWorkers() const;
  // The mesh of the job's current or last attempt and its layouts ("batch/inputs" when the mesh
  // has a data axis). Errors: NOT_FOUND, FAILED_PRECONDITION (the job never started).
  absl::StatusOr<v1::GetMeshResponse> GetMesh(const std::string& job_id) const;
  // MetricsStore::Query with the job's declared reductions. Errors: NOT_FOUND (unknown job),
  // and MetricsStore::Query's.
  absl::StatusOr<v1::QueryMetricsResponse> QueryMetrics(
      const v1::QueryMetricsRequest& request) const;

  // The stragglers flagged now in running attempts, with their job ids (for gauges: only jobs
  // that have had one are looked at).
  std::vector<std::pair<std::string, v1::Straggler>> Stragglers() const;

  // --- queues ---

  // Replaces the queues, classes and policy (a reloaded --queues file); jobs keep the queue and
  // priority they were admitted with, and scheduling runs at once.
  void SetSchedulingConfig(v1::SchedulingConfig config);
  v1::SchedulingConfig SchedulingConfig() const;
  // Each queue's quota, use, borrowing and pending jobs, as of the latest scheduling pass.
  std::vector<scheduling::QueueStatus> Queues() const;

  // --- change notification, for the streaming rpcs ---

  // Subscriptions (change_feed.h), each called without the Cluster's lock once the change is
  // visible: ChangeFeed::WorkerTopic(w) when worker w's assignment events are committed (and so
  // returned by PollAssignments) or its queue restarts (a new incarnation, declared dead);
  // JobTopic(j) on any change of job j (state, progress, waiting reason, checkpoints) and on
  // its deletion; LogsTopic(j) when a piece of job j's logs is stored.
  ChangeFeed& changes() const { return changes_; }
  // Increments on every change of any job (state, progress, waiting reason) or assignment
  // queue.
  uint64_t version() const;
  // Blocks until version() > seen or `timeout` passes, in real time (not the injected clock:
  // it paces streams, it decides nothing). Returns version().
  uint64_t AwaitChange(uint64_t seen, absl::Duration timeout) const;

  // The attempts started since the last call, oldest first. The server drains them every tick;
  // beyond kMaxUndrainedPlacements undrained, the oldest are dropped (only a Cluster that
  // nobody drains gets there).
  std::vector<Placement> TakePlacements();
  static constexpr size_t kMaxUndrainedPlacements = limits::kMaxUndrainedPlacements;

  // Called (without the lock held) with (job_id, attempt) whenever an attempt ends, however it
  // ends, so the rendezvous store can drop the attempt's keys.
  void SetAttemptEndedCallback(std::function<void(const std::string&, int)> callback);

 private:
  struct WorkerEntry {
    // worker_id, host, address, incarnation, state, devices; the rest is filled in on output.
    v1::Worker proto;
    absl::Time last_heartbeat;
    // When it was declared dead (or loaded dead), on the lease clock.
    absl::Time dead_since = absl::InfinitePast();
    // Assignment events of the current incarnation not yet acknowledged: events[i] has cursor
    // acked + i + 1. A poll from cursor c acknowledges (drops) every event up to c.
    std::vector<v1::WatchAssignmentsResponse> events;
    int64_t acked = 0;
    // event_tickets[i]: the writer's ticket that must be committed before event i is sent
    // (what the event announces is stored first); kUnstamped until the call that pushed it
    // hands its changes to the writer.
    std::vector<uint64_t> event_tickets;
  };
  // One runner process of a running attempt.
  struct Process {
    std::string worker_id;
    std::vector<int> device_ids;
    bool succeeded = false;
    std::map<std::string, double> final_metrics;
    // A heartbeat of the worker listed this runner: from now on it must stay listed until its
    // outcome is reported.
    bool seen = false;
    // The highest step it reported, and when that step first arrived (the attempt's start
    // until its first report).
    int64_t last_step = 0;
    absl::Time last_progress;
    // It reported a step (of any number). A command job's process may take its time before its
    // first report (installing, compiling, loading data): its progress timeout starts there.
    bool reported = false;
    // The latest heartbeat said the runner is stopped by a signal.
    bool suspended = false;
    // The latest activity its agent relayed (contract/activity.h); has_activity: any yet.
    bool has_activity = false;
    v1::ProcessActivity activity;
    // The end of its log as shipped (at most kHangLogTailBytes), for hang reports.
    std::string log_tail;
    // While its attempt is preempted: its runner has ended (reported or no longer listed).
    bool stopped = false;
  };
  struct JobEntry {
    v1::Job job;
    // The reason of the latest PENDING transition before "; waiting for ...".
    std::string pending_reason;
    // The running attempt's mesh and processes (empty unless RUNNING).
    std::optional<Mesh> mesh;
    std::vector<Process> processes;
    // On the lease clock: when the first attempt started (for max_duration_seconds;
    // InfinitePast before), when the job ended (for finished_job_ttl), when its restart backoff
    // ends (InfinitePast: none) and when it last went PENDING (for Placement::waited).
    absl::Time first_start = absl::InfinitePast();
    absl::Time ended_at = absl::InfinitePast();
    absl::Time next_attempt_at = absl::InfinitePast();
    absl::Time pending_since = absl::InfinitePast();
    // (attempt, highest step) at the last metric prune.
    std::pair<int, int64_t> pruned{0, 0};
    // Its place in the submission order (the key of pending_).
    int64_t order = 0;
    // On the lease clock: when the running attempt started, and (while it is preempted,
    // Job.preemption) when its runners are given up on.
    absl::Time attempt_start = absl::InfinitePast();
    absl::Time preemption_deadline = absl::InfiniteFuture();
    // The running attempt's straggler detector (stragglers.h); rebuilt for each attempt and
    // after a restart (its window starts again).
    std::shared_ptr<StragglerDetector> stragglers;
    // The worker of each process of the attempts started by this coordinator run (the newest
    // kAttemptsRemembered), so that logs shipped after an attempt ended are still checked.
    std::map<int, std::vector<std::string>> attempt_workers;
  };
  static constexpr size_t kAttemptsRemembered = limits::kAttemptsRemembered;
  // Where each process's stored log ends, by (job, attempt, process).
  struct LogEnd {
    int64_t next = 0;
    bool eof = false;
  };
  using LogKey = std::tuple<std::string, int, int>;
  // Attempts that ended inside a locked section, reported to the callback after unlocking.
  using EndedAttempts = std::vector<std::pair<std::string, int>>;

  Cluster(const ClusterOptions& options, Clock clock, Clock lease_clock, StateStore* state);


  absl::Status LoadLocked(const StateStore::Snapshot& snapshot, EndedAttempts* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The answer to a SubmitJob whose (owner, request id) made `job_id` ("" while being stored):
  // that job if `fingerprint` is its spec's, else ALREADY_EXISTS; UNAVAILABLE while stored.
  absl::StatusOr<v1::Job> RepeatedSubmitLocked(const std::string& job_id,
                                               const std::string& request_id,
                                               const std::string& fingerprint) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps a doctor job's process report (Job.doctor), with its worker and host from the
  // process table, in place of an earlier one of the same process.
  void NoteDoctorReportLocked(JobEntry& entry, int process_index, const v1::DoctorReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SubmitJob without its refusal of spec.doctor (RunDoctor submits through it).
  absl::StatusOr<v1::Job> SubmitChecked(v1::JobSpec spec, const std::string& owner, bool admin,
                                        const std::string& request_id,
                                        const std::vector<std::string>& roles);
  // The queue, priority class and priority of a job being submitted (Scheduler::Admit), and
  // spec.preemptible false only from an admin (by flag or by role).
  absl::Status AdmitToQueueLocked(const v1::JobSpec& spec, const std::string& owner, bool admin,
                                  const std::vector<std::string>& roles, v1::Job* job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The submit policy applied to the alive workers as they are now.
  absl::StatusOr<v1::JobSpec> AdmitJobSpec(v1::JobSpec spec, const std::string& owner_dir) const
      ABSL_LOCKS_EXCLUDED(mu_);
  AliveDevices AliveDevicesLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `devices` without those of workers that cannot run `spec`: a command job runs only on a
  // worker that runs commands and, with spec.command.python_env, has that environment.
  std::vector<Device> RunnableDevicesLocked(const v1::JobSpec& spec,
                                            std::vector<Device> devices) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The devices of `devices` that `spec` may be placed on: a doctor job's one per worker it
  // tests (DoctorDevices), else those of its backend on workers that can run it.
  std::vector<Device> CandidateDevicesLocked(const v1::JobSpec& spec,
                                             const std::vector<Device>& devices) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker, if the caller's incarnation is its current one and it is alive.
  absl::StatusOr<WorkerEntry*> LiveWorkerLocked(const std::string& worker_id,
                                                const std::string& incarnation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<JobEntry*> FindJobLocked(const std::string& job_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const JobEntry* FindJobOrNullLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckAttemptRunningLocked(const std::string& job_id, int attempt) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ReportStepsLocked(const v1::ReportStepsRequest& request,
                                 const std::string& reporter, EndedAttempts* ended,
                                 uint64_t* ticket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What a report says about the data (total steps, input features), kept with the job.
  void NoteDataFactsLocked(JobEntry& entry, const v1::StepReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues a prune of the running attempt's metric history (see ClusterOptions) once its
  // steps have grown by a quarter window since the last one.
  void PruneMetricsLocked(JobEntry& entry, int64_t highest_step)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int ActiveJobsLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the jobs from memory and queues their deletion; the writer's ticket.
  uint64_t DeleteJobsLocked(const std::set<std::string>& job_ids)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Deletes ended jobs past finished_job_ttl or beyond max_finished_jobs.
  void ExpireFinishedJobsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Builds the process table of `mesh` (process p: the p-th distinct worker_id in row-major
  // device order) and marks its devices busy.
  void TakeDevicesLocked(JobEntry& entry, Mesh mesh) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records `workers` (process p's worker at p) as the workers of the entry's current attempt,
  // keeping the last kAttemptsRemembered attempts.
  void RememberAttemptWorkersLocked(JobEntry& entry, std::vector<std::string> workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The worker that ran process `p` of the job's attempt, or NOT_FOUND.
  absl::StatusOr<std::string> WorkerOfProcessLocked(const JobEntry& entry, int attempt,
                                                    int p) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the end of a running process's log (Process.log_tail, kHangLogTailBytes) as it is
  // shipped.
  void NoteLogTailLocked(const v1::ShipLogsRequest& request, const std::string& data)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The checks of ShipLogs that need the lock (job, attempt, worker of the process).
  absl::Status CheckShipperLocked(const v1::ShipLogsRequest& request) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Job.progress step, metrics and samples_per_second from the current attempt's points.
  void RefreshProgressLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job as it is now, ready to return.
  v1::Job JobViewLocked(const JobEntry& entry) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // State changes. Each records the transition, marks the job dirty and bumps the version.
  void TransitionLocked(JobEntry& entry, v1::JobState to, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the start event of every process of the running attempt to its worker.
  void PushStartEventsLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts an attempt on `mesh`: assignments to its workers, devices taken, the placement
  // recorded.
  void StartAttemptLocked(JobEntry& entry, Mesh mesh, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the running attempt: stop events (reason `why`) to its workers except `culprit`,
  // devices freed, the attempt reported as ended.
  void EndAttemptLocked(JobEntry& entry, const std::string& why, const std::string& culprit,
                        EndedAttempts* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the running attempt because of `culprit` (a worker id, may be empty) and `cause`;
  // restarts the job or ends it FAILED.
  // With `retryable` false the job ends FAILED whatever restarts are left.
  void FailAttemptLocked(JobEntry& entry, const std::string& culprit, const std::string& cause,
                         EndedAttempts* ended, bool retryable = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Which rank the processes of `entry`'s attempt wait for (hang_attribution.h), from the
  // activity their agents relayed (cluster_hangs.cc): AttributeHang, or AttributeCommandStall
  // for a command job.
  HangAttribution AttributeHangLocked(const JobEntry& entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // " (process 1 on worker w-2 (host b) is suspended at step 40: its peers wait for it)" for
  // each suspended process of the running attempt other than `except`, or "".
  std::string SuspendedNoteLocked(const JobEntry& entry, int except) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails stalled attempts and ends jobs past their max_duration_seconds.
  void CheckProgressLocked(EndedAttempts* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails every running attempt with a process on `worker_id`.
  void FailAttemptsOfWorkerLocked(const std::string& worker_id, const std::string& cause,
                                  EndedAttempts* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLeasesLocked(EndedAttempts* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Room for one more worker (`worker_id`, not known yet): OK below max_workers, or once the
  // longest dead worker is forgotten; else RESOURCE_EXHAUSTED.
  absl::Status MakeRoomLocked(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets dead workers past dead_worker_retention (and, with `room_for_one`, the longest dead
  // one when the cluster knows max_workers); false when no room could be made.
  bool ForgetDeadWorkersLocked(bool room_for_one) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stored wall time as an instant of the lease clock: as far from the lease clock's now as
  // it is from the wall clock's (see the class comment).
  absl::Time RebaseLocked(absl::Time wall) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The policy's view of the cluster (cluster_preemption.cc): the schedulable pending jobs,
  // the running ones.
  scheduling::PendingJob PendingViewLocked(const JobEntry& entry, const std::vector<int>& sizes,
                                           const std::string& pool) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  scheduling::RunningJob RunningViewLocked(const JobEntry& entry) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts the preemption of the running `victim` for `for_job`: Job.preemption set, a stop
  // event with preempt and the grace to each of its workers; it keeps its devices until its
  // processes have stopped (FinishPreemptionLocked).
  void PreemptLocked(JobEntry& victim, const std::string& for_job, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The preempted attempt's processes on `worker_id` ("" for all) have stopped; once all have,
  // or past the deadline, the job goes back to PENDING (FinishPreemptionLocked).
  void NotePreemptedStoppedLocked(JobEntry& entry, const std::string& worker_id,
                                  EndedAttempts* ended) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the preempted attempt and queues the job again, counting the work lost; restarts are
  // not used.
  void FinishPreemptionLocked(JobEntry& entry, const std::string& how, EndedAttempts* ended)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A running attempt loaded from the store: when it started, and a preemption in progress
  // goes on (its stop events again, its deadline at least a grace away).
  void ResumeLoadedAttemptLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new straggler detector for the running attempt's devices.
  void StartStragglerDetectorLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A device flagged or cleared: Job.stragglers and a RUNNING -> RUNNING transition.
  void NoteStragglerLocked(JobEntry& entry, const StragglerChange& change)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues the preemption stop events of a preempted attempt (again, after a restart).
  void PushPreemptEventsLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps pending_ in step with the entry's state (after every state change).
  void NotePendingLocked(const JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets the "; waiting for ..." part of a pending job's reason (a change only if it differs).
  void SetWaitingLocked(JobEntry& entry, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PushEventLocked(const std::string& worker_id, v1::WatchAssignmentsResponse event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkJobChangedLocked(JobEntry& entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Hands every dirty job and worker to the writer; its ticket (wait for it without the lock).
  uint64_t EnqueueLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "worker w-2 (host b)".
  std::string DescribeWorkerLocked(const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Flushes the change feed, then calls the attempt-ended callback for each; must be called
  // without the lock, after every locked section that changed something.
  void NotifyEnded(const EndedAttempts& ended) ABSL_LOCKS_EXCLUDED(mu_);
  // After a commit of every ticket up to `committed`: marks the workers whose assignment
  // events it released.
  void MarkReleasedEventsLocked(uint64_t committed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const ClusterOptions options_;
  const Clock clock_;
  const Clock lease_clock_;
  const std::string epoch_;
  StateStore* const state_;
  // Created after loading; the only writer of state_ (SubmitJob's first write aside).
  std::unique_ptr<StateWriter> writer_;
  // Each running attempt's newest steps, for progress: from its newest step every device
  // reported, at most kProgressSteps (how far one process's reports may run ahead of another's
  // and still let the step they share become progress).
  static constexpr int kProgressSteps = 64;
  MetricsStore metrics_{kProgressSteps};

  // Who waits for what (streams); marked under mu_, flushed without it.
  mutable ChangeFeed changes_;
  mutable absl::Mutex mu_;
  std::function<void(const std::string&, int)> attempt_ended_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // Attempts started and not yet taken by TakePlacements.
  std::vector<Placement> placements_ ABSL_GUARDED_BY(mu_);
  // Workers by id, and their registration order.
  std::map<std::string, WorkerEntry> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> worker_order_ ABSL_GUARDED_BY(mu_);
  // Jobs by id, and their submission order (the FIFO queue is this order, PENDING ones).
  std::map<std::string, JobEntry> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  // The PENDING jobs by (order, id): what scheduling walks, rather than every job ever kept.
  std::set<std::pair<int64_t, std::string>> pending_ ABSL_GUARDED_BY(mu_);
  int64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  // (worker_id, local_index) -> device id, for stable ids; the next id to hand out.
  std::map<std::pair<std::string, int>, int> device_ids_ ABSL_GUARDED_BY(mu_);
  int next_device_id_ ABSL_GUARDED_BY(mu_) = 0;
  // Device id -> the job whose running attempt holds it.
  std::map<int, std::string> busy_devices_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_number_ ABSL_GUARDED_BY(mu_) = 1;
  // Jobs that had a straggler flagged since they were last looked at by Stragglers().
  mutable std::set<std::string> straggling_ ABSL_GUARDED_BY(mu_);
  // The policy, with its fair-share history.
  scheduling::Scheduler scheduler_ ABSL_GUARDED_BY(mu_);
  // (owner, request id) -> the job it made (SubmitJob); "" while that submit is being stored.
  std::map<std::pair<std::string, std::string>, std::string> submit_requests_
      ABSL_GUARDED_BY(mu_);
  static constexpr uint64_t kUnstamped = ~uint64_t{0};
  // Workers with events pushed since the last EnqueueLocked.
  std::set<std::string> unstamped_workers_ ABSL_GUARDED_BY(mu_);
  // Workers with stamped events that no commit has released yet (their streams are woken by
  // the commit that does).
  std::set<std::string> unreleased_workers_ ABSL_GUARDED_BY(mu_);
  // The commit MarkReleasedEventsLocked last saw: events of tickets up to it are announced.
  uint64_t events_released_through_ ABSL_GUARDED_BY(mu_) = 0;
  // Submits admitted against max_active_jobs whose job is being written.
  int submits_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Not yet written to the state store.
  std::set<std::string> dirty_jobs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> dirty_workers_ ABSL_GUARDED_BY(mu_);
  // The logs shipped to kept jobs, loaded from the store on a log's first chunk in this run.
  std::map<LogKey, LogEnd> log_ends_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_CLUSTER_H_
