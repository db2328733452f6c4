// The server streams (WatchAssignments, WatchJob, ReadLogs) as write reactors: no thread waits
// for a change. Each subscribes to its topics of the Cluster's change feed before it first looks
// at the state, so that no change between the two is missed; a wake (a change, an alarm,
// shutdown) polls the state and writes what is new, one write at a time. What to send and when
// to end is the Cluster's (PollAssignments, GetJob, LogAttempt/FollowLogs); here only the
// writing.
#include <chrono>
#include <deque>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "coordinator/change_feed.h"
#include "coordinator/failpoint.h"
#include "coordinator/limits.h"
#include "coordinator/server_internal.h"
#include "grpcpp/alarm.h"
#include "rpc/grpc_status.h"

namespace substrax::server_internal {
namespace {

// What one poll found.
template <typename Response>
struct Step {
  std::vector<Response> out;
  // End the stream with this once `out` is written.
  std::optional<grpc::Status> finish;
  // More is there than was returned: poll again once `out` is written.
  bool more = false;
  // Poll again by then even without a change.
  absl::Time recheck = absl::InfiniteFuture();
};

template <typename Response>
class NotifiedStream : public grpc::ServerWriteReactor<Response> {
 public:
  explicit NotifiedStream(ServerState* state) : state_(state) {}

  // Subscribes to `topics`, registers for shutdown, and looks at the state for the first time.
  void Begin(const std::vector<std::string>& topics) {
    // The handle outlives this object where a feed flush or an alarm still holds it.
    handle_ = std::make_shared<StreamHandle>([this] { Wake(); });
    for (const std::string& topic : topics) {
      subscriptions_.push_back(
          state_->cluster->changes().Subscribe(topic, [h = handle_] { h->Wake(); }));
    }
    state_->AddStream(handle_);
    Wake();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      // The client is gone.
      FinishLocked(grpc::Status::CANCELLED);
      return;
    }
    queue_.pop_front();
    PumpLocked();
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    handle_->Detach();
    for (ChangeFeed::Id id : subscriptions_) state_->cluster->changes().Unsubscribe(id);
    state_->RemoveStream(handle_);
    delete this;
  }

 protected:
  // Appends what is new to step->out, and says whether and how the stream ends. Called with mu_
  // held, one at a time; it may call into the Cluster (which never calls back under its lock).
  virtual void Poll(Step<Response>* step) = 0;
  // Just before `response` is written.
  virtual void BeforeWrite(Response& response) { (void)response; }

  ServerState* const state_;

 private:
  void Wake() {
    absl::MutexLock lock(&mu_);
    PumpLocked();
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    alarm_.reset();
    this->Finish(status);
  }

  // Writes the next response, or polls when all is written; ends the stream when told to.
  void PumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    while (!finished_ && !writing_) {
      if (cancelled_) return FinishLocked(grpc::Status::CANCELLED);
      if (state_->stopping.load()) {
        return FinishLocked(ToGrpcStatus(absl::UnavailableError("the coordinator is shutting down")));
      }
      if (!queue_.empty()) {
        BeforeWrite(queue_.front());
        writing_ = true;
        this->StartWrite(&queue_.front());
        return;
      }
      if (end_.has_value()) return FinishLocked(*end_);
      Step<Response> step;
      Poll(&step);
      for (Response& r : step.out) queue_.push_back(std::move(r));
      end_ = step.finish;
      if (step.recheck != absl::InfiniteFuture()) SetAlarmLocked(step.recheck);
      if (queue_.empty() && !end_.has_value() && !step.more) return;  // wait for a wake
    }
  }

  void SetAlarmLocked(absl::Time at) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (alarm_ != nullptr && alarm_at_ == at) return;
    alarm_ = std::make_unique<grpc::Alarm>();
    alarm_at_ = at;
    alarm_->Set(absl::ToChronoTime(at), [h = handle_](bool fired) {
      if (fired) h->Wake();
    });
  }

  std::shared_ptr<StreamHandle> handle_;
  std::vector<ChangeFeed::Id> subscriptions_;
  absl::Mutex mu_;
  // Written front first; the front is in flight while writing_.
  std::deque<Response> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<grpc::Status> end_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<grpc::Alarm> alarm_ ABSL_GUARDED_BY(mu_);
  absl::Time alarm_at_ ABSL_GUARDED_BY(mu_);
};

// A daemon's assignment events, resumed after its last (epoch, cursor).
class AssignmentStream final : public NotifiedStream<v1::WatchAssignmentsResponse> {
 public:
  AssignmentStream(ServerState* state, const v1::WatchAssignmentsRequest& request)
      : NotifiedStream(state),
        request_(request),
        cursor_(request.cursor()),
        epoch_(request.epoch()) {}

 private:
  void Poll(Step<v1::WatchAssignmentsResponse>* step) override {
    absl::StatusOr<std::vector<v1::WatchAssignmentsResponse>> events =
        state_->cluster->PollAssignments(request_.worker_id(), request_.incarnation(), epoch_,
                                         &cursor_);
    epoch_ = state_->cluster->epoch();
    if (!events.ok()) {
      step->finish = ToGrpcStatus(events.status());
      return;
    }
    for (v1::WatchAssignmentsResponse& event : *events) {
      if (event.has_start()) {
        v1::Assignment* a = event.mutable_start();
        a->set_rendezvous_secret(state_->SecretOf(a->job_id(), a->attempt()));
        a->set_attempt_token(state_->TokenOf(a->job_id(), a->attempt(), a->process_index()));
      }
      if (FitForDaemon(event)) step->out.push_back(std::move(event));
    }
  }

  // Whether `event` fits what a daemon receives (limits::kMaxAssignmentEventBytes): a stop
  // event's reason is cut to fit (a stop must arrive); a start event too large is skipped and
  // logged, never re-sent (the cursor moves past it), and the attempt fails at its progress
  // timeout, its runner never having started. The rpcs bound what goes into events, so this is the last guard.
  bool FitForDaemon(v1::WatchAssignmentsResponse& event) const {
    const size_t size = event.ByteSizeLong();
    if (size <= limits::kMaxAssignmentEventBytes) return true;
    if (event.has_stop()) {
      v1::StopAttempt* stop = event.mutable_stop();
      stop->set_reason(BoundedText(stop->reason(), limits::kMaxReasonBytes));
      return true;
    }
    std::cerr << "substrax-coordinator: skipped the assignment of job "
              << BoundedText(event.start().job_id(), limits::kMaxNameBytes) << " attempt "
              << event.start().attempt() << " to worker " << request_.worker_id() << ": "
              << size << " bytes, more than a daemon receives ("
              << limits::kMaxAssignmentEventBytes << ")\n";
    return false;
  }

  void BeforeWrite(v1::WatchAssignmentsResponse& event) override {
    Failpoint(event.has_start() ? "before_send_start" : "before_send_stop");
  }

  const v1::WatchAssignmentsRequest request_;
  int64_t cursor_;
  std::string epoch_;
};

// A job as it changes, until it ends.
class JobStream final : public NotifiedStream<v1::WatchJobResponse> {
 public:
  JobStream(ServerState* state, const v1::WatchJobRequest& request, const Caller& caller)
      : NotifiedStream(state), job_id_(request.job_id()), caller_(caller) {}

 private:
  void Poll(Step<v1::WatchJobResponse>* step) override {
    absl::StatusOr<v1::Job> job = state_->cluster->GetJob(job_id_);
    if (!job.ok()) {
      step->finish = ToGrpcStatus(job.status());
      return;
    }
    RedactForCaller(caller_, &*job);
    std::string now = job->SerializeAsString();
    if (now != last_) {
      v1::WatchJobResponse response;
      *response.mutable_job() = *job;
      step->out.push_back(std::move(response));
      last_ = std::move(now);
    }
    if (IsTerminalJobState(job->state())) step->finish = grpc::Status::OK;
  }

  const std::string job_id_;
  const Caller caller_;
  std::string last_;
};

// One attempt's logs, and (following) what is stored later until the Cluster says they ended.
class LogStream final : public NotifiedStream<v1::ReadLogsResponse> {
 public:
  LogStream(ServerState* state, const v1::ReadLogsRequest& request)
      : NotifiedStream(state),
        request_(request),
        process_(request.has_process_index() ? request.process_index() : -1) {}

 private:
  static v1::ReadLogsResponse Notice(const std::string& text) {
    v1::ReadLogsResponse response;
    response.add_notices(text);
    return response;
  }

  void Poll(Step<v1::ReadLogsResponse>* step) override {
    Cluster* cluster = state_->cluster;
    if (reader_ == nullptr) {
      std::string notice;
      absl::StatusOr<int> attempt = cluster->LogAttempt(request_, &notice);
      if (!attempt.ok()) {
        step->finish = ToGrpcStatus(attempt.status());
        return;
      }
      if (!notice.empty()) {
        step->out.push_back(Notice(notice));
        step->finish = grpc::Status::OK;
        return;
      }
      if (*attempt == 0) return;  // following a job that has not started: wait for it
      attempt_ = *attempt;
      reader_ = cluster->ReadLogs(request_.job_id(), attempt_, process_, request_.tail_lines());
    }
    absl::StatusOr<bool> more = reader_->Read(&step->out);
    if (!more.ok()) {
      step->finish = ToGrpcStatus(more.status());
      return;
    }
    if (*more) {
      step->more = true;
      return;
    }
    if (!request_.follow()) {
      step->finish = grpc::Status::OK;
      return;
    }
    absl::StatusOr<LogFollow> follow =
        cluster->FollowLogs(request_.job_id(), attempt_, process_, *reader_, &give_up_);
    if (!follow.ok()) {
      step->finish = ToGrpcStatus(follow.status());
      return;
    }
    for (const std::string& text : follow->notices) step->out.push_back(Notice(text));
    if (follow->done) step->finish = grpc::Status::OK;
    step->recheck = follow->recheck;
  }

  const v1::ReadLogsRequest request_;
  const int process_;
  int attempt_ = 0;
  std::unique_ptr<LogReader> reader_;
  absl::Time give_up_ = absl::InfiniteFuture();
};

}  // namespace

grpc::ServerWriteReactor<v1::WatchAssignmentsResponse>* StartAssignmentStream(
    ServerState* state, const v1::WatchAssignmentsRequest& request) {
  auto* stream = new AssignmentStream(state, request);
  stream->Begin({ChangeFeed::WorkerTopic(request.worker_id())});
  return stream;
}

grpc::ServerWriteReactor<v1::WatchJobResponse>* StartJobStream(
    ServerState* state, const v1::WatchJobRequest& request, const Caller& caller) {
  auto* stream = new JobStream(state, request, caller);
  stream->Begin({ChangeFeed::JobTopic(request.job_id())});
  return stream;
}

grpc::ServerWriteReactor<v1::ReadLogsResponse>* StartLogStream(
    ServerState* state, const v1::ReadLogsRequest& request) {
  auto* stream = new LogStream(state, request);
  // The job (it starts, ends, restarts) and its stored logs.
  stream->Begin({ChangeFeed::JobTopic(request.job_id()), ChangeFeed::LogsTopic(request.job_id())});
  return stream;
}

}  // namespace substrax::server_internal
