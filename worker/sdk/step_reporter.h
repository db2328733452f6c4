// StepReporter: sends a runner's step reports to the coordinator off the step loop.
//
// Device threads call Enqueue, which only appends to a bounded queue and never waits on the
// network: a slow or unreachable coordinator must not slow training. One thread of the
// reporter takes everything queued (at most `max_batch` reports, 256 by default, so that a
// request stays under any per-request limit the coordinator may set) and sends it as ONE
// ReportStepsRequest; more queued reports go in further requests.
//
// Bounds and what happens at them:
//   - The queue holds at most `max_queued` reports (4096 by default: with 8 devices and a report
//     every 10 steps, 5000 steps of history). A full queue drops its OLDEST report for each new
//     one (the newest metrics are the ones worth having). Drops are counted and logged at most
//     once per `drop_log_interval`, with the count since the last such line: never silently.
//     Memory is therefore bounded by max_queued + max_batch reports (the batch in flight).
//   - UNAVAILABLE and DEADLINE_EXCEEDED (coordinator restarting, network) are retried with
//     exponential backoff and jitter up to `max_backoff`; meanwhile new reports queue (and, when
//     the queue is full, the oldest are dropped as above).
//   - RESOURCE_EXHAUSTED or INVALID_ARGUMENT for a request of several reports (a per-request
//     limit lower than ours): the request is split in halves and the cap halved for the rest of
//     the run; a single report refused so is dropped, counted and logged.
//   - FAILED_PRECONDITION, or PERMISSION_DENIED (the attempt's token is refused: its attempt
//     is no longer the running one): the coordinator says the attempt has ended (cancelled,
//     failed elsewhere, this worker fenced). Nothing more is sent and `on_attempt_ended` is
//     called once, from the reporter's thread (the runner writes a FAILED result and exits at
//     once).
//   - Other errors (NOT_FOUND: the job is gone) drop the request, counted and logged.
//
// Flush(timeout) waits until everything queued before it was delivered or the timeout passed; the
// runner calls it at the end of training, before writing its result, so that the final steps are
// not lost in the normal case. Every RPC's deadline is at most `rpc_timeout` and never later than
// a pending flush's deadline, so a flush is bounded by its timeout. The destructor stops the
// thread after the request in flight (at most rpc_timeout); what is still queued is dropped and
// counted in the last log line.
//
// Thread-safe.
#ifndef SUBSTRAX_WORKER_SDK_STEP_REPORTER_H_
#define SUBSTRAX_WORKER_SDK_STEP_REPORTER_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "rpc/cancellable_call.h"

namespace substrax {

struct StepReporterOptions {
  std::string job_id;
  int attempt = 0;
  size_t max_queued = 4096;
  size_t max_batch = 256;
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration drop_log_interval = absl::Seconds(10);
  // Where the reporter's lines go (default: stderr, "substrax runner: ...").
  std::function<void(const std::string&)> log;
};

struct StepReporterStats {
  int64_t sent = 0;      // reports the coordinator acknowledged
  int64_t dropped = 0;   // reports dropped: the queue was full, or left at the end
  int64_t refused = 0;   // reports the coordinator refused (not as an ended attempt)
};

// Where the requests go. Send is called from the reporter's thread only; Cancel from any thread.
class StepSender {
 public:
  virtual ~StepSender() = default;
  // Sends one request; returns the coordinator's answer (or the transport's error).
  virtual absl::Status Send(const v1::ReportStepsRequest& request, absl::Time deadline) = 0;
  // Makes a Send in progress return soon (with any error).
  virtual void Cancel() = 0;
};

// ReportSteps RPCs on a coordinator stub.
class GrpcStepSender : public StepSender {
 public:
  explicit GrpcStepSender(std::shared_ptr<v1::CoordinatorService::StubInterface> stub)
      : stub_(std::move(stub)) {}
  absl::Status Send(const v1::ReportStepsRequest& request, absl::Time deadline) override;
  void Cancel() override;

 private:
  const std::shared_ptr<v1::CoordinatorService::StubInterface> stub_;
  CancellableCall call_;
};

class StepReporter {
 public:
  // Called once, from the reporter's thread, with the coordinator's FAILED_PRECONDITION.
  using EndedFn = std::function<void(const absl::Status& status)>;

  // `sender` must outlive the reporter.
  StepReporter(StepReporterOptions options, StepSender* sender, EndedFn on_attempt_ended);
  ~StepReporter();
  StepReporter(const StepReporter&) = delete;
  StepReporter& operator=(const StepReporter&) = delete;

  // Queues one report (job_id and attempt are set here). Never blocks on the network; ignored
  // once the attempt has ended.
  void Enqueue(v1::StepReport report);

  // Waits until every report queued before the call was delivered (or refused), at most
  // `timeout`. Errors: DEADLINE_EXCEEDED (naming how many reports were not delivered),
  // FAILED_PRECONDITION (the attempt has ended).
  absl::Status Flush(absl::Duration timeout);

  StepReporterStats stats() const;

 private:
  void Loop();
  // Sends `batch` until delivered, refused or stopped; splits a refused batch. Called without mu_.
  void Deliver(std::vector<v1::StepReport> batch);
  // Counts `n` reports dropped (they will never be sent; logged by LogDropsLocked).
  void DropLocked(int64_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LogDropsLocked(bool force) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Log(const std::string& line) const;

  const StepReporterOptions options_;
  StepSender* const sender_;
  const EndedFn on_attempt_ended_;

  mutable absl::Mutex mu_;
  std::deque<v1::StepReport> queue_ ABSL_GUARDED_BY(mu_);
  // Reports ever queued, and those that left for good (delivered, refused or dropped): a flush
  // waits for the second to reach the first's value at its call (reports leave in order).
  int64_t enqueued_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t finished_ ABSL_GUARDED_BY(mu_) = 0;
  size_t batch_cap_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  // The deadline of the earliest pending Flush; InfiniteFuture when none.
  absl::Time flush_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int flushers_ ABSL_GUARDED_BY(mu_) = 0;
  StepReporterStats stats_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_unlogged_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_drop_log_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::thread thread_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_SDK_STEP_REPORTER_H_
