// StateWriter: the coordinator's only writer to its StateStore, on a thread of its own, so that
// no lock of the Cluster is ever held across a disk write (an fsync'd commit can take tens of
// milliseconds, seconds on a sick disk; heartbeats must not wait for it).
//
// Under its lock the Cluster enqueues what changed (the newest version of a worker or job
// replaces a queued older one; metric points are appended; deletions and prunes are queued) and
// gets a ticket. Without the lock, the rpc that made the change waits for its ticket before
// answering: acknowledged still means persisted. The thread commits everything queued in one
// transaction (group commit: one fsync for every rpc that waited meanwhile).
//
// A failed commit answers every waiter of its tickets with the store's error (UNAVAILABLE: the
// client retries); its records stay queued (a newer version still replaces them) and the commit
// is retried after a backoff (50 ms, doubling up to 5 s). Nothing is dropped.
//
// Memory: the queue holds what changed since the last commit; while the store keeps failing it
// grows with the changes (jobs and workers are coalesced by id, so only metric points and log
// chunks pile up; the rpc layer bounds their size per request).
//
// Thread-safe.
#ifndef SUBSTRAX_COORDINATOR_STATE_WRITER_H_
#define SUBSTRAX_COORDINATOR_STATE_WRITER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coordinator/state_store.h"

namespace substrax {

class StateWriter {
 public:
  // `store` must outlive the writer.
  explicit StateWriter(StateStore* store);
  // Commits what is queued (one last try) and stops the thread.
  ~StateWriter();
  StateWriter(const StateWriter&) = delete;
  StateWriter& operator=(const StateWriter&) = delete;

  // Each returns the ticket of the change; tickets increase.
  uint64_t PutWorker(const v1::Worker& worker);
  uint64_t PutJob(const v1::Job& job);
  uint64_t DeleteJob(const std::string& job_id);
  // A worker Put after its deletion is stored again (the newest change wins).
  uint64_t DeleteWorker(const std::string& worker_id);
  uint64_t AppendReports(std::vector<v1::StepReport> reports);
  uint64_t Prune(StateBatch::Prune prune);
  // Log chunks ride in the same group commits as everything else: no commit (and no fsync) of
  // their own, so shipping logs adds bytes to commits but never a wait to other rpcs.
  uint64_t AppendLog(LogChunk chunk);

  // The ticket of the last change enqueued (0: none yet).
  uint64_t last_ticket() const;
  // Blocks until every change up to `ticket` is committed (OK), or the commit that held it
  // failed (that commit's error). Ticket 0 returns OK at once.
  absl::Status Wait(uint64_t ticket);
  // Wait(last_ticket()).
  absl::Status Flush();

  // Every ticket up to this one is on disk.
  uint64_t committed() const;
  // Called after each successful commit, on the writer's thread, without its lock (the Cluster
  // wakes the streams that wait for a commit before they send an event). Set it before the
  // first change.
  void SetCommitCallback(std::function<void()> callback);

  // Commits so far, and failed ones (for tests and /metrics).
  int64_t commits() const;
  int64_t failed_commits() const;

 private:
  void Run();

  StateStore* const store_;
  mutable absl::Mutex mu_;
  // What the next commit writes.
  std::map<std::string, v1::Worker> workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> deleted_jobs_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> deleted_workers_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::StepReport> reports_ ABSL_GUARDED_BY(mu_);
  std::vector<StateBatch::Prune> prunes_ ABSL_GUARDED_BY(mu_);
  std::vector<LogChunk> logs_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
  // Every ticket <= committed_ is on disk. The last failed commit covered tickets up to
  // failed_through_ and failed with failure_.
  uint64_t committed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_through_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  int64_t commits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failed_commits_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_commit_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_STATE_WRITER_H_
