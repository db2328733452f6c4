// A pass's sums and the walk of the two policies over the pending jobs
// (scheduler_internal.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "coordinator/scheduler_internal.h"

namespace substrax {
namespace scheduling {
namespace internal {

int PoolIndex(const std::string& pool) {
  for (int p = 0; p < kPools; ++p) {
    if (pool == kPoolNames[p]) return p;
  }
  return -1;
}

std::string FormatAt(absl::Time t, absl::Time now) {
  const absl::TimeZone utc = absl::UTCTimeZone();
  const bool same_day =
      absl::FormatTime("%Y-%m-%d", t, utc) == absl::FormatTime("%Y-%m-%d", now, utc);
  return absl::FormatTime(same_day ? "%H:%M:%S UTC" : "%Y-%m-%d %H:%M:%S UTC", t, utc);
}

Pass::Pass(const v1::SchedulingConfig& config, absl::Time now,
           const std::map<std::string, double>& shares, const std::vector<PendingJob>& pending,
           const std::vector<RunningJob>& running, const std::map<std::string, PoolDevices>& pools,
           const std::map<std::string, absl::Time>& claims, Actions& actions)
    : config_(config), now_(now), pending_(pending), actions_(actions), claims_(claims) {
  absl::flat_hash_map<std::string, int> cohort_index;
  for (const v1::QueueConfig& c : config.queues()) {
    QueueState q;
    q.name = c.name();
    q.cohort_name = c.cohort();
    if (!c.cohort().empty()) {
      auto [it, added] = cohort_index.emplace(c.cohort(), static_cast<int>(cohorts_.size()));
      if (added) cohorts_.emplace_back();
      q.cohort = it->second;
      cohorts_[q.cohort].members.push_back(static_cast<int>(queues_.size()));
    }
    for (const v1::DeviceQuota& quota : c.quotas()) {
      const int p = PoolIndex(quota.backend());
      if (p < 0) continue;
      q.limited[p] = true;
      q.nominal[p] = quota.devices();
      if (quota.has_borrowing_limit()) q.borrowing_limit[p] = quota.borrowing_limit();
      if (q.cohort >= 0) cohorts_[q.cohort].nominal[p] += quota.devices();
    }
    auto share = shares.find(c.name());
    if (share != shares.end()) q.share = share->second;
    queue_index_.emplace(q.name, static_cast<int>(queues_.size()));
    queues_.push_back(std::move(q));
  }
  for (int p = 0; p < kPools; ++p) {
    auto it = pools.find(kPoolNames[p]);
    if (it == pools.end()) continue;
    pools_[p].known = true;
    pools_[p].alive = it->second.alive;
    pools_[p].free = it->second.free;
  }
  const absl::Time grace_end = now + absl::Seconds(config.preemption_grace_seconds());
  for (const RunningJob& r : running) {
    const int q = QueueOf(r.queue);
    const int p = PoolIndex(r.pool);
    if (p < 0) continue;
    AddUse(q, p, r.devices);
    pools_[p].running.push_back(&r);
    pools_[p].ends.push_back(
        {r.preempting ? std::min(r.expected_end, grace_end) : r.expected_end, r.devices, &r});
    if (r.preempting) {
      if (r.preempted_for.empty()) continue;
      InFlight& f = inflight_[r.preempted_for];
      f.devices += r.devices;
      ++f.jobs;
      f.by_queue.push_back({q, r.devices});
    } else if (r.preemptible) {
      queues_[q].lower[p].push_back({r.priority, r.devices});
    }
  }
  for (PoolState& pool : pools_) {
    std::sort(pool.ends.begin(), pool.ends.end(),
              [](const EndEntry& a, const EndEntry& b) { return a.end < b.end; });
  }
  for (QueueState& q : queues_) {
    for (auto& lower : q.lower) {
      std::sort(lower.begin(), lower.end());
      int64_t sum = 0;
      for (auto& entry : lower) entry.second = (sum += entry.second);
    }
  }
}

int Pass::QueueOf(const std::string& name) {
  auto [it, added] = queue_index_.emplace(name, static_cast<int>(queues_.size()));
  if (added) {
    QueueState q;
    q.name = name;
    q.configured = false;
    queues_.push_back(std::move(q));
  }
  return it->second;
}

void Pass::AddUse(int queue, int pool, int64_t devices) {
  QueueState& q = queues_[queue];
  q.used[pool] += devices;
  if (q.limited[pool] && q.cohort >= 0) cohorts_[q.cohort].used[pool] += devices;
  ++version_;
}

int64_t Pass::Limit(const QueueState& q, int pool) const {
  if (!q.limited[pool]) return kUnlimited;
  int64_t borrow = 0;
  if (q.cohort >= 0) {
    const CohortState& c = cohorts_[q.cohort];
    // The others' nominal quota not used by themselves or lent to a third
    // queue.
    borrow =
        std::max<int64_t>(0, (c.nominal[pool] - q.nominal[pool]) - (c.used[pool] - q.used[pool]));
    borrow = std::min(borrow, q.borrowing_limit[pool]);
  }
  return q.nominal[pool] + borrow;
}

int64_t Pass::LowerPriority(const QueueState& q, int pool, int32_t priority) const {
  const auto& lower = q.lower[pool];
  auto it = std::lower_bound(lower.begin(), lower.end(),
                             std::make_pair(priority, std::numeric_limits<int64_t>::min()));
  return it == lower.begin() ? 0 : std::prev(it)->second;
}

const std::string& Pass::QuotaReason(int queue, int pool) {
  QueueState& q = queues_[queue];
  if (q.reason_version[pool] == version_) return q.quota_reason[pool];
  q.reason_version[pool] = version_;
  const char* name = kPoolNames[pool];
  std::string reason = absl::StrCat("queue ", q.name, " at its quota: ", q.used[pool], " of ",
                                    q.nominal[pool], " ", name, " devices in use");
  if (q.used[pool] > q.nominal[pool]) {
    absl::StrAppend(&reason, " (", q.used[pool] - q.nominal[pool], " borrowed from cohort ",
                    q.cohort_name, ")");
  }
  if (q.cohort >= 0) {
    std::vector<std::string> borrowers;
    for (int m : cohorts_[q.cohort].members) {
      const QueueState& other = queues_[m];
      if (m == queue || !other.limited[pool] || other.used[pool] <= other.nominal[pool]) continue;
      borrowers.push_back(
          absl::StrCat(other.used[pool] - other.nominal[pool], " borrowed by queue ", other.name));
    }
    if (!borrowers.empty()) absl::StrAppend(&reason, "; ", absl::StrJoin(borrowers, ", "));
  }
  q.quota_reason[pool] = std::move(reason);
  return q.quota_reason[pool];
}

std::string Pass::HigherPriorityPrefix(QueueState& q, const PendingJob& job) {
  if (job.priority != q.priority) {
    q.priority = job.priority;
    q.seen_at_priority = 0;
  }
  const int64_t higher = q.seen - q.seen_at_priority;
  ++q.seen;
  ++q.seen_at_priority;
  if (higher == 0) return std::string();
  return absl::StrCat("behind ", higher, higher == 1 ? " job" : " jobs",
                      " of higher priority in queue ", q.name, "; ");
}

InFlight Pass::InFlightFor(const std::string& id) const {
  if (inflight_.empty()) return InFlight();
  auto it = inflight_.find(id);
  return it == inflight_.end() ? InFlight() : it->second;
}

bool Pass::TryStart(const PendingJob& job, int queue, int pool, int64_t devices,
                    const std::string& reason) {
  if (!actions_.Start(job, devices, reason)) return false;
  if (!claims_.empty() && claims_.count(job.id) > 0) released_.push_back(job.id);
  AddUse(queue, pool, devices);
  PoolState& p = pools_[pool];
  p.free -= devices;
  p.started.push_back({now_ + job.estimate, devices, nullptr});
  ++stats_.started;
  return true;
}

namespace {

// The largest of `sizes` (largest first) that is at most `room`; 0 when none
// is.
int64_t LargestFitting(const std::vector<int64_t>& sizes, int64_t room) {
  for (int64_t size : sizes) {
    if (size <= room) return size;
  }
  return 0;
}

int64_t Smallest(const PendingJob& job) { return job.sizes.empty() ? 0 : job.sizes.back(); }

}  // namespace

PassStats Pass::RunFifo() {
  std::vector<int32_t> order(pending_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return pending_[a].order < pending_[b].order; });
  std::string behind;
  for (int32_t i : order) {
    const PendingJob& job = pending_[i];
    const int queue = QueueOf(job.queue);
    ++queues_[queue].pending_by_class[job.priority_class];
    const int pool = PoolIndex(job.pool);
    if (!behind.empty()) {
      actions_.Wait(job, behind);
      continue;
    }
    if (pool < 0 || !pools_[pool].known || job.sizes.empty()) {
      actions_.Wait(job, absl::StrCat("no devices in pool ", job.pool));
      continue;
    }
    PoolState& p = pools_[pool];
    const int64_t size = LargestFitting(job.sizes, p.free);
    if (size > 0 &&
        TryStart(job, queue, pool, size,
                 absl::StrCat(size, " of ", p.free, " free devices in pool ", job.pool))) {
      continue;
    }
    actions_.Wait(job, absl::StrCat(Smallest(job), " devices; ", p.free, " free of ", p.alive,
                                    " in pool ", job.pool));
    behind = absl::StrCat("behind job ", job.id, ", the oldest pending job, which waits for ",
                          Smallest(job), " devices in pool ", job.pool,
                          " (the fifo policy starts jobs in submission order only)");
  }
  return stats_;
}

PassStats Pass::RunQueues() {
  struct Entry {
    bool inflight;
    int32_t priority;
    bool borrowing;
    double share;
    int64_t order;
    int32_t index;
    int32_t queue;
  };
  std::vector<Entry> entries;
  entries.reserve(pending_.size());
  for (size_t i = 0; i < pending_.size(); ++i) {
    const PendingJob& job = pending_[i];
    const int queue = QueueOf(job.queue);
    const bool inflight = (!inflight_.empty() && inflight_.count(job.id) > 0) ||
                          (!claims_.empty() && claims_.count(job.id) > 0);
    const int pool = PoolIndex(job.pool);
    const QueueState& q = queues_[queue];
    const bool borrowing = pool >= 0 && q.limited[pool] && q.used[pool] >= q.nominal[pool];
    entries.push_back(
        {inflight, job.priority, borrowing, q.share, job.order, static_cast<int32_t>(i), queue});
  }
  // A job that running jobs are being preempted for comes first: those devices are its, and
  // another head in its place would preempt again. Within a priority, the jobs of queues below
  // their nominal quota come before those that would borrow: otherwise a borrower takes the
  // devices a queue is entitled to and the queue reclaims them at once by preemption.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    if (a.inflight != b.inflight) return a.inflight;
    if (a.priority != b.priority) return a.priority > b.priority;
    if (a.borrowing != b.borrowing) return b.borrowing;
    if (a.share != b.share) return a.share < b.share;
    return a.order < b.order;
  });
  for (const Entry& e : entries) {
    const PendingJob& job = pending_[e.index];
    QueueState& q = queues_[e.queue];
    ++q.pending_by_class[job.priority_class];
    // (Jobs first for their preemptions are out of priority order: not counted as ahead.)
    const std::string prefix = e.inflight ? std::string() : HigherPriorityPrefix(q, job);
    const int pool = PoolIndex(job.pool);
    if (pool < 0 || !pools_[pool].known || pools_[pool].alive <= 0 || job.sizes.empty()) {
      actions_.Wait(job, absl::StrCat(prefix, "no alive devices in pool ", job.pool));
      continue;
    }
    PoolState& p = pools_[pool];
    const InFlight inflight = InFlightFor(job.id);
    int64_t own_inflight = 0;
    for (const auto& [victim_queue, devices] : inflight.by_queue) {
      if (victim_queue == e.queue) own_inflight += devices;
    }
    const int64_t limit = Limit(q, pool);
    // Quota room now: the devices its own victims are giving back count as
    // returned.
    const int64_t room = limit >= kUnlimited ? kUnlimited : limit - (q.used[pool] - own_inflight);
    if (p.head != nullptr) {
      Backfill(job, e.queue, pool, room, prefix);
      continue;
    }
    const int64_t size = LargestFitting(job.sizes, std::min(p.free, room));
    bool mesh_failed = false;
    if (size > 0) {
      if (TryStart(job, e.queue, pool, size,
                   absl::StrCat(size, " of ", p.free, " free devices in pool ", job.pool))) {
        continue;
      }
      mesh_failed = true;
    }
    if (room + LowerPriority(q, pool, job.priority) < Smallest(job)) {
      actions_.Wait(job, absl::StrCat(prefix, QuotaReason(e.queue, pool)));
      continue;
    }
    Head(job, e.queue, pool, room, mesh_failed, prefix);
  }
  return stats_;
}

std::vector<QueueStatus> Pass::QueueStatuses() const {
  std::vector<QueueStatus> statuses;
  for (const QueueState& q : queues_) {
    if (!q.configured) continue;
    QueueStatus s;
    s.name = q.name;
    s.cohort = q.cohort_name;
    for (int p = 0; p < kPools; ++p) {
      if (q.limited[p]) {
        s.quota[kPoolNames[p]] = q.nominal[p];
        s.borrowed[kPoolNames[p]] = std::max<int64_t>(0, q.used[p] - q.nominal[p]);
      }
      if (q.limited[p] || q.used[p] > 0) s.used[kPoolNames[p]] = q.used[p];
    }
    s.pending.insert(q.pending_by_class.begin(), q.pending_by_class.end());
    s.fair_share = q.share;
    statuses.push_back(std::move(s));
  }
  return statuses;
}

}  // namespace internal
}  // namespace scheduling
}  // namespace substrax
