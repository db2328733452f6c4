#include "coordinator/state_store.h"

#include <sqlite3.h>

#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace substrax {

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

}  // namespace

absl::Status InMemoryStateStore::PutWorker(const v1::Worker& worker) {
  absl::MutexLock lock(&mu_);
  Upsert(data_.workers, worker, [](const v1::Worker& w) { return w.worker_id(); });
  return absl::OkStatus();
}

absl::Status InMemoryStateStore::PutJob(const v1::Job& job) {
  absl::MutexLock lock(&mu_);
  Upsert(data_.jobs, job, [](const v1::Job& j) { return j.id(); });
  return absl::OkStatus();
}

absl::Status InMemoryStateStore::AppendReports(const std::vector<v1::StepReport>& reports) {
  absl::MutexLock lock(&mu_);
  data_.reports.insert(data_.reports.end(), reports.begin(), reports.end());
  return absl::OkStatus();
}

absl::StatusOr<StateStore::Snapshot> InMemoryStateStore::Load() {
  absl::MutexLock lock(&mu_);
  return data_;
}

// ---------------------------------------------------------------------------------------------
// SqliteStateStore

namespace {

constexpr int kSchemaVersion = 1;

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
)sql";

constexpr char kPutWorker[] =
    "INSERT INTO workers (worker_id, proto) VALUES (?1, ?2) "
    "ON CONFLICT (worker_id) DO UPDATE SET proto = excluded.proto";
constexpr char kPutJob[] =
    "INSERT INTO jobs (job_id, proto) VALUES (?1, ?2) "
    "ON CONFLICT (job_id) DO UPDATE SET proto = excluded.proto";
constexpr char kAppendReport[] =
    "INSERT INTO step_reports (job_id, attempt, step, device_id, proto) "
    "VALUES (?1, ?2, ?3, ?4, ?5)";

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

absl::StatusOr<std::unique_ptr<SqliteStateStore>> SqliteStateStore::Open(
    const std::string& directory) {
  const std::string path = (std::filesystem::path(directory) / "substrax.db").string();
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("state store ", path, ": cannot create directory ",
                                               directory, ": ", ec.message(),
                                               "; check --state-dir and its permissions"));
  }
  sqlite3* db = nullptr;
  // Our own mutex serializes every use of the connection, so SQLite's is not needed.
  const int rc = sqlite3_open_v2(path.c_str(), &db,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat("state store ", path, ": cannot open: ",
                     db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc),
                     "; check --state-dir and its permissions"));
    sqlite3_close(db);
    return status;
  }
  std::unique_ptr<SqliteStateStore> store(new SqliteStateStore(path, db));
  {
    absl::MutexLock lock(&store->mu_);
    sqlite3_extended_result_codes(db, 1);
    // journal_mode answers with a row, so it goes through Exec like the rest (rows ignored).
    SUBSTRAX_RETURN_IF_ERROR(store->ExecLocked("PRAGMA journal_mode = WAL"));
    SUBSTRAX_RETURN_IF_ERROR(store->ExecLocked("PRAGMA synchronous = FULL"));
    SUBSTRAX_RETURN_IF_ERROR(store->ExecLocked(kSchema));

    Statement version;
    int vrc = version.Prepare(db, "PRAGMA user_version");
    if (vrc == SQLITE_OK) vrc = sqlite3_step(version.get());
    if (vrc != SQLITE_ROW) return store->ErrorLocked(vrc, "reading the schema version");
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
  return store;
}

SqliteStateStore::~SqliteStateStore() {
  absl::MutexLock lock(&mu_);
  sqlite3_close(db_);
}

absl::Status SqliteStateStore::ErrorLocked(int code, const char* what) {
  const std::string message =
      absl::StrCat("state store ", path_, ": ", what, ": ", sqlite3_errmsg(db_), " (",
                   sqlite3_errstr(code), ")");
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
  absl::Status status = ErrorLocked(rc, sql);
  sqlite3_free(error);
  return status;
}

absl::Status SqliteStateStore::PutBlobLocked(const char* sql, const std::string& key,
                                             const google::protobuf::MessageLite& message,
                                             const char* what) {
  Statement stmt;
  int rc = stmt.Prepare(db_, sql);
  const std::string bytes = message.SerializeAsString();
  if (rc == SQLITE_OK) {
    rc = sqlite3_bind_text(stmt.get(), 1, key.data(), static_cast<int>(key.size()),
                           SQLITE_TRANSIENT);
  }
  if (rc == SQLITE_OK) rc = BindBlob(stmt.get(), 2, bytes);
  if (rc == SQLITE_OK) rc = sqlite3_step(stmt.get());
  if (rc != SQLITE_DONE) return ErrorLocked(rc, what);
  return absl::OkStatus();
}

absl::Status SqliteStateStore::PutWorker(const v1::Worker& worker) {
  absl::MutexLock lock(&mu_);
  return Annotate(PutBlobLocked(kPutWorker, worker.worker_id(), worker, "writing a worker"),
                  absl::StrCat("worker ", worker.worker_id()));
}

absl::Status SqliteStateStore::PutJob(const v1::Job& job) {
  absl::MutexLock lock(&mu_);
  return Annotate(PutBlobLocked(kPutJob, job.id(), job, "writing a job"),
                  absl::StrCat("job ", job.id()));
}

absl::Status SqliteStateStore::AppendReports(const std::vector<v1::StepReport>& reports) {
  if (reports.empty()) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  SUBSTRAX_RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
  Statement stmt;
  int rc = stmt.Prepare(db_, kAppendReport);
  for (size_t i = 0; i < reports.size() && rc == SQLITE_OK; ++i) {
    const v1::StepReport& r = reports[i];
    const std::string bytes = r.SerializeAsString();
    sqlite3_stmt* s = stmt.get();
    sqlite3_reset(s);
    rc = sqlite3_bind_text(s, 1, r.job_id().data(), static_cast<int>(r.job_id().size()),
                           SQLITE_TRANSIENT);
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 2, r.attempt());
    if (rc == SQLITE_OK) rc = sqlite3_bind_int64(s, 3, r.step());
    if (rc == SQLITE_OK) rc = sqlite3_bind_int(s, 4, r.device_id());
    if (rc == SQLITE_OK) rc = BindBlob(s, 5, bytes);
    if (rc == SQLITE_OK) rc = sqlite3_step(s);
    if (rc == SQLITE_DONE) rc = SQLITE_OK;
  }
  if (rc != SQLITE_OK) {
    absl::Status status = ErrorLocked(rc, "appending step reports");
    ExecLocked("ROLLBACK").IgnoreError();  // the error above is the one to report
    return status;
  }
  return ExecLocked("COMMIT");
}

absl::StatusOr<StateStore::Snapshot> SqliteStateStore::Load() {
  absl::MutexLock lock(&mu_);
  Snapshot snapshot;
  // One read transaction, so the three tables are seen at the same instant.
  SUBSTRAX_RETURN_IF_ERROR(ExecLocked("BEGIN"));
  struct Table {
    const char* what;
    int rc;
  };
  const Table tables[] = {
      {"workers", ReadAll(db_, "SELECT proto FROM workers ORDER BY rowid", &snapshot.workers)},
      {"jobs", ReadAll(db_, "SELECT proto FROM jobs ORDER BY rowid", &snapshot.jobs)},
      {"step_reports", ReadAll(db_, "SELECT proto FROM step_reports ORDER BY seq",
                               &snapshot.reports)},
  };
  absl::Status status = absl::OkStatus();
  for (const Table& table : tables) {
    if (!status.ok() || table.rc == SQLITE_DONE) continue;
    status = table.rc == -1
                 ? absl::DataLossError(absl::StrCat("state store ", path_, ": a row of table ",
                                                    table.what,
                                                    " does not parse: the file is damaged"))
                 : ErrorLocked(table.rc, absl::StrCat("reading ", table.what).c_str());
  }
  ExecLocked("COMMIT").IgnoreError();  // a read-only transaction has nothing to lose
  if (!status.ok()) return status;
  return snapshot;
}

}  // namespace substrax
