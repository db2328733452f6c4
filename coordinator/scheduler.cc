// The scheduling pass (scheduler.h has the model). One pass sorts the pending
// jobs once and walks them in that order; every quota, borrowing and fit
// decision is O(1) on per-queue and per-cohort sums kept up to date as jobs
// start, so a pass is O(n log n) in the pending jobs plus O(r log r) in the
// running ones. Only the head of a pool looks at running jobs one by one (its
// shadow time and its preemption victims), once per pass.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "coordinator/scheduler_internal.h"

namespace substrax {
namespace scheduling {

using internal::Pass;

Scheduler::Scheduler(v1::SchedulingConfig config) : config_(std::move(config)) {}

void Scheduler::SetConfig(v1::SchedulingConfig config) {
  config_ = std::move(config);
  std::map<std::string, std::map<std::string, double>> kept;
  for (const v1::QueueConfig& q : config_.queues()) {
    auto it = usage_.find(q.name());
    if (it != usage_.end()) kept.emplace(it->first, std::move(it->second));
  }
  usage_ = std::move(kept);
}

PassStats Scheduler::Schedule(absl::Time now, const std::vector<PendingJob>& pending,
                              const std::vector<RunningJob>& running,
                              const std::map<std::string, PoolDevices>& pools, Actions& actions) {
  // Fair share: decayed device-seconds, the running jobs counted as running
  // since the last pass. The integral of a constant use d over dt, decayed with
  // half-life H, is d * H/ln2 * (1 - 2^(-dt/H)).
  const double half_life =
      static_cast<double>(std::max<int64_t>(1, config_.fair_share_window_seconds()));
  const double dt = accounted_at_ == absl::InfinitePast()
                        ? 0
                        : std::max(0.0, absl::ToDoubleSeconds(now - accounted_at_));
  const double decay = std::exp2(-dt / half_life);
  const double scale = half_life / std::log(2.0);
  for (auto& [queue, by_pool] : usage_) {
    for (auto& [pool, used] : by_pool) used *= decay;
  }
  absl::flat_hash_map<std::string, std::map<std::string, int64_t>> devices;
  for (const RunningJob& r : running) devices[r.queue][r.pool] += r.devices;
  for (const auto& [queue, by_pool] : devices) {
    for (const auto& [pool, d] : by_pool) {
      usage_[queue][pool] += static_cast<double>(d) * scale * (1 - decay);
    }
  }
  if (now > accounted_at_) accounted_at_ = now;
  std::map<std::string, double> shares;
  for (const auto& [queue, by_pool] : usage_) {
    double share = 0;
    for (const auto& [pool, used] : by_pool) {
      auto it = pools.find(pool);
      if (it == pools.end() || it->second.alive <= 0) continue;
      share = std::max(share, used / (static_cast<double>(it->second.alive) * scale));
    }
    shares[queue] = share;
  }
  const absl::Duration claim_life =
      absl::Seconds(config_.preemption_grace_seconds()) + absl::Minutes(5);
  for (auto it = claims_.begin(); it != claims_.end();) {
    it = now - it->second > claim_life ? claims_.erase(it) : std::next(it);
  }
  Pass pass(config_, now, shares, pending, running, pools, claims_, actions);
  PassStats stats =
      config_.policy() == v1::SCHEDULING_POLICY_FIFO ? pass.RunFifo() : pass.RunQueues();
  for (const std::string& id : pass.released()) claims_.erase(id);
  for (const std::string& id : pass.claimed()) claims_[id] = now;
  last_queues_ = pass.QueueStatuses();
  return stats;
}

std::vector<QueueStatus> Scheduler::Queues() const {
  if (!last_queues_.empty()) return last_queues_;
  // Before the first pass: the configuration alone.
  std::vector<QueueStatus> queues;
  for (const v1::QueueConfig& q : config_.queues()) {
    QueueStatus status;
    status.name = q.name();
    status.cohort = q.cohort();
    for (const v1::DeviceQuota& quota : q.quotas()) status.quota[quota.backend()] = quota.devices();
    queues.push_back(std::move(status));
  }
  return queues;
}

}  // namespace scheduling
}  // namespace substrax
