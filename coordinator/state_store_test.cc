#include "coordinator/state_store.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <sqlite3.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

v1::Worker MakeWorker(const std::string& id, const std::string& host) {
  v1::Worker w;
  w.set_worker_id(id);
  w.set_host(host);
  w.set_incarnation("inc-1");
  w.set_state(v1::WORKER_STATE_ALIVE);
  v1::Device* d = w.add_devices();
  d->set_id(7);
  d->set_host(host);
  d->set_worker_id(id);
  return w;
}

v1::Job MakeJob(const std::string& id, v1::JobState state) {
  v1::Job job;
  job.set_id(id);
  job.set_state(state);
  job.mutable_spec()->set_name("demo");
  v1::JobTransition* t = job.add_transitions();
  t->set_to(state);
  t->set_reason("submitted");
  return job;
}

v1::StepReport MakeReport(const std::string& job, int64_t step, int device, double loss) {
  v1::StepReport r;
  r.set_job_id(job);
  r.set_attempt(1);
  r.set_step(step);
  r.set_device_id(device);
  r.set_host("h");
  (*r.mutable_values())["loss"] = loss;
  r.mutable_time()->set_seconds(100 + step);
  return r;
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

// Writes workers, jobs (one of them twice) and reports into `store`.
void Fill(StateStore& store) {
  ASSERT_TRUE(store.PutWorker(MakeWorker("w-1", "a")).ok());
  ASSERT_TRUE(store.PutWorker(MakeWorker("w-2", "b")).ok());
  ASSERT_TRUE(store.PutJob(MakeJob("demo-1", v1::JOB_STATE_PENDING)).ok());
  ASSERT_TRUE(store.PutJob(MakeJob("demo-2", v1::JOB_STATE_PENDING)).ok());
  // Upserts: the first job changes state, the first worker dies; both keep their position.
  ASSERT_TRUE(store.PutJob(MakeJob("demo-1", v1::JOB_STATE_RUNNING)).ok());
  v1::Worker dead = MakeWorker("w-1", "a");
  dead.set_state(v1::WORKER_STATE_DEAD);
  ASSERT_TRUE(store.PutWorker(dead).ok());
  ASSERT_TRUE(store.AppendReports({MakeReport("demo-1", 1, 0, 2.0), MakeReport("demo-1", 1, 1, 3.0)})
                  .ok());
  ASSERT_TRUE(store.AppendReports({}).ok());
  ASSERT_TRUE(store.AppendReports({MakeReport("demo-1", 2, 0, 1.5)}).ok());
}

void ExpectFilled(StateStore& store) {
  absl::StatusOr<StateStore::Snapshot> snapshot = store.Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  ASSERT_EQ(snapshot->workers.size(), 2u);
  EXPECT_EQ(snapshot->workers[0].worker_id(), "w-1");
  EXPECT_EQ(snapshot->workers[0].state(), v1::WORKER_STATE_DEAD);
  EXPECT_EQ(snapshot->workers[0].devices(0).id(), 7);
  EXPECT_EQ(snapshot->workers[1].worker_id(), "w-2");
  ASSERT_EQ(snapshot->jobs.size(), 2u);
  EXPECT_EQ(snapshot->jobs[0].id(), "demo-1");
  EXPECT_EQ(snapshot->jobs[0].state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(snapshot->jobs[0].transitions(0).reason(), "submitted");
  EXPECT_EQ(snapshot->jobs[1].id(), "demo-2");
  auto reports = store.ReadReports("demo-1", 1);
  ASSERT_TRUE(reports.ok()) << reports.status();
  ASSERT_EQ(reports->size(), 3u);
  EXPECT_EQ((*reports)[0].values().at("loss"), 2.0);
  EXPECT_EQ((*reports)[1].device_id(), 1);
  EXPECT_EQ((*reports)[2].step(), 2);
  EXPECT_EQ((*reports)[2].time().seconds(), 102);
  EXPECT_EQ(*store.ReportedAttempts("demo-1"), std::vector<int>{1});
  EXPECT_TRUE(store.ReportedAttempts("demo-2")->empty());
  auto latest = store.LatestReports("demo-1", 1, 1);
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->size(), 1u);
  EXPECT_EQ((*latest)[0].step(), 2);
  EXPECT_EQ(store.LatestReports("demo-1", 1, 2)->size(), 3u);
  EXPECT_EQ(*store.CountReports(), 3);
}

// Both implementations: put, upsert and load round-trip.
class StateStoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<StateStore> Make() {
    if (GetParam() == "memory") return std::make_unique<InMemoryStateStore>();
    auto store = SqliteStateStore::Open(TempDir("roundtrip"));
    EXPECT_TRUE(store.ok()) << store.status();
    return *std::move(store);
  }
};

TEST_P(StateStoreTest, EmptyStoreLoadsNothing) {
  auto store = Make();
  absl::StatusOr<StateStore::Snapshot> snapshot = store->Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_TRUE(snapshot->workers.empty());
  EXPECT_TRUE(snapshot->jobs.empty());
  EXPECT_EQ(*store->CountReports(), 0);
}

TEST_P(StateStoreTest, DeletionsAndPrunesInOneCommit) {
  auto store = Make();
  Fill(*store);
  StateBatch batch;
  batch.deleted_jobs = {"demo-2"};
  batch.prunes.push_back({"demo-1", 1, 2, 1000});  // step 1 goes, step 2 stays
  ASSERT_TRUE(store->Commit(batch).ok());
  auto snapshot = store->Load();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_EQ(snapshot->jobs[0].id(), "demo-1");
  auto reports = store->ReadReports("demo-1", 1);
  ASSERT_TRUE(reports.ok());
  ASSERT_EQ(reports->size(), 1u);
  EXPECT_EQ((*reports)[0].step(), 2);
  StateBatch gone;
  gone.deleted_jobs = {"demo-1"};
  ASSERT_TRUE(store->Commit(gone).ok());
  EXPECT_EQ(*store->CountReports(), 0);
}

TEST_P(StateStoreTest, TheJobCounterOnlyGrowsAndWorkersCanBeDeleted) {
  auto store = Make();
  Fill(*store);
  EXPECT_EQ(store->Load()->next_job_number, 0);
  StateBatch batch;
  batch.next_job_number = 5;
  batch.deleted_workers = {"w-1"};
  ASSERT_TRUE(store->Commit(batch).ok());
  StateBatch older;  // a concurrent submit's, committed later
  older.next_job_number = 3;
  ASSERT_TRUE(store->Commit(older).ok());
  absl::StatusOr<StateStore::Snapshot> snapshot = store->Load();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->next_job_number, 5);
  ASSERT_EQ(snapshot->workers.size(), 1u);
  EXPECT_EQ(snapshot->workers[0].worker_id(), "w-2");
}

TEST_P(StateStoreTest, PutLoadRoundTripWithUpserts) {
  auto store = Make();
  Fill(*store);
  ExpectFilled(*store);
}

LogChunk Chunk(const std::string& job, int process, int64_t offset, const std::string& data,
               bool eof = false, int64_t max_bytes = 0) {
  LogChunk c;
  c.job_id = job;
  c.attempt = 1;
  c.process_index = process;
  c.offset = offset;
  c.host = process == 0 ? "host-a" : "host-b";
  c.data = data;
  c.eof = eof;
  c.max_bytes = max_bytes;
  return c;
}

std::string Joined(const std::vector<LogChunk>& chunks) {
  std::string all;
  for (const LogChunk& c : chunks) all += c.data;
  return all;
}

TEST_P(StateStoreTest, LogChunksRoundTripByProcessAndOffset) {
  auto store = Make();
  StateBatch batch;
  batch.log_chunks = {Chunk("demo-1", 1, 0, "b0\n"), Chunk("demo-1", 0, 0, "a0\n"),
                      Chunk("demo-1", 0, 3, "a1\n"), Chunk("demo-1", 1, 3, "", /*eof=*/true)};
  ASSERT_TRUE(store->Commit(batch).ok());
  absl::StatusOr<std::vector<LogExtent>> extents = store->LogExtents("demo-1", 1);
  ASSERT_TRUE(extents.ok()) << extents.status();
  ASSERT_EQ(extents->size(), 2u);
  EXPECT_EQ((*extents)[0].process_index, 0);
  EXPECT_EQ((*extents)[0].host, "host-a");
  EXPECT_EQ((*extents)[0].begin, 0);
  EXPECT_EQ((*extents)[0].end, 6);
  EXPECT_FALSE((*extents)[0].eof);
  EXPECT_EQ((*extents)[1].end, 3);
  EXPECT_TRUE((*extents)[1].eof);
  EXPECT_EQ(Joined(*store->ReadLogChunks("demo-1", 1, 0, 0, 1 << 20)), "a0\na1\n");
  // From inside a chunk: that chunk whole, and the rest.
  EXPECT_EQ(Joined(*store->ReadLogChunks("demo-1", 1, 0, 4, 1 << 20)), "a1\n");
  // The empty chunk that ends process 1's log is read from its offset.
  absl::StatusOr<std::vector<LogChunk>> end = store->ReadLogChunks("demo-1", 1, 1, 3, 1 << 20);
  ASSERT_TRUE(end.ok());
  ASSERT_EQ(end->size(), 1u);
  EXPECT_TRUE((*end)[0].eof);
  // Pages: at least max_bytes, whole chunks.
  EXPECT_EQ(store->ReadLogChunks("demo-1", 1, 0, 0, 1)->size(), 1u);
  EXPECT_TRUE(store->LogExtents("demo-1", 2)->empty());
}

TEST_P(StateStoreTest, LogChunksBeyondTheBoundDropTheOldest) {
  auto store = Make();
  for (int i = 0; i < 10; ++i) {
    StateBatch batch;
    batch.log_chunks = {Chunk("demo-1", 0, i * 10, "012345678\n", false, /*max_bytes=*/35)};
    ASSERT_TRUE(store->Commit(batch).ok());
  }
  absl::StatusOr<std::vector<LogExtent>> extents = store->LogExtents("demo-1", 1);
  ASSERT_TRUE(extents.ok());
  ASSERT_EQ(extents->size(), 1u);
  // The newest chunks that fit in 35 bytes: 3 of 10; the 70 bytes before are dropped.
  EXPECT_EQ((*extents)[0].begin, 70);
  EXPECT_EQ((*extents)[0].end, 100);
  EXPECT_EQ(Joined(*store->ReadLogChunks("demo-1", 1, 0, 0, 1 << 20)).size(), 30u);
}

TEST_P(StateStoreTest, LogChunksGoWithTheirJob) {
  auto store = Make();
  Fill(*store);
  StateBatch batch;
  batch.log_chunks = {Chunk("demo-1", 0, 0, "kept\n"), Chunk("demo-2", 0, 0, "gone\n")};
  ASSERT_TRUE(store->Commit(batch).ok());
  StateBatch gone;
  gone.deleted_jobs = {"demo-2"};
  // A chunk in the same batch as its job's deletion goes too (chunks are written first).
  gone.log_chunks = {Chunk("demo-2", 0, 5, "late\n")};
  ASSERT_TRUE(store->Commit(gone).ok());
  EXPECT_TRUE(store->LogExtents("demo-2", 1)->empty());
  EXPECT_EQ(Joined(*store->ReadLogChunks("demo-1", 1, 0, 0, 1 << 20)), "kept\n");
}

INSTANTIATE_TEST_SUITE_P(Implementations, StateStoreTest, ::testing::Values("memory", "sqlite"),
                         [](const auto& info) { return info.param; });

TEST(SqliteStateStoreTest, ReopenedFileHasEverything) {
  const std::string dir = TempDir("reopen");
  {
    auto store = SqliteStateStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    Fill(**store);
  }
  auto reopened = SqliteStateStore::Open(dir);
  ASSERT_TRUE(reopened.ok()) << reopened.status();
  EXPECT_EQ((*reopened)->path(), dir + "/substrax.db");
  ExpectFilled(**reopened);
  // Writing after a reopen appends after what was there.
  ASSERT_TRUE((*reopened)->AppendReports({MakeReport("demo-1", 3, 0, 1.0)}).ok());
  auto reports = (*reopened)->ReadReports("demo-1", 1);
  ASSERT_TRUE(reports.ok());
  ASSERT_EQ(reports->size(), 4u);
  EXPECT_EQ((*reports)[3].step(), 3);
}

TEST(SqliteStateStoreTest, AVersionOneFileGetsTheLogTable) {
  const std::string dir = TempDir("migrate");
  std::filesystem::create_directories(dir);
  {
    // What a coordinator of schema version 1 left: no log_chunks table.
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open((dir + "/substrax.db").c_str(), &db), SQLITE_OK);
    ASSERT_EQ(sqlite3_exec(db,
                           "CREATE TABLE jobs (job_id TEXT PRIMARY KEY, proto BLOB NOT NULL);"
                           "PRAGMA user_version = 1;",
                           nullptr, nullptr, nullptr),
              SQLITE_OK);
    sqlite3_close(db);
  }
  auto store = SqliteStateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  StateBatch batch;
  batch.log_chunks = {Chunk("demo-1", 0, 0, "x\n")};
  EXPECT_TRUE((*store)->Commit(batch).ok());
  EXPECT_EQ((*store)->LogExtents("demo-1", 1)->size(), 1u);
}

TEST(SqliteStateStoreTest, TheDatabaseAndItsDirectoryArePrivate) {
  const std::string dir = TempDir("private");
  // An older coordinator left its files readable by everyone (open, so that the -wal and
  // -shm files exist: a last close removes them).
  auto older = SqliteStateStore::Open(dir);
  ASSERT_TRUE(older.ok()) << older.status();
  ASSERT_TRUE((*older)->PutJob(MakeJob("demo-1", v1::JOB_STATE_PENDING)).ok());
  for (const char* file : {"", "/substrax.db", "/substrax.db-wal", "/substrax.db-shm"}) {
    std::filesystem::permissions(dir + file, std::filesystem::perms::all);
  }
  auto store = SqliteStateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->PutJob(MakeJob("demo-2", v1::JOB_STATE_PENDING)).ok());
  auto mode = [](const std::string& path) {
    return std::filesystem::status(path).permissions() & std::filesystem::perms::all;
  };
  EXPECT_EQ(mode(dir), std::filesystem::perms::owner_all);
  for (const char* file : {"/substrax.db", "/substrax.db-wal", "/substrax.db-shm"}) {
    ASSERT_TRUE(std::filesystem::exists(dir + file)) << file;
    EXPECT_EQ(mode(dir + file),
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)
        << file;
  }
  // A fresh directory: created private.
  const std::string fresh = TempDir("private-fresh") + "/state";
  auto created = SqliteStateStore::Open(fresh);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_TRUE((*created)->PutJob(MakeJob("demo-1", v1::JOB_STATE_PENDING)).ok());
  EXPECT_EQ(mode(fresh), std::filesystem::perms::owner_all);
  for (const char* file : {"/substrax.db", "/substrax.db-wal", "/substrax.db-shm"}) {
    EXPECT_EQ(mode(fresh + file),
              std::filesystem::perms::owner_read | std::filesystem::perms::owner_write)
        << file;
  }
}

TEST(SqliteStateStoreTest, UsesWalMode) {
  const std::string dir = TempDir("wal");
  auto store = SqliteStateStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->PutJob(MakeJob("demo-1", v1::JOB_STATE_PENDING)).ok());
  EXPECT_TRUE(std::filesystem::exists(dir + "/substrax.db-wal"));
}

TEST(SqliteStateStoreTest, UnwritableDirectoryIsUnavailable) {
  // A regular file where a directory must be: fails for every user, root included.
  const std::string dir = TempDir("not-a-dir");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  auto store = SqliteStateStore::Open(dir + "/file/state");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(store.status().message(), HasSubstr(dir + "/file/state"));
}

TEST(SqliteStateStoreTest, DamagedFileIsAnError) {
  const std::string dir = TempDir("damaged");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/substrax.db") << std::string(8192, 'x');
  auto store = SqliteStateStore::Open(dir);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss) << store.status();
  EXPECT_THAT(store.status().message(), HasSubstr("substrax.db"));
}

}  // namespace
}  // namespace substrax
