// One scheduling pass of coordinator/scheduler.h: the state it keeps while it
// walks the pending jobs (per queue, cohort and pool sums) and the steps of the
// two policies. Internal to
// //coordinator:scheduler (scheduler_pass.cc, scheduler_head.cc).
#ifndef SUBSTRAX_COORDINATOR_SCHEDULER_INTERNAL_H_
#define SUBSTRAX_COORDINATOR_SCHEDULER_INTERNAL_H_

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"
#include "coordinator/scheduler.h"

namespace substrax {
namespace scheduling {
namespace internal {

// The pools a quota can name: v1::DeviceQuota.backend.
inline constexpr int kPools = 2;
inline constexpr const char* kPoolNames[kPools] = {"cpu", "cuda"};
inline constexpr int64_t kUnlimited = std::numeric_limits<int64_t>::max() / 4;

// 0 for "cpu", 1 for "cuda", -1 otherwise.
int PoolIndex(const std::string& pool);

// "14:05:00 UTC" (with the date when not on `now`'s day).
std::string FormatAt(absl::Time t, absl::Time now);

struct QueueState {
  std::string name;
  std::string cohort_name;
  int cohort = -1;
  // Not in the configuration (removed by a reload while its jobs remain): no
  // limit.
  bool configured = true;
  // A quota entry for the pool: without one the queue has no limit there.
  bool limited[kPools] = {false, false};
  int64_t nominal[kPools] = {0, 0};
  int64_t borrowing_limit[kPools] = {kUnlimited, kUnlimited};
  // Devices held by its running jobs, and by those started in this pass.
  int64_t used[kPools] = {0, 0};
  double share = 0;
  absl::flat_hash_map<std::string, int64_t> pending_by_class;
  // Its pending jobs seen so far in the pass, and of those the ones at
  // `priority`: the difference is how many of higher priority are ahead of the
  // next one.
  int64_t seen = 0;
  int64_t seen_at_priority = 0;
  int32_t priority = std::numeric_limits<int32_t>::max();
  // Its preemptible running jobs not being preempted, per pool: (priority,
  // devices of this priority and all lower), sorted by priority.
  std::vector<std::pair<int32_t, int64_t>> lower[kPools];
  // "queue q at its quota ..." as of `reason_version` (the pass's version of
  // the sums).
  std::string quota_reason[kPools];
  int64_t reason_version[kPools] = {-1, -1};
};

struct CohortState {
  std::vector<int> members;
  // Sums over its queues limited in the pool.
  int64_t nominal[kPools] = {0, 0};
  int64_t used[kPools] = {0, 0};
};

// A running job's devices as a pool's head sees them: when they are expected to
// be free.
struct EndEntry {
  absl::Time end;
  int64_t devices;
  const RunningJob* job;  // null for a job started in this pass
};

struct PoolState {
  bool known = false;
  int64_t alive = 0;
  int64_t free = 0;
  // Running jobs of the pool, by expected end (those being preempted: by the
  // end of their grace), and those started in this pass (in start order).
  std::vector<EndEntry> ends;
  std::vector<EndEntry> started;
  std::vector<const RunningJob*> running;
  // The head: the first job in order that fits its quota but not the free
  // devices.
  const PendingJob* head = nullptr;
  bool shadow_known = false;
  absl::Time shadow = absl::InfiniteFuture();
  // Free devices the head will not need at the shadow time: what a backfilled
  // job that runs past it may use.
  int64_t extra = 0;
  // Why the jobs after the head wait: they do not fit now / they would delay
  // the head.
  std::string behind_reason;
  std::string reservation_reason;
};

// Preemptions under way for one pending job: devices by the victims' queues.
struct InFlight {
  int64_t devices = 0;
  int64_t jobs = 0;
  std::vector<std::pair<int, int64_t>> by_queue;
};

class Pass {
 public:
  Pass(const v1::SchedulingConfig& config, absl::Time now,
       const std::map<std::string, double>& shares, const std::vector<PendingJob>& pending,
       const std::vector<RunningJob>& running, const std::map<std::string, PoolDevices>& pools,
       const std::map<std::string, absl::Time>& claims, Actions& actions);

  PassStats RunFifo();
  PassStats RunQueues();
  std::vector<QueueStatus> QueueStatuses() const;
  // The jobs this pass preempted for, and the claimed jobs it started.
  const std::vector<std::string>& claimed() const { return claimed_; }
  const std::vector<std::string>& released() const { return released_; }

 private:
  struct Victim {
    double lost;
    int32_t priority;
    absl::Time started;
    const RunningJob* job;
    int queue;
    bool own;
  };

  int QueueOf(const std::string& name);
  void AddUse(int queue, int pool, int64_t devices);
  // What the queue may hold in the pool now: nominal plus what it may borrow.
  int64_t Limit(const QueueState& q, int pool) const;
  // Devices of the queue's preemptible running jobs in the pool below
  // `priority`.
  int64_t LowerPriority(const QueueState& q, int pool, int32_t priority) const;
  const std::string& QuotaReason(int queue, int pool);
  // "behind 2 jobs of higher priority in queue q; " or "" (and counts the job
  // as seen).
  std::string HigherPriorityPrefix(QueueState& q, const PendingJob& job);
  InFlight InFlightFor(const std::string& id) const;
  bool TryStart(const PendingJob& job, int queue, int pool, int64_t devices,
                const std::string& reason);

  // The pool's head (scheduler_head.cc): preempts for it, or computes its
  // reservation.
  void Head(const PendingJob& job, int queue, int pool, int64_t room, bool mesh_failed,
            const std::string& prefix);
  // The victims that free `devices` more devices and the quota beyond `room`,
  // losing the least work; none when they cannot.
  std::vector<Victim> ChooseVictims(const PendingJob& job, int queue, int pool, int64_t devices,
                                    int64_t room);
  void Reserve(const PendingJob& job, int pool, int64_t need, const InFlight& inflight);
  // When the queue's running jobs in the pool are expected to have freed `devices` of its
  // quota; InfiniteFuture when no estimate says.
  absl::Time QuotaFreed(int queue, int pool, int64_t devices) const;
  void Backfill(const PendingJob& job, int queue, int pool, int64_t room,
                const std::string& prefix);

  const v1::SchedulingConfig& config_;
  const absl::Time now_;
  const std::vector<PendingJob>& pending_;
  Actions& actions_;
  std::vector<QueueState> queues_;
  absl::flat_hash_map<std::string, int> queue_index_;
  std::vector<CohortState> cohorts_;
  PoolState pools_[kPools];
  absl::flat_hash_map<std::string, InFlight> inflight_;
  const std::map<std::string, absl::Time>& claims_;
  std::vector<std::string> claimed_;
  std::vector<std::string> released_;
  // Victims chosen in this pass: not chosen again.
  std::vector<const RunningJob*> chosen_;
  int64_t version_ = 0;
  PassStats stats_;
};

}  // namespace internal
}  // namespace scheduling
}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_SCHEDULER_INTERNAL_H_
