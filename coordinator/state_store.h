// StateStore: where the coordinator keeps what it has acknowledged (workers, jobs with their
// transitions, metric points), so that a restarted coordinator loses none of it.
//
// Cluster writes through this interface (from its StateWriter thread, never under its lock)
// before it answers OK: acknowledged means persisted. Two implementations: InMemoryStateStore
// for unit tests, SqliteStateStore in production. Both are thread-safe.
#ifndef SUBSTRAX_COORDINATOR_STATE_STORE_H_
#define SUBSTRAX_COORDINATOR_STATE_STORE_H_

#include <cstdint>
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

// A piece of one process's log (its stdout and stderr) as a worker shipped it: the bytes at
// `offset` of the log of process `process_index` of (job_id, attempt).
struct LogChunk {
  std::string job_id;
  int attempt = 0;
  int process_index = 0;
  int64_t offset = 0;
  std::string host;
  std::string data;
  // The process has exited: `data` ends its log.
  bool eof = false;
  // Retention: once stored, the oldest chunks of this process are deleted until the rest take
  // at most this many bytes (0: no bound). The newest chunk always stays.
  int64_t max_bytes = 0;
};

// What is stored of one process's log.
struct LogExtent {
  int process_index = 0;
  std::string host;
  // The stored bytes are [begin, end): begin > 0 when the oldest were dropped (retention).
  int64_t begin = 0;
  int64_t end = 0;
  // Its last chunk came with eof.
  bool eof = false;
};

// What one commit writes, all or nothing.
struct StateBatch {
  // Upserts by worker_id / job id: the whole record.
  std::vector<v1::Worker> workers;
  std::vector<v1::Job> jobs;
  // Jobs deleted with their metric points.
  std::vector<std::string> deleted_jobs;
  // Workers deleted (dead past their retention).
  std::vector<std::string> deleted_workers;
  // When positive, the stored job counter becomes at least this (it never goes down): a
  // restarted coordinator numbers new jobs from it, so an id is never handed out twice, not
  // even after its job was deleted.
  int64_t next_job_number = 0;
  // Metric points appended.
  std::vector<v1::StepReport> reports;
  // Metric retention: the points of (job_id, attempt) at steps before `before_step` are
  // deleted, except those at steps that are multiples of `keep_every` (the downsampled history).
  struct Prune {
    std::string job_id;
    int attempt = 0;
    int64_t before_step = 0;
    int64_t keep_every = 1;
  };
  std::vector<Prune> prunes;
  // Log chunks appended (each then bounded by its max_bytes). Written before the deletions, so
  // that a job deleted in the same batch takes them along.
  std::vector<LogChunk> log_chunks;

  bool empty() const {
    return workers.empty() && jobs.empty() && deleted_jobs.empty() && deleted_workers.empty() &&
           reports.empty() && prunes.empty() && log_chunks.empty() && next_job_number <= 0;
  }
};

class StateStore {
 public:
  virtual ~StateStore() = default;

  // Writes the batch in one transaction: upserts, the job counter and log chunks first, then
  // deletions (a job's log chunks go with it), reports and prunes. A
  // job keeps the position of its first upsert in Load's order. Errors: UNAVAILABLE (the write
  // failed, nothing of it is stored; the same batch may be committed again), DATA_LOSS.
  virtual absl::Status Commit(const StateBatch& batch) = 0;

  // One-record commits, for tests and tools.
  absl::Status PutWorker(const v1::Worker& worker);
  absl::Status PutJob(const v1::Job& job);
  absl::Status AppendReports(const std::vector<v1::StepReport>& reports);

  // What the coordinator holds in memory: workers and jobs. Metric points stay on disk and are
  // read by the queries below.
  struct Snapshot {
    // In order of first Put.
    std::vector<v1::Worker> workers;
    // In submission order (first Put).
    std::vector<v1::Job> jobs;
    // The highest StateBatch::next_job_number committed; 0 when none was.
    int64_t next_job_number = 0;
  };
  // Errors: UNAVAILABLE (read failed), DATA_LOSS (a stored record does not parse: the file is
  // damaged).
  virtual absl::StatusOr<Snapshot> Load() = 0;

  // The attempts of the job that have metric points, ascending. Errors: as Load.
  virtual absl::StatusOr<std::vector<int>> ReportedAttempts(const std::string& job_id) = 0;
  // Every stored point of (job, attempt), in arrival order. Errors: as Load.
  virtual absl::StatusOr<std::vector<v1::StepReport>> ReadReports(const std::string& job_id,
                                                                  int attempt) = 0;
  // The points of (job, attempt) at its `steps` highest steps, in arrival order. Errors: as
  // Load.
  virtual absl::StatusOr<std::vector<v1::StepReport>> LatestReports(const std::string& job_id,
                                                                    int attempt, int steps) = 0;
  // How many metric points are stored (all jobs). Errors: as Load.
  virtual absl::StatusOr<int64_t> CountReports() = 0;

  // What is stored of each process's log of (job, attempt), by process index. Errors: as Load.
  virtual absl::StatusOr<std::vector<LogExtent>> LogExtents(const std::string& job_id,
                                                            int attempt) = 0;
  // The stored chunks of one process's log that end after `from` or start at or after it (a
  // chunk that starts before `from` and ends after it is included whole), by offset, until
  // they hold at least `max_bytes` (the last one may pass it). Errors: as Load.
  virtual absl::StatusOr<std::vector<LogChunk>> ReadLogChunks(const std::string& job_id,
                                                              int attempt, int process_index,
                                                              int64_t from, int64_t max_bytes) = 0;
};

// Keeps everything in memory; for tests (a Cluster re-created on the same object sees what the
// previous one stored, as after a restart).
class InMemoryStateStore final : public StateStore {
 public:
  // Never fails, unless told to: the next `n` commits fail with UNAVAILABLE (tests of the
  // retry path).
  absl::Status Commit(const StateBatch& batch) override;
  void FailNextCommits(int n);
  absl::StatusOr<Snapshot> Load() override;
  absl::StatusOr<std::vector<int>> ReportedAttempts(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::StepReport>> ReadReports(const std::string& job_id,
                                                          int attempt) override;
  absl::StatusOr<std::vector<v1::StepReport>> LatestReports(const std::string& job_id,
                                                            int attempt, int steps) override;
  absl::StatusOr<int64_t> CountReports() override;
  absl::StatusOr<std::vector<LogExtent>> LogExtents(const std::string& job_id,
                                                    int attempt) override;
  absl::StatusOr<std::vector<LogChunk>> ReadLogChunks(const std::string& job_id, int attempt,
                                                      int process_index, int64_t from,
                                                      int64_t max_bytes) override;

 private:
  absl::Mutex mu_;
  Snapshot data_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StepReport> reports_ ABSL_GUARDED_BY(mu_);
  // In arrival order (offsets ascend per process).
  std::vector<LogChunk> logs_ ABSL_GUARDED_BY(mu_);
  int fail_commits_ ABSL_GUARDED_BY(mu_) = 0;
};

// One SQLite database, <directory>/substrax.db, in WAL mode.
//
// Privacy: the database holds every job's spec (its env included); it is created 0600, and
// SQLite gives its -wal and -shm files the database's mode. Open also narrows an existing
// database (and its -wal, -shm) to 0600, and the directory to 0700.
//
// Durability: synchronous=FULL. In WAL mode NORMAL is safe against a crash of the coordinator
// process but may lose the last commits on a power loss or kernel crash (the WAL is not synced
// at each commit). The coordinator promises that every acknowledged job, transition and metric
// point survives a restart of its machine too; its writer commits everything queued in one
// transaction (group commit), so one fsync serves every rpc that waited for it.
//
// Layout: workers and jobs as serialized protos keyed by id (a job is rewritten whole on each
// change); metric points as one row per StepReport (serialized, with job_id, attempt, step and
// device_id as indexed columns for the queries and for retention); log chunks as one row each,
// keyed by (job_id, attempt, process_index, offset), the bytes as a BLOB.
class SqliteStateStore final : public StateStore {
 public:
  // Opens <directory>/substrax.db, creating the directory (0700) and the database (0600) when
  // missing. Errors: UNAVAILABLE with the path and SQLite's (or the file system's) message;
  // FAILED_PRECONDITION when the file was written by a newer schema.
  static absl::StatusOr<std::unique_ptr<SqliteStateStore>> Open(const std::string& directory);
  ~SqliteStateStore() override;

  absl::Status Commit(const StateBatch& batch) override;
  absl::StatusOr<Snapshot> Load() override;
  absl::StatusOr<std::vector<int>> ReportedAttempts(const std::string& job_id) override;
  absl::StatusOr<std::vector<v1::StepReport>> ReadReports(const std::string& job_id,
                                                          int attempt) override;
  absl::StatusOr<std::vector<v1::StepReport>> LatestReports(const std::string& job_id,
                                                            int attempt, int steps) override;
  absl::StatusOr<int64_t> CountReports() override;
  absl::StatusOr<std::vector<LogExtent>> LogExtents(const std::string& job_id,
                                                    int attempt) override;
  absl::StatusOr<std::vector<LogChunk>> ReadLogChunks(const std::string& job_id, int attempt,
                                                      int process_index, int64_t from,
                                                      int64_t max_bytes) override;

  const std::string& path() const { return path_; }

 private:
  SqliteStateStore(std::string path, sqlite3* db) : path_(std::move(path)), db_(db) {}

  // Runs SQL without results. Errors: as Open.
  absl::Status ExecLocked(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CommitLocked(const StateBatch& batch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The error of the last SQLite call on `db`, as a Status with the path and what was being
  // done.
  absl::Status Error(sqlite3* db, int code, const std::string& what) const;
  // Rows of `sql` (one BLOB column) on the reader connection, with (job_id, attempt, n) bound
  // as ?1, ?2, ?3 (unused ones ignored).
  absl::StatusOr<std::vector<v1::StepReport>> ReadReportRows(const char* sql,
                                                             const std::string& job_id,
                                                             int attempt, int64_t n);

  const std::string path_;
  // The writer connection: Commit and Load.
  absl::Mutex mu_;
  sqlite3* const db_ ABSL_PT_GUARDED_BY(mu_);
  // A second, read-only connection for the metric queries: in WAL mode they read a consistent
  // snapshot while a commit is being written, and never wait for it.
  absl::Mutex reader_mu_;
  sqlite3* reader_ ABSL_GUARDED_BY(reader_mu_) = nullptr;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_STATE_STORE_H_
