// Every fixed limit the coordinator's rpcs enforce, in one place (docs/operations.md lists them
// with the configurable ones: --max-active-jobs, --max-finished-jobs, --finished-job-ttl,
// --dead-worker-retention,
// --metrics-raw-steps, --metrics-history-every, --max-rpc-threads, --max-worker-rpc-threads,
// --blocking-call-threads, --max-streams-per-caller, --max-calls-per-caller); the configurable ones' defaults are here too. A request past a limit is
// refused with INVALID_ARGUMENT (a malformed request: too long, too many) or RESOURCE_EXHAUSTED
// (the coordinator is full), and the message names the field and the limit; nothing of it is
// kept. Text the coordinator stores on a job's behalf (errors, stderr tails) is cut instead.
#ifndef SUBSTRAX_COORDINATOR_LIMITS_H_
#define SUBSTRAX_COORDINATOR_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "substrax/v1/coordinator_service.pb.h"

namespace substrax {
namespace limits {

// Names: worker ids, hosts, addresses, incarnations, job ids, metric names, barrier ids.
inline constexpr size_t kMaxNameBytes = 256;
// Devices one worker registers.
inline constexpr int kMaxDevicesPerWorker = 1024;
// Data roots (and checkpoint roots, and programs dirs) one worker registers, and the length of
// each.
inline constexpr int kMaxDataRootsPerWorker = 64;
inline constexpr size_t kMaxPathBytes = 4096;
// Python environments one worker registers (--python-env); each name is at most
// kMaxPythonEnvNameBytes of core/job_spec.h.
inline constexpr int kMaxPythonEnvsPerWorker = 64;
// Runners one heartbeat lists.
inline constexpr int kMaxRunnersPerHeartbeat = 1024;
// A runner's activity (RunnerRef.activity, contract/activity.h): as many devices and
// communicators as the activity file has slots, names as long as its names.
inline constexpr int kMaxActivityDevices = 64;
inline constexpr int kMaxActivityCollectives = 256;
inline constexpr size_t kMaxActivityNameBytes = 64;
// A doctor process's report (ReportAttemptStatusRequest.doctor): findings, links (one per
// peer: every pair up to 8 processes, 2 on the ring beyond), and each finding's text.
inline constexpr int kMaxDoctorFindings = 64;
inline constexpr int kMaxDoctorLinks = 16;
inline constexpr size_t kMaxDoctorTextBytes = 1024;
// Workers the coordinator knows (registered, alive or dead).
inline constexpr int kMaxWorkers = 10000;
// Step reports per ReportSteps request, and values (metric names) per report.
inline constexpr int kMaxReportsPerRequest = 4096;
inline constexpr int kMaxValuesPerReport = 64;
// A job spec, serialized.
inline constexpr size_t kMaxSpecBytes = 64 * 1024;
// SubmitJobRequest.request_id: 1 to this many of [A-Za-z0-9_-] (or empty: no idempotency).
inline constexpr size_t kMaxRequestIdBytes = 64;
// Rendezvous: key and value sizes, keys per attempt, concurrent waiters (Get and Barrier) over
// the whole coordinator.
inline constexpr size_t kMaxKeyBytes = 1024;
inline constexpr size_t kMaxValueBytes = 1024 * 1024;
inline constexpr int kMaxKeysPerAttempt = 10000;
inline constexpr int kMaxRendezvousWaiters = 4096;
// Rendezvous totals: the bytes of keys and values one attempt holds, and all attempts together
// (so that a runner cannot fill the coordinator's memory within the per-attempt limits); barriers
// one attempt opens, and the participants of one barrier (no job has more processes than a
// worker has devices times the workers, and a barrier's bookkeeping grows with its count).
inline constexpr size_t kMaxRendezvousBytesPerAttempt = size_t{64} << 20;
inline constexpr size_t kMaxRendezvousBytes = size_t{512} << 20;
inline constexpr int kMaxBarriersPerAttempt = 10000;
inline constexpr int kMaxBarrierParticipants = 65536;
// What a client sends that the coordinator stores or relays (coordinator/request_limits.h checks
// each request against these): a cancel reason (stored in the job's history and relayed to the
// daemons in a stop event); the final metrics of one process (ReportAttemptStatus); metric names
// one QueryMetrics asks for; job states one ListJobs filters by; the entries of a resume's
// skipped list; the bytes of one checkpoint listing (ReportCheckpoints), which a job carries
// in every GetJob and ListJobs answer.
inline constexpr size_t kMaxReasonBytes = 1024;
inline constexpr int kMaxFinalMetrics = 64;
inline constexpr int kMaxQueryMetricNames = 64;
inline constexpr int kMaxListStates = 16;
inline constexpr size_t kMaxCheckpointListingBytes = 256 * 1024;
// Text stored with a failed attempt's transition: the runner's error and its stderr tail.
inline constexpr size_t kMaxErrorBytes = 2048;
inline constexpr size_t kMaxStderrBytes = 2048;
// Transitions kept per job: the first (submission) and the newest ones, so that a job restarting
// many times does not grow without bound (Job.attempt still counts every attempt).
inline constexpr int kMaxTransitionsKept = 64;
// Checkpoint records kept per job (ReportCheckpoints), and the text of a resume's skipped list.
inline constexpr int kMaxCheckpointRecords = 1000;
inline constexpr size_t kMaxSkippedBytes = 2048;
// The bytes of one ShipLogs request (a daemon ships a log in pieces of at most this size).
inline constexpr size_t kMaxLogChunkBytes = 64 * 1024;
// How long a followed log waits, after its attempt ended, for the processes' last pieces (a
// daemon that died never ships them): ClusterOptions::log_follow_grace's default.
inline constexpr int kLogFollowGraceSeconds = 30;
// ListJobs pages: the size of a page when the request gives none (page_size <= 0), and the
// largest page served (a larger page_size is served this many).
inline constexpr int kDefaultJobsPageSize = 100;
inline constexpr int kMaxJobsPageSize = 1000;
// ...and the bytes of a page: a page ends early (next_page_token continues) once its jobs pass
// this, well under the clients' receive limit (gRPC's default, 4 MiB). A page holds at least one
// job, and one job is bounded by kMaxSpecBytes, kMaxTransitionsKept transitions of bounded text
// and kMaxCheckpointListingBytes.
inline constexpr size_t kMaxJobsPageBytes = size_t{1} << 20;
// The largest WatchAssignments event the coordinator sends: the daemons' receive limit (gRPC's
// default). A larger start event is skipped and logged (the attempt then fails at its progress
// timeout, its runner never started); a stop event's reason is cut to fit. Daemons skip an event they cannot
// receive too (agent/daemon.cc).
inline constexpr size_t kMaxAssignmentEventBytes = size_t{4} << 20;
// Calls of one identity at a time (CoordinatorServerOptions, --max-streams-per-caller and
// --max-calls-per-caller): open server streams (WatchJob, ReadLogs) and unary calls in flight.
// Workers (role worker) are never counted: a user cannot starve them.
inline constexpr int kDefaultMaxStreamsPerCaller = 64;
inline constexpr int kDefaultMaxCallsPerCaller = 64;
// Retention: the defaults of ClusterOptions and their flags (--max-active-jobs,
// --finished-job-ttl, --max-finished-jobs, --metrics-raw-steps, --metrics-history-every,
// --log-max-bytes-per-process).
inline constexpr int kDefaultMaxActiveJobs = 1000;
inline constexpr int kDefaultFinishedJobTtlHours = 7 * 24;
inline constexpr int kDefaultMaxFinishedJobs = 10000;
inline constexpr int64_t kDefaultMetricsRawSteps = 10000;
inline constexpr int64_t kDefaultMetricsHistoryEvery = 1000;
inline constexpr int64_t kDefaultLogMaxBytesPerProcess = int64_t{8} << 20;
// A dead worker is forgotten this long after it died (--dead-worker-retention); at
// kMaxWorkers, the longest dead goes first to make room for a new one.
inline constexpr int kDefaultDeadWorkerRetentionHours = 24;
// Attempts started and not yet taken by the server's tick (Cluster::TakePlacements); beyond,
// the oldest are dropped. Attempts of a job whose workers the Cluster remembers, so that logs
// shipped after an attempt ended are still checked.
inline constexpr size_t kMaxUndrainedPlacements = 10000;
inline constexpr size_t kAttemptsRemembered = 16;
// The gRPC layer's defaults (CoordinatorServerOptions, flags of the same names): the largest
// request accepted; threads and memory of the client-facing server; the worker-facing
// server's own (--worker-listen), so that clients can never starve heartbeats; threads that
// run the calls which wait for a commit of the state store.
inline constexpr int kMaxReceiveMessageBytes = 4 * 1024 * 1024;
inline constexpr int kMaxRpcThreads = 2048;
inline constexpr size_t kMaxRpcMemoryBytes = size_t{1} << 30;
inline constexpr int kMaxWorkerRpcThreads = 2048;
inline constexpr size_t kMaxWorkerRpcMemoryBytes = size_t{1} << 30;
inline constexpr int kBlockingCallThreads = 32;
// Heartbeats are served on a completion queue of their own (server_heartbeats.cc): the threads
// that take them, and the calls requested ahead (each waits there for a heartbeat to arrive).
inline constexpr int kHeartbeatThreads = 2;
inline constexpr int kHeartbeatCallsRequested = 64;
// The longest a KeyValueGet or Barrier may wait, whatever the runner asks.
inline constexpr int kMaxRendezvousWaitSeconds = 600;
// How long unary calls get to finish when the coordinator shuts down (streams end at once).
inline constexpr int kShutdownGraceSeconds = 2;

}  // namespace limits

// `text` if it has at most `max_bytes`, else its first max_bytes (cut at a UTF-8 boundary)
// followed by " ... (N more bytes)".
std::string BoundedText(absl::string_view text, size_t max_bytes);

// INVALID_ARGUMENT naming `field` when `value` is longer than kMaxNameBytes.
absl::Status CheckName(absl::string_view field, absl::string_view value);

// The limits of a ReportSteps request (reports per request, values per report, name sizes).
absl::Status CheckReportLimits(const v1::ReportStepsRequest& request);

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_LIMITS_H_
