// StateStore: where the coordinator keeps what it has acknowledged (workers, jobs with their
// transitions, metric points), so that a restarted coordinator loses none of it.
//
// Cluster writes through this interface before it answers OK: acknowledged means persisted.
// Two implementations: InMemoryStateStore for unit tests, SqliteStateStore in production.
// Both are thread-safe.
#ifndef SUBSTRAX_COORDINATOR_STATE_STORE_H_
#define SUBSTRAX_COORDINATOR_STATE_STORE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/message_lite.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/job_service.pb.h"
#include "substrax/v1/metrics.pb.h"

struct sqlite3;

namespace substrax {

class StateStore {
 public:
  virtual ~StateStore() = default;

  // Upserts by worker_id. Errors: UNAVAILABLE (the write failed; the same call may be retried).
  virtual absl::Status PutWorker(const v1::Worker& worker) = 0;
  // Upserts by id: the whole job, transitions included. A job keeps the position of its first
  // Put in Load's order. Errors: UNAVAILABLE.
  virtual absl::Status PutJob(const v1::Job& job) = 0;
  // Appends the reports in one transaction (all or none). Errors: UNAVAILABLE.
  virtual absl::Status AppendReports(const std::vector<v1::StepReport>& reports) = 0;

  struct Snapshot {
    // In order of first Put.
    std::vector<v1::Worker> workers;
    // In submission order (first Put).
    std::vector<v1::Job> jobs;
    // In arrival order.
    std::vector<v1::StepReport> reports;
  };
  // Everything stored. Errors: UNAVAILABLE (read failed), DATA_LOSS (a stored record does not
  // parse: the file is damaged).
  virtual absl::StatusOr<Snapshot> Load() = 0;
};

// Keeps everything in memory; for tests (a Cluster re-created on the same object sees what the
// previous one stored, as after a restart).
class InMemoryStateStore final : public StateStore {
 public:
  absl::Status PutWorker(const v1::Worker& worker) override;
  absl::Status PutJob(const v1::Job& job) override;
  absl::Status AppendReports(const std::vector<v1::StepReport>& reports) override;
  // Never fails.
  absl::StatusOr<Snapshot> Load() override;

 private:
  absl::Mutex mu_;
  Snapshot data_ ABSL_GUARDED_BY(mu_);
};

// One SQLite database, <directory>/substrax.db, in WAL mode.
//
// Durability: synchronous=FULL. In WAL mode NORMAL is safe against a crash of the coordinator
// process but may lose the last commits on a power loss or kernel crash (the WAL is not synced
// at each commit). The coordinator promises that every acknowledged job, transition and metric
// point survives a restart of its machine too, and its write rate (one transaction per rpc that
// changes state, report batches every report_every_steps steps) is far below what one fsync per
// commit allows, so FULL it is.
//
// Layout: workers and jobs as serialized protos keyed by id (a job is rewritten whole on each
// change); metric points as one row per StepReport (serialized, with job_id, attempt, step and
// device_id as columns so that later queries or retention can use them).
class SqliteStateStore final : public StateStore {
 public:
  // Opens <directory>/substrax.db, creating the directory and the database when missing.
  // Errors: UNAVAILABLE with the path and SQLite's (or the file system's) message;
  // FAILED_PRECONDITION when the file was written by a newer schema.
  static absl::StatusOr<std::unique_ptr<SqliteStateStore>> Open(const std::string& directory);
  ~SqliteStateStore() override;

  absl::Status PutWorker(const v1::Worker& worker) override;
  absl::Status PutJob(const v1::Job& job) override;
  absl::Status AppendReports(const std::vector<v1::StepReport>& reports) override;
  absl::StatusOr<Snapshot> Load() override;

  const std::string& path() const { return path_; }

 private:
  SqliteStateStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  // Runs SQL without results. Errors: as Open.
  absl::Status ExecLocked(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Upserts (key, serialized message) into `table` (workers or jobs).
  absl::Status PutBlobLocked(const char* sql, const std::string& key,
                             const google::protobuf::MessageLite& message, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of the last SQLite call, as a Status with the path and what was being done.
  absl::Status ErrorLocked(int code, const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_STATE_STORE_H_
