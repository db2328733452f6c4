// TEMPORARY stub (lead's local testing only; replaced by the policy helper's implementation).
#include "coordinator/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace substrax {
namespace scheduling {

absl::StatusOr<v1::SchedulingConfig> ParseSchedulingConfig(const std::string&, const std::string&) {
  return absl::UnimplementedError("stub");
}

v1::SchedulingConfig DefaultSchedulingConfig() {
  v1::SchedulingConfig c;
  c.set_policy(v1::SCHEDULING_POLICY_QUEUES);
  c.add_queues()->set_name("default");
  c.set_default_queue("default");
  auto* k = c.add_priority_classes();
  k->set_name("default");
  c.set_default_priority_class("default");
  c.set_fair_share_window_seconds(3600);
  c.set_preemption_grace_seconds(30);
  return c;
}

Scheduler::Scheduler(v1::SchedulingConfig config) : config_(std::move(config)) {}
void Scheduler::SetConfig(v1::SchedulingConfig config) { config_ = std::move(config); }

absl::StatusOr<Scheduler::Admission> Scheduler::Admit(const std::string& queue,
                                                      const std::string& priority_class,
                                                      const std::string&, int64_t,
                                                      const std::string&,
                                                      const std::vector<std::string>&, bool) const {
  Admission a;
  a.queue = queue.empty() ? config_.default_queue() : queue;
  a.priority_class = priority_class.empty() ? config_.default_priority_class() : priority_class;
  for (const auto& c : config_.priority_classes()) {
    if (c.name() == a.priority_class) a.priority = c.value();
  }
  return a;
}

PassStats Scheduler::Schedule(absl::Time, const std::vector<PendingJob>& pending_in,
                              const std::vector<RunningJob>& running,
                              const std::map<std::string, PoolDevices>& pools_in, Actions& actions) {
  PassStats stats;
  std::vector<PendingJob> pending = pending_in;
  std::stable_sort(pending.begin(), pending.end(), [](const PendingJob& a, const PendingJob& b) {
    if (a.priority != b.priority) return a.priority > b.priority;
    return a.order < b.order;
  });
  std::map<std::string, PoolDevices> pools = pools_in;
  std::string blocked;
  bool preempted = false;
  for (const PendingJob& job : pending) {
    if (!blocked.empty()) { actions.Wait(job, absl::StrCat("behind job ", blocked)); continue; }
    PoolDevices& pool = pools[job.pool];
    bool started = false;
    for (int64_t size : job.sizes) {
      if (size > pool.free) continue;
      if (actions.Start(job, size, "")) { pool.free -= size; started = true; ++stats.started; }
      break;
    }
    if (started) continue;
    if (!preempted && config_.policy() != v1::SCHEDULING_POLICY_FIFO) {
      int64_t incoming = 0;
      for (const RunningJob& r : running) if (r.preempting && r.preempted_for == job.id) incoming += r.devices;
      if (pool.free + incoming < job.sizes.back()) {
        for (const RunningJob& r : running) {
          if (r.pool != job.pool || r.preempting || !r.preemptible || r.priority >= job.priority) continue;
          actions.Preempt(r, job, absl::StrCat("priority ", job.priority, " over ", r.priority));
          incoming += r.devices; ++stats.preempted; preempted = true;
          if (pool.free + incoming >= job.sizes.back()) break;
        }
      }
    }
    actions.Wait(job, absl::StrCat(job.sizes.back(), " free devices; ", pool.free, " free"));
    blocked = job.id;
  }
  return stats;
}

std::vector<QueueStatus> Scheduler::Queues() const { return last_queues_; }

}  // namespace scheduling
}  // namespace substrax
