#include "coordinator/state_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "coordinator/state_dir.h"
#include "core/status.h"

namespace substrax {

// ---------------------------------------------------------------------------------------------
// One-record commits

absl::Status StateStore::PutWorker(const v1::Worker& worker) {
  StateBatch batch;
  batch.workers.push_back(worker);
  return Commit(batch);
}

absl::Status StateStore::PutJob(const v1::Job& job) {
  StateBatch batch;
  batch.jobs.push_back(job);
  return Commit(batch);
}

absl::Status StateStore::AppendReports(const std::vector<v1::StepReport>& reports) {
  StateBatch batch;
  batch.reports = reports;
  return Commit(batch);
}

// ---------------------------------------------------------------------------------------------
// InMemoryStateStore

namespace {

// Replaces the element with the same key, or appends: the first Put fixes the position.
template <typename T, typename KeyFn>
void Upsert(std::vector<T>& items, const T& item, KeyFn key) {
  for (T& existing : items) {
    if (key(existing) == key(item)) {
      existing = item;
      return;
    }
  }
  items.push_back(item);
}

bool SameLog(const LogChunk& a, const LogChunk& b) {
  return a.job_id == b.job_id && a.attempt == b.attempt && a.process_index == b.process_index;
}

bool Pruned(const v1::StepReport& r, const StateBatch::Prune& p) {
  return r.job_id() == p.job_id && r.attempt() == p.attempt && r.step() < p.before_step &&
         (p.keep_every <= 1 || r.step() % p.keep_every != 0);
}

}  // namespace

absl::Status InMemoryStateStore::Commit(const StateBatch& batch) {
  absl::MutexLock lock(&mu_);
  if (fail_commits_ > 0) {
    --fail_commits_;
    return absl::UnavailableError("state store (in memory): a failure the test asked for");
  }
  for (const LogChunk& chunk : batch.log_chunks) {
    logs_.push_back(chunk);
    if (chunk.max_bytes <= 0) continue;
    // The newest chunks that fit in max_bytes stay (the newest always).
    int64_t newer = 0;
    std::vector<bool> keep(logs_.size(), true);
    for (size_t i = logs_.size(); i-- > 0;) {
      if (!SameLog(logs_[i], chunk)) continue;
      newer += static_cast<int64_t>(logs_[i].data.size());
      keep[i] = newer <= chunk.max_bytes || i + 1 == logs_.size();
    }
    size_t out = 0;
    for (size_t i = 0; i < logs_.size(); ++i) {
      if (!keep[i]) continue;
      if (out != i) logs_[out] = std::move(logs_[i]);
      ++out;
    }
    logs_.resize(out);
  }
  for (const v1::Worker& w : batch.workers) {
    Upsert(data_.workers, w, [](const v1::Worker& x) { return x.worker_id(); });
  }
  for (const v1::Job& j : batch.jobs) {
    Upsert(data_.jobs, j, [](const v1::Job& x) { return x.id(); });
  }
  data_.next_job_number = std::max(data_.next_job_number, batch.next_job_number);
  for (const std::string& id : batch.deleted_workers) {
    data_.workers.erase(std::remove_if(data_.workers.begin(), data_.workers.end(),
                                       [&](const v1::Worker& w) { return w.worker_id() == id; }),
                        data_.workers.end());
  }
  for (const std::string& id : batch.deleted_jobs) {
    data_.jobs.erase(std::remove_if(data_.jobs.begin(), data_.jobs.end(),
                                    [&](const v1::Job& j) { return j.id() == id; }),
                     data_.jobs.end());
    reports_.erase(std::remove_if(reports_.begin(), reports_.end(),
                                  [&](const v1::StepReport& r) { return r.job_id() == id; }),
                   reports_.end());
    logs_.erase(std::remove_if(logs_.begin(), logs_.end(),
                               [&](const LogChunk& c) { return c.job_id == id; }),
                logs_.end());
  }
  reports_.insert(reports_.end(), batch.reports.begin(), batch.reports.end());
  for (const StateBatch::Prune& p : batch.prunes) {
    reports_.erase(std::remove_if(reports_.begin(), reports_.end(),
                                  [&](const v1::StepReport& r) { return Pruned(r, p); }),
                   reports_.end());
  }
  return absl::OkStatus();
}

void InMemoryStateStore::FailNextCommits(int n) {
  absl::MutexLock lock(&mu_);
  fail_commits_ = n;
}

absl::StatusOr<StateStore::Snapshot> InMemoryStateStore::Load() {
  absl::MutexLock lock(&mu_);
  return data_;
}

absl::StatusOr<std::vector<int>> InMemoryStateStore::ReportedAttempts(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  std::set<int> attempts;
  for (const v1::StepReport& r : reports_) {
    if (r.job_id() == job_id) attempts.insert(r.attempt());
  }
  return std::vector<int>(attempts.begin(), attempts.end());
}

absl::StatusOr<std::vector<v1::StepReport>> InMemoryStateStore::ReadReports(
    const std::string& job_id, int attempt) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::StepReport> out;
  for (const v1::StepReport& r : reports_) {
    if (r.job_id() == job_id && r.attempt() == attempt) out.push_back(r);
  }
  return out;
}

absl::StatusOr<std::vector<v1::StepReport>> InMemoryStateStore::LatestReports(
    const std::string& job_id, int attempt, int steps) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<v1::StepReport> all, ReadReports(job_id, attempt));
  std::set<int64_t> distinct;
  for (const v1::StepReport& r : all) distinct.insert(r.step());
  while (static_cast<int>(distinct.size()) > steps) distinct.erase(distinct.begin());
  std::vector<v1::StepReport> out;
  for (v1::StepReport& r : all) {
    if (distinct.count(r.step()) > 0) out.push_back(std::move(r));
  }
  return out;
}

absl::StatusOr<int64_t> InMemoryStateStore::CountReports() {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(reports_.size());
}

absl::StatusOr<std::vector<LogExtent>> InMemoryStateStore::LogExtents(const std::string& job_id,
                                                                      int attempt) {
  absl::MutexLock lock(&mu_);
  std::map<int, LogExtent> extents;
  for (const LogChunk& c : logs_) {
    if (c.job_id != job_id || c.attempt != attempt) continue;
    auto [it, first] = extents.try_emplace(c.process_index);
    LogExtent& e = it->second;
    const int64_t end = c.offset + static_cast<int64_t>(c.data.size());
    if (first || c.offset < e.begin) e.begin = c.offset;
    if (first || end >= e.end) {
      e.end = end;
      e.host = c.host;
      e.eof = c.eof;
    }
    e.process_index = c.process_index;
  }
  std::vector<LogExtent> out;
  for (auto& [p, e] : extents) out.push_back(std::move(e));
  return out;
}

absl::StatusOr<std::vector<LogChunk>> InMemoryStateStore::ReadLogChunks(
    const std::string& job_id, int attempt, int process_index, int64_t from, int64_t max_bytes) {
  absl::MutexLock lock(&mu_);
  std::vector<const LogChunk*> matching;
  for (const LogChunk& c : logs_) {
    if (c.job_id == job_id && c.attempt == attempt && c.process_index == process_index &&
        (c.offset + static_cast<int64_t>(c.data.size()) > from || c.offset >= from)) {
      matching.push_back(&c);
    }
  }
  std::sort(matching.begin(), matching.end(),
            [](const LogChunk* a, const LogChunk* b) { return a->offset < b->offset; });
  std::vector<LogChunk> out;
  int64_t bytes = 0;
  for (const LogChunk* c : matching) {
    if (bytes >= max_bytes) break;
    out.push_back(*c);
    bytes += static_cast<int64_t>(c->data.size());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// SqliteStateStore

namespace {

// 1: workers, jobs, step_reports. 2: log_chunks. 3: meta (the job counter). A file of an older
// version gets the tables it lacks (CREATE ... IF NOT EXISTS) and the new version number.
constexpr int kSchemaVersion = 3;

// The upserts keep the rowid of the first insert, so ORDER BY rowid is the order of first Put.
constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS workers (worker_id TEXT PRIMARY KEY, proto BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (job_id TEXT PRIMARY KEY, proto BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS step_reports (
  seq INTEGER PRIMARY KEY,
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  step INTEGER NOT NULL,
  device_id INTEGER NOT NULL,
  proto BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS step_reports_by_job ON step_reports (job_id, attempt, step);
CREATE TABLE IF NOT EXISTS log_chunks (
  job_id TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  process_index INTEGER NOT NULL,
  offset INTEGER NOT NULL,
  host TEXT NOT NULL,
  data BLOB NOT NULL,
  eof INTEGER NOT NULL,
  PRIMARY KEY (job_id, attempt, process_index, offset));
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
)sql";

// The job counter only grows: concurrent submits commit theirs in any order.
constexpr char kPutJobCounter[] =
    "INSERT INTO meta (key, value) VALUES ('next_job_number', ?1) "
    "ON CONFLICT (key) DO UPDATE SET value = MAX(value, excluded.value)";
constexpr char kGetJobCounter[] = "SELECT value FROM meta WHERE key = 'next_job_number'";
constexpr char kDeleteWorker[] = "DELETE FROM workers WHERE worker_id = ?1";

constexpr char kPutWorker[] =
    "INSERT INTO workers (worker_id, proto) VALUES (?1, ?2) "
    "ON CONFLICT (worker_id) DO UPDATE SET proto = excluded.proto";
constexpr char kPutJob[] =
    "INSERT INTO jobs (job_id, proto) VALUES (?1, ?2) "
    "ON CONFLICT (job_id) DO UPDATE SET proto = excluded.proto";
constexpr char kAppendReport[] =
    "INSERT INTO step_reports (job_id, attempt, step, device_id, proto) "
    "VALUES (?1, ?2, ?3, ?4, ?5)";
constexpr char kDeleteJob[] = "DELETE FROM jobs WHERE job_id = ?1";
constexpr char kDeleteJobReports[] = "DELETE FROM step_reports WHERE job_id = ?1";
constexpr char kDeleteJobLogs[] = "DELETE FROM log_chunks WHERE job_id = ?1";
// A retried chunk at an offset already stored replaces it (the same bytes).
constexpr char kAppendLog[] =
    "INSERT OR REPLACE INTO log_chunks (job_id, attempt, process_index, offset, host, data, eof) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
// Deletes the oldest chunks of a process until the rest take at most ?4 bytes; the newest stays.
constexpr char kBoundLog[] =
    "DELETE FROM log_chunks WHERE rowid IN (SELECT rowid FROM (SELECT rowid, offset, "
    "SUM(length(data)) OVER (ORDER BY offset DESC) AS newer, "
    "MAX(offset) OVER () AS newest FROM log_chunks "
    "WHERE job_id = ?1 AND attempt = ?2 AND process_index = ?3) "
    "WHERE newer > ?4 AND offset < newest)";
constexpr char kLogExtents[] =
    "SELECT process_index, MIN(offset), MAX(offset + length(data)) FROM log_chunks "
    "WHERE job_id = ?1 AND attempt = ?2 GROUP BY process_index ORDER BY process_index";
constexpr char kLastLogChunk[] =
    "SELECT host, eof FROM log_chunks WHERE job_id = ?1 AND attempt = ?2 AND process_index = ?3 "
    "ORDER BY offset DESC LIMIT 1";
constexpr char kReadLog[] =
    "SELECT offset, host, data, eof FROM log_chunks WHERE job_id = ?1 AND attempt = ?2 AND "
    "process_index = ?3 AND (offset + length(data) > ?4 OR offset >= ?4) ORDER BY offset";
constexpr char kPrune[] =
    "DELETE FROM step_reports WHERE job_id = ?1 AND attempt = ?2 AND step < ?3 "
    "AND (?4 <= 1 OR step % ?4 != 0)";
constexpr char kReportedAttempts[] =
    "SELECT DISTINCT attempt FROM step_reports WHERE job_id = ?1 ORDER BY attempt";
constexpr char kReadReports[] =
    "SELECT proto FROM step_reports WHERE job_id = ?1 AND attempt = ?2 ORDER BY seq";
constexpr char kLatestReports[] =
    "SELECT proto FROM step_reports WHERE job_id = ?1 AND attempt = ?2 AND step >= "
    "(SELECT MIN(step) FROM (SELECT DISTINCT step FROM step_reports "
    "WHERE job_id = ?1 AND attempt = ?2 ORDER BY step DESC LIMIT ?3)) ORDER BY seq";

// A prepared statement, finalized when it goes out of scope.
class Statement {
 public:
  Statement() = default;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement() { sqlite3_finalize(stmt_); }

  int Prepare(sqlite3* db, const char* sql) {
    return sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  sqlite3_stmt* get() const { return stmt_; }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

// Binds a serialized message; SQLITE_TRANSIENT makes SQLite copy the bytes.
int BindBlob(sqlite3_stmt* stmt, int index, const std::string& bytes) {
  return sqlite3_bind_blob(stmt, index, bytes.data(), static_cast<int>(bytes.size()),
                           SQLITE_TRANSIENT);
}

// Reads every row of `sql` (one BLOB column) into `out`. Returns the SQLite code of the first
// failure (SQLITE_DONE when all went well), or -1 when a blob does not parse.
template <typename T>
int ReadAll(sqlite3* db, const char* sql, std::vector<T>* out) {
  Statement stmt;
  int rc = stmt.Prepare(db, sql);
  if (rc != SQLITE_OK) return rc;
  while ((rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    T message;
    const void* data = sqlite3_column_blob(stmt.get(), 0);
    const int size = sqlite3_column_bytes(stmt.get(), 0);
    if (!message.ParseFromArray(data, size)) return -1;
    out->push_back(std::move(message));
  }
  return rc;
}

}  // namespace

namespace {

int BindText(sqlite3_stmt* stmt, int index, const std::string& text) {
  return sqlite3_bind_text(stmt, index, text.data(), static_cast<int>(text.size()),
                           SQLITE_TRANSIENT);
}

// Runs a prepared statement to completion; SQLITE_OK when it is done.
int StepToDone(sqlite3_stmt* stmt) {
  int rc = sqlite3_step(stmt);
  if (rc == SQLITE_DONE || rc == SQLITE_ROW) rc = SQLITE_OK;
  sqlite3_reset(stmt);
  return rc;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SqliteStateStore>> SqliteStateStore::Open(
    const std::string& directory) {
  const std::string path = (std::filesystem::path(directory) / "substrax.db").string();
  SUBSTRAX_RETURN_IF_ERROR(MakePrivateDirectory(directory, "state store"));
  // SQLite creates files 0644 and gives the -wal and -shm files the database's mode: the
  // database is created (or narrowed) to 0600 first, and so are the other two if they exist.
  for (const char* suffix : {"", "-wal", "-shm"}) {
    SUBSTRAX_RETURN_IF_ERROR(
        MakePrivateFile(path + suffix, /*create=*/suffix[0] == '\0', "state store"));
  }
  // Our own mutexes serialize every use of each connection, so SQLite's are not needed.
  auto open = [&](int flags, sqlite3** db) -> absl::Status {
    const int rc = sqlite3_open_v2(path.c_str(), db, flags | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc == SQLITE_OK) {
      sqlite3_extended_result_codes(*db, 1);
      // A checkpoint may briefly lock the reader out; wait rather than fail a query.
      sqlite3_busy_timeout(*db, 5000);
      return absl::OkStatus();
    }
    absl::Status status = absl::UnavailableError(
        absl::StrCat("state store ", path, ": cannot open: ",
                     *db != nullptr ? sqlite3_errmsg(*db) : sqlite3_errstr(rc),
                     "; check --state-dir and its permissions"));
    sqlite3_close(*db);
    *db = nullptr;
    return status;
  };
  sqlite3* db = nullptr;
  SUBSTRAX_RETURN_IF_ERROR(open(SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, &db));
  std::unique_ptr<SqliteStateStore> store(new SqliteStateStore(path, db));
  {
    absl::MutexLock lock(&store->mu_);
    // journal_mode answers with a row, so it goes through Exec like the rest (rows ignored).
    SUBSTRAX_RETURN_IF_ERROR(store->ExecLocked("PRAGMA journal_mode = WAL"));
    SUBSTRAX_RETURN_IF_ERROR(store->ExecLocked("PRAGMA synchronous = FULL"));
    SUBSTRAX_RETURN_IF_ERROR(store->ExecLocked(kSchema));

    Statement version;
    int vrc = version.Prepare(db, "PRAGMA user_version");
    if (vrc == SQLITE_OK) vrc = sqlite3_step(version.get());
    if (vrc != SQLITE_ROW) return store->Error(db, vrc, "reading the schema version");
    const int found = sqlite3_column_int(version.get(), 0);
    if (found > kSchemaVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("state store ", path, ": schema version ", found,
                       " was written by a newer substrax-coordinator (this one knows ",
                       kSchemaVersion, "); run the newer coordinator or use another --state-dir"));
    }
    SUBSTRAX_RETURN_IF_ERROR(
        store->ExecLocked(absl::StrCat("PRAGMA user_version = ", kSchemaVersion).c_str()));
  }
  // The reader opens once the schema exists.
  absl::MutexLock lock(&store->reader_mu_);
  SUBSTRAX_RETURN_IF_ERROR(open(SQLITE_OPEN_READONLY, &store->reader_));
  return store;
}

SqliteStateStore::~SqliteStateStore() {
  {
    absl::MutexLock lock(&mu_);
    sqlite3_close(db_);
  }
  absl::MutexLock lock(&reader_mu_);
  sqlite3_close(reader_);  // a no-op on nullptr
}

absl::Status SqliteStateStore::Error(sqlite3* db, int code, const std::string& what) const {
  const std::string message =
      absl::StrCat("state store ", path_, ": ", what, ": ",
                   db != nullptr ? sqlite3_errmsg(db) : "", " (", sqlite3_errstr(code), ")");
  // A damaged file will not heal by retrying; everything else (busy, I/O, full disk) may.
  switch (code & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(message);
    default:
      return absl::UnavailableError(message);
  }
}

absl::Status SqliteStateStore::ExecLocked(const char* sql) {
  char* error = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &error);
  if (rc == SQLITE_OK) return absl::OkStatus();
  absl::Status status = Error(db_, rc, sql);
  sqlite3_free(error);
  return status;
}

absl::Status SqliteStateStore::Commit(const StateBatch& batch) {
  if (batch.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  SUBSTRAX_RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
  absl::Status status = CommitLocked(batch);
  if (!status.ok()) {
    ExecLocked("ROLLBACK").IgnoreError();  // the error above is the one to report
    return status;
  }
  return ExecLocked("COMMIT");
}

absl::Status SqliteStateStore::CommitLocked(const StateBatch& batch) {
  Statement put_worker, put_job, delete_job, delete_reports, delete_logs, append, prune,
      append_log, bound_log, put_counter, delete_worker;
  int rc = SQLITE_OK;
  if (batch.next_job_number > 0) {
    rc = put_counter.Prepare(db_, kPutJobCounter);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(put_counter.get(), 1, batch.next_job_number);
    if (rc == SQLITE_OK) rc = StepToDone(put_counter.get());
    if (rc != SQLITE_OK) return Error(db_, rc, "writing the job counter");
  }
  for (const v1::Worker& w : batch.workers) {
    if (put_worker.get() == nullptr) rc = put_worker.Prepare(db_, kPutWorker);
    if (rc == SQLITE_OK) rc = BindText(put_worker.get(), 1, w.worker_id());
    if (rc == SQLITE_OK) rc = BindBlob(put_worker.get(), 2, w.SerializeAsString());
    if (rc == SQLITE_OK) rc = StepToDone(put_worker.get());
    if (rc != SQLITE_OK) return Error(db_, rc, absl::StrCat("writing worker ", w.worker_id()));
  }
  for (const v1::Job& j : batch.jobs) {
    if (put_job.get() == nullptr) rc = put_job.Prepare(db_, kPutJob);
    if (rc == SQLITE_OK) rc = BindText(put_job.get(), 1, j.id());
    if (rc == SQLITE_OK) rc = BindBlob(put_job.get(), 2, j.SerializeAsString());
    if (rc == SQLITE_OK) rc = StepToDone(put_job.get());
    if (rc != SQLITE_OK) return Error(db_, rc, absl::StrCat("writing job ", j.id()));
  }
  for (const LogChunk& c : batch.log_chunks) {
    if (append_log.get() == nullptr) {
      rc = append_log.Prepare(db_, kAppendLog);
      if (rc == SQLITE_OK) rc = bound_log.Prepare(db_, kBoundLog);
    }
    sqlite3_stmt* s = append_log.get();
    if (rc == SQLITE_OK) rc = BindText(s, 1, c.job_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 2, c.attempt);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 3, c.process_index);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 4, c.offset);
    if (rc == SQLITE_OK) rc = BindText(s, 5, c.host);
    if (rc == SQLITE_OK) rc = BindBlob(s, 6, c.data);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 7, c.eof ? 1 : 0);
    if (rc == SQLITE_OK) rc = StepToDone(s);
    if (rc == SQLITE_OK && c.max_bytes > 0) {
      sqlite3_stmt* b = bound_log.get();
      rc = BindText(b, 1, c.job_id);
      if (rc == SQLITE_OK) rc = sqlite3_bind_int(b, 2, c.attempt);
      if (rc == SQLITE_OK) rc = sqlite3_bind_int(b, 3, c.process_index);
      if (rc == SQLITE_OK) rc = sqlite3_bind_int64(b, 4, c.max_bytes);
      if (rc == SQLITE_OK) rc = StepToDone(b);
    }
    if (rc != SQLITE_OK) {
      return Error(db_, rc, absl::StrCat("appending the log of job ", c.job_id, " attempt ",
                                         c.attempt, " process ", c.process_index));
    }
  }
  for (const std::string& id : batch.deleted_jobs) {
    if (delete_job.get() == nullptr) {
      rc = delete_job.Prepare(db_, kDeleteJob);
      if (rc == SQLITE_OK) rc = delete_reports.Prepare(db_, kDeleteJobReports);
      if (rc == SQLITE_OK) rc = delete_logs.Prepare(db_, kDeleteJobLogs);
    }
    if (rc == SQLITE_OK) rc = BindText(delete_job.get(), 1, id);
    if (rc == SQLITE_OK) rc = StepToDone(delete_job.get());
    if (rc == SQLITE_OK) rc = BindText(delete_reports.get(), 1, id);
    if (rc == SQLITE_OK) rc = StepToDone(delete_reports.get());
    if (rc == SQLITE_OK) rc = BindText(delete_logs.get(), 1, id);
    if (rc == SQLITE_OK) rc = StepToDone(delete_logs.get());
    if (rc != SQLITE_OK) return Error(db_, rc, absl::StrCat("deleting job ", id));
  }
  for (const std::string& id : batch.deleted_workers) {
    if (delete_worker.get() == nullptr) rc = delete_worker.Prepare(db_, kDeleteWorker);
    if (rc == SQLITE_OK) rc = BindText(delete_worker.get(), 1, id);
    if (rc == SQLITE_OK) rc = StepToDone(delete_worker.get());
    if (rc != SQLITE_OK) return Error(db_, rc, absl::StrCat("deleting worker ", id));
  }
  for (const v1::StepReport& r : batch.reports) {
    if (append.get() == nullptr) rc = append.Prepare(db_, kAppendReport);
    sqlite3_stmt* s = append.get();
    if (rc == SQLITE_OK) rc = BindText(s, 1, r.job_id());
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 2, r.attempt());
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, r.step());
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 4, r.device_id());
    if (rc == SQLITE_OK) rc = BindBlob(s, 5, r.SerializeAsString());
    if (rc == SQLITE_OK) rc = StepToDone(s);
    if (rc != SQLITE_OK) return Error(db_, rc, "appending step reports");
  }
  for (const StateBatch::Prune& p : batch.prunes) {
    if (prune.get() == nullptr) rc = prune.Prepare(db_, kPrune);
    sqlite3_stmt* s = prune.get();
    if (rc == SQLITE_OK) rc = BindText(s, 1, p.job_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 2, p.attempt);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, p.before_step);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 4, p.keep_every);
    if (rc == SQLITE_OK) rc = StepToDone(s);
    if (rc != SQLITE_OK) {
      return Error(db_, rc, absl::StrCat("pruning the metric points of job ", p.job_id));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StateStore::Snapshot> SqliteStateStore::Load() {
  absl::MutexLock lock(&mu_);
  Snapshot snapshot;
  // One read transaction, so both tables are seen at the same instant.
  SUBSTRAX_RETURN_IF_ERROR(ExecLocked("BEGIN"));
  struct Table {
    const char* what;
    int rc;
  };
  const Table tables[] = {
      {"workers", ReadAll(db_, "SELECT proto FROM workers ORDER BY rowid", &snapshot.workers)},
      {"jobs", ReadAll(db_, "SELECT proto FROM jobs ORDER BY rowid", &snapshot.jobs)},
  };
  absl::Status status = absl::OkStatus();
  for (const Table& table : tables) {
    if (!status.ok() || table.rc == SQLITE_DONE) continue;
    status = table.rc == -1
                 ? absl::DataLossError(absl::StrCat("state store ", path_, ": a row of table ",
                                                    table.what,
                                                    " does not parse: the file is damaged"))
                 : Error(db_, table.rc, absl::StrCat("reading ", table.what));
  }
  if (status.ok()) {
    Statement counter;
    int rc = counter.Prepare(db_, kGetJobCounter);
    if (rc == SQLITE_OK) rc = sqlite3_step(counter.get());
    if (rc == SQLITE_ROW) {
      snapshot.next_job_number = sqlite3_column_int64(counter.get(), 0);
    } else if (rc != SQLITE_DONE) {
      status = Error(db_, rc, "reading the job counter");
    }
  }
  ExecLocked("COMMIT").IgnoreError();  // a read-only transaction has nothing to lose
  if (!status.ok()) return status;
  return snapshot;
}

absl::StatusOr<std::vector<v1::StepReport>> SqliteStateStore::ReadReportRows(
    const char* sql, const std::string& job_id, int attempt, int64_t n) {
  absl::MutexLock lock(&reader_mu_);
  Statement stmt;
  int rc = stmt.Prepare(reader_, sql);
  const int params = rc == SQLITE_OK ? sqlite3_bind_parameter_count(stmt.get()) : 0;
  if (rc == SQLITE_OK) rc = BindText(stmt.get(), 1, job_id);
  if (rc == SQLITE_OK && params >= 2) rc = sqlite3_bind_int(stmt.get(), 2, attempt);
  if (rc == SQLITE_OK && params >= 3) rc = sqlite3_bind_int64(stmt.get(), 3, n);
  std::vector<v1::StepReport> out;
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    v1::StepReport report;
    if (!report.ParseFromArray(sqlite3_column_blob(stmt.get(), 0),
                               sqlite3_column_bytes(stmt.get(), 0))) {
      return absl::DataLossError(absl::StrCat("state store ", path_, ": a metric point of job ",
                                              job_id, " does not parse: the file is damaged"));
    }
    out.push_back(std::move(report));
    rc = SQLITE_OK;
  }
  if (rc != SQLITE_DONE) {
    return Error(reader_, rc, absl::StrCat("reading the metric points of job ", job_id));
  }
  return out;
}

absl::StatusOr<std::vector<int>> SqliteStateStore::ReportedAttempts(const std::string& job_id) {
  absl::MutexLock lock(&reader_mu_);
  Statement stmt;
  int rc = stmt.Prepare(reader_, kReportedAttempts);
  if (rc == SQLITE_OK) rc = BindText(stmt.get(), 1, job_id);
  std::vector<int> attempts;
  while (rc == SQLITE_OK && (rc = sqlite3_step(stmt.get())) == SQLITE_ROW) {
    attempts.push_back(sqlite3_column_int(stmt.get(), 0));
    rc = SQLITE_OK;
  }
  if (rc != SQLITE_DONE) {
    return Error(reader_, rc, absl::StrCat("reading the attempts of job ", job_id));
  }
  return attempts;
}

absl::StatusOr<std::vector<v1::StepReport>> SqliteStateStore::ReadReports(
    const std::string& job_id, int attempt) {
  return ReadReportRows(kReadReports, job_id, attempt, 0);
}

absl::StatusOr<std::vector<v1::StepReport>> SqliteStateStore::LatestReports(
    const std::string& job_id, int attempt, int steps) {
  return ReadReportRows(kLatestReports, job_id, attempt, steps);
}

absl::StatusOr<int64_t> SqliteStateStore::CountReports() {
  absl::MutexLock lock(&reader_mu_);
  Statement stmt;
  int rc = stmt.Prepare(reader_, "SELECT COUNT(*) FROM step_reports");
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt.get());
  if (rc != SQLITE_ROW) return Error(reader_, rc, "counting metric points");
  return sqlite3_column_int64(stmt.get(), 0);
}

absl::StatusOr<std::vector<LogExtent>> SqliteStateStore::LogExtents(const std::string& job_id,
                                                                    int attempt) {
  absl::MutexLock lock(&reader_mu_);
  // One read transaction, so that the extents and the last chunks agree.
  Statement begin, commit;
  int rc = begin.Prepare(reader_, "BEGIN");
  if (rc == SQLITE_OK) rc = StepToDone(begin.get());
  Statement extents, last;
  if (rc == SQLITE_OK) rc = extents.Prepare(reader_, kLogExtents);
  if (rc == SQLITE_OK) rc = last.Prepare(reader_, kLastLogChunk);
  if (rc == SQLITE_OK) rc = BindText(extents.get(), 1, job_id);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(extents.get(), 2, attempt);
  std::vector<LogExtent> out;
  while (rc == SQLITE_OK && (rc = sqlite3_step(extents.get())) == SQLITE_ROW) {
    LogExtent e;
    e.process_index = sqlite3_column_int(extents.get(), 0);
    e.begin = sqlite3_column_int64(extents.get(), 1);
    e.end = sqlite3_column_int64(extents.get(), 2);
    rc = BindText(last.get(), 1, job_id);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(last.get(), 2, attempt);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(last.get(), 3, e.process_index);
    if (rc == SQLITE_OK && (rc = sqlite3_step(last.get())) == SQLITE_ROW) {
      const unsigned char* host = sqlite3_column_text(last.get(), 0);
      e.host.assign(reinterpret_cast<const char*>(host),
                    static_cast<size_t>(sqlite3_column_bytes(last.get(), 0)));
      e.eof = sqlite3_column_int(last.get(), 1) != 0;
      rc = SQLITE_OK;
    }
    sqlite3_reset(last.get());
    out.push_back(std::move(e));
  }
  if (commit.Prepare(reader_, "COMMIT") == SQLITE_OK) StepToDone(commit.get());
  if (rc != SQLITE_DONE) {
    return Error(reader_, rc, absl::StrCat("reading the logs of job ", job_id));
  }
  return out;
}

absl::StatusOr<std::vector<LogChunk>> SqliteStateStore::ReadLogChunks(
    const std::string& job_id, int attempt, int process_index, int64_t from, int64_t max_bytes) {
  absl::MutexLock lock(&reader_mu_);
  Statement stmt;
  int rc = stmt.Prepare(reader_, kReadLog);
  sqlite3_stmt* s = stmt.get();
  if (rc == SQLITE_OK) rc = BindText(s, 1, job_id);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 2, attempt);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 3, process_index);
  if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 4, from);
  std::vector<LogChunk> out;
  int64_t bytes = 0;
  while (rc == SQLITE_OK && bytes < max_bytes && (rc = sqlite3_step(s)) == SQLITE_ROW) {
    LogChunk c;
    c.job_id = job_id;
    c.attempt = attempt;
    c.process_index = process_index;
    c.offset = sqlite3_column_int64(s, 0);
    c.host.assign(reinterpret_cast<const char*>(sqlite3_column_text(s, 1)),
                  static_cast<size_t>(sqlite3_column_bytes(s, 1)));
    const void* data = sqlite3_column_blob(s, 2);  // NULL for an empty blob
    const int size = sqlite3_column_bytes(s, 2);
    if (size > 0) c.data.assign(static_cast<const char*>(data), static_cast<size_t>(size));
    c.eof = sqlite3_column_int(s, 3) != 0;
    bytes += static_cast<int64_t>(c.data.size());
    out.push_back(std::move(c));
    rc = SQLITE_OK;
  }
  if (rc != SQLITE_DONE && rc != SQLITE_OK) {
    return Error(reader_, rc, absl::StrCat("reading the log of job ", job_id, " attempt ",
                                           attempt, " process ", process_index));
  }
  return out;
}

}  // namespace substrax
