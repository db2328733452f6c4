// LogShipper: sends the output of the daemon's runners (each runner's stdout and stderr, which
// go to its `<work_dir>/<base>.log`) to the coordinator, which stores it for `substraxctl logs`
// (ShipLogs in coordinator_service.proto; docs/architecture.md says why logs are shipped rather
// than served by the daemons).
//
// One thread of its own: every `interval` (at once when a runner ends) it reads each log from
// the offset shipped so far and sends the new bytes in pieces of at most `max_chunk_bytes`,
// at most `max_chunks_per_round` pieces per log per round so that one chatty runner does not
// hold back the others. A log whose runner ended is shipped to its end, then with `eof`, and
// forgotten. Nothing here waits on the daemon's other loops, and they never wait on it (a
// reaper may wait for its own runner's log, bounded by a timeout: AwaitShipped).
//
// Errors and what happens:
//   - UNAVAILABLE, DEADLINE_EXCEEDED (the coordinator restarts, the network): the round stops
//     and the next one waits an exponential backoff with jitter, from `initial_backoff` up to
//     `max_backoff`; the offsets make a retry harmless (the coordinator ignores bytes it has).
//   - FAILED_PRECONDITION with "expected offset N" (a gap: the coordinator has less than we
//     thought, e.g. it lost queued bytes): shipping resumes from N.
//   - Anything else (NOT_FOUND: the job was deleted; PERMISSION_DENIED): the log is given up,
//     with a log line.
//   - A log file that cannot be read (deleted) is given up once its runner has ended.
//
// Memory: one piece (max_chunk_bytes) in flight, and a small record per log.
//
// Thread-safe.
#ifndef SUBSTRAX_AGENT_LOG_SHIPPER_H_
#define SUBSTRAX_AGENT_LOG_SHIPPER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "rpc/cancellable_call.h"

namespace substrax {

struct LogShipperOptions {
  // This worker and its host, sent with every piece.
  std::string worker_id;
  std::string host;
  // How often running runners' logs are looked at.
  absl::Duration interval = absl::Milliseconds(250);
  // The most bytes of one ShipLogs request (the coordinator's limit).
  size_t max_chunk_bytes = 64 * 1024;
  // Pieces per log per round.
  int max_chunks_per_round = 16;
  absl::Duration rpc_timeout = absl::Seconds(10);
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // Where the shipper's lines go (default: stderr, "substrax-agent: ...").
  std::function<void(const std::string&)> log;
};

// Where the pieces go. Ship is called from the shipper's thread only; Cancel from any thread.
class LogSink {
 public:
  virtual ~LogSink() = default;
  // Sends one piece; returns the offset the coordinator expects next, or its error (or the
  // transport's).
  virtual absl::StatusOr<int64_t> Ship(const v1::ShipLogsRequest& request,
                                       absl::Time deadline) = 0;
  // Makes a Ship in progress return soon (with any error), and every later one at once.
  virtual void Cancel() = 0;
};

// ShipLogs rpcs on a coordinator stub.
class GrpcLogSink : public LogSink {
 public:
  explicit GrpcLogSink(std::shared_ptr<v1::CoordinatorService::StubInterface> stub)
      : stub_(std::move(stub)) {}
  absl::StatusOr<int64_t> Ship(const v1::ShipLogsRequest& request, absl::Time deadline) override;
  void Cancel() override;

 private:
  const std::shared_ptr<v1::CoordinatorService::StubInterface> stub_;
  CancellableCall call_;
};

// The offset of "expected offset N" in a FAILED_PRECONDITION's message, or -1.
int64_t ExpectedOffset(const absl::Status& status);

class LogShipper {
 public:
  // `sink` must outlive the shipper.
  LogShipper(LogShipperOptions options, LogSink* sink);
  // Stops after the piece in flight (the sink is cancelled); what is not shipped stays unshipped.
  ~LogShipper();
  LogShipper(const LogShipper&) = delete;
  LogShipper& operator=(const LogShipper&) = delete;

  // A runner of (job, attempt, process) writes its output to `path`; shipping starts at offset 0.
  // A second Add of the same process is ignored.
  void Add(const std::string& job_id, int attempt, int process_index, const std::string& path);
  // Its runner has exited: the rest of the log is shipped at once, then its end.
  void Ended(const std::string& job_id, int attempt, int process_index);
  // Waits until the process's log is shipped to its end (or given up), at most `timeout`.
  // True when it is (also for a log never added).
  bool AwaitShipped(const std::string& job_id, int attempt, int process_index,
                    absl::Duration timeout);
  // The (job, attempt) of every log not yet shipped to its end: their files must stay.
  std::vector<std::pair<std::string, int>> Pending() const;

 private:
  using Key = std::tuple<std::string, int, int>;
  struct Entry {
    std::string path;
    int64_t offset = 0;
    bool ended = false;
  };
  enum class Outcome { kIdle, kMore, kRetry };

  void Loop();
  // Ships up to max_chunks_per_round pieces of one log; removes it when done or given up.
  Outcome ShipSome(const Key& key);
  void Forget(const Key& key, const std::string& why);
  void Log(const std::string& line) const;

  const LogShipperOptions options_;
  LogSink* const sink_;
  mutable absl::Mutex mu_;
  std::map<Key, Entry> logs_ ABSL_GUARDED_BY(mu_);
  // A runner ended: start a round now.
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_LOG_SHIPPER_H_
