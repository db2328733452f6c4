// The head of a pool (scheduler_internal.h): its preemptions, its reservation
// (the shadow time of EASY backfill), and the backfilling of the jobs after it.
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

void Pass::Head(const PendingJob& job, int queue, int pool, int64_t room, bool mesh_failed,
                const std::string& prefix) {
  PoolState& p = pools_[pool];
  p.head = &job;
  const int64_t need = job.sizes.back();
  const InFlight inflight = InFlightFor(job.id);
  const absl::Duration grace = absl::Seconds(config_.preemption_grace_seconds());
  // Devices beyond the free ones and those already on their way, and quota
  // beyond its room.
  const int64_t more_devices = need - p.free - inflight.devices;
  const int64_t more_quota = need - room;
  std::string why;
  int64_t coming = inflight.devices;
  if (mesh_failed) {
    why = absl::StrCat("its mesh of ", need, " devices does not fit the hosts of the ", p.free,
                       " free devices in pool ", job.pool);
  } else if (more_devices > 0 || more_quota > 0) {
    // When it would start without preemption: when the running jobs' expected ends free its
    // devices and its queue's quota. A start that soon is worth waiting for, and so is one
    // that costs less device-time waiting than the victims would lose.
    absl::Time start = now_;
    if (more_devices > 0) {
      Reserve(job, pool, need, inflight);
      start = p.shadow_known ? p.shadow : absl::InfiniteFuture();
    }
    if (more_quota > 0) start = std::max(start, QuotaFreed(queue, pool, more_quota));
    std::vector<Victim> victims;
    if (start > now_ + 10 * grace) {
      victims = ChooseVictims(job, queue, pool, std::max<int64_t>(0, more_devices), room);
    }
    double lost = 0;
    for (const Victim& v : victims) lost += v.lost;
    if (start != absl::InfiniteFuture() &&
        lost >= static_cast<double>(need) * absl::ToDoubleSeconds(start - now_)) {
      victims.clear();
    }
    if (!victims.empty()) {
      std::vector<std::string> names;
      for (const Victim& v : victims) {
        coming += v.job->devices;
        if (names.size() < 5) names.push_back(v.job->id);
        actions_.Preempt(*v.job, job,
                         v.own ? absl::StrCat("preempted for job ", job.id,
                                              " of higher priority in queue ", job.queue)
                               : absl::StrCat("preempted for job ", job.id, ": queue ", job.queue,
                                              " reclaims its quota lent to cohort ",
                                              queues_[queue].cohort_name));
        chosen_.push_back(v.job);
        ++stats_.preempted;
      }
      claimed_.push_back(job.id);
      if (victims.size() > names.size()) {
        names.push_back(absl::StrCat("and ", victims.size() - names.size(), " more"));
      }
      why = absl::StrCat("preempting ", absl::StrJoin(names, ", "), " (", coming,
                         " devices) to start within ", config_.preemption_grace_seconds(), " s");
    }
  }
  if (mesh_failed || (coming > 0 && p.free + coming >= need)) {
    // Its devices are free or on their way: nothing may take the free ones it
    // will need.
    p.shadow_known = true;
    p.shadow = now_ + grace;
    p.extra = std::max<int64_t>(0, p.free - std::max<int64_t>(0, need - coming));
    if (why.empty()) {
      why = absl::StrCat(
          inflight.devices, " devices of ", inflight.jobs, inflight.jobs == 1 ? " job" : " jobs",
          " being preempted for it to stop (grace ", config_.preemption_grace_seconds(), " s)");
    }
  } else {
    Reserve(job, pool, need, inflight);
    why = absl::StrCat(need, " devices; ", p.free, " free of ", p.alive, " in pool ", job.pool);
    if (p.shadow_known) {
      absl::StrAppend(&why, "; reserved for ", FormatAt(p.shadow, now_),
                      " by the running jobs' estimates");
    } else {
      absl::StrAppend(&why, "; no reservation: a running job in pool ", job.pool,
                      " has no estimate (max_duration_seconds)");
    }
  }
  actions_.Wait(job, absl::StrCat(prefix, why));
  p.behind_reason = absl::StrCat("behind job ", job.id, ", first in line for pool ", job.pool, " (",
                                 need, " devices, ", p.free, " free)");
  p.reservation_reason =
      p.shadow_known
          ? absl::StrCat("the reservation of job ", job.id, " at ", FormatAt(p.shadow, now_), " (",
                         p.extra, " devices to spare after it)")
          : absl::StrCat("job ", job.id, ", first in line for pool ", job.pool,
                         ", whose start no estimate bounds");
}

std::vector<Pass::Victim> Pass::ChooseVictims(const PendingJob& job, int queue, int pool,
                                              int64_t devices, int64_t room) {
  const QueueState& q = queues_[queue];
  const int64_t need = job.sizes.back();
  const int64_t quota = std::max<int64_t>(0, need - room);
  const absl::Duration grace = absl::Seconds(config_.preemption_grace_seconds());
  // Reclaim only what the queue is entitled to: a start that keeps it within
  // its nominal quota (its use is what the limit leaves of its room).
  const bool entitled =
      q.limited[pool] && q.cohort >= 0 && Limit(q, pool) - room + need <= q.nominal[pool];
  std::vector<Victim> candidates;
  for (const RunningJob* r : pools_[pool].running) {
    if (!r->preemptible || r->preempting) continue;
    if (std::find(chosen_.begin(), chosen_.end(), r) != chosen_.end()) continue;
    const int rq = queue_index_.at(r->queue);
    const QueueState& other = queues_[rq];
    const bool own = rq == queue && r->priority < job.priority;
    const bool reclaim = entitled && devices > 0 && rq != queue && other.cohort == q.cohort &&
                         other.limited[pool] && other.used[pool] > other.nominal[pool];
    if (!own && !reclaim) continue;
    // A job that has checkpointed writes a final checkpoint when asked (built-in and SDK
    // jobs; command jobs through their hook): it loses at most its grace period.
    const absl::Time since = std::max(r->started, r->last_checkpoint);
    absl::Duration at_risk = std::max(absl::ZeroDuration(), now_ - since);
    if (r->last_checkpoint != absl::InfinitePast()) at_risk = std::min(at_risk, grace);
    // Nor is more than ten grace periods of a job's work thrown away: a job that cannot
    // checkpoint is preempted only early in its run, not over and over as it nears its end.
    if (at_risk > 10 * grace) continue;
    const double lost = static_cast<double>(r->devices) * absl::ToDoubleSeconds(at_risk);
    candidates.push_back({lost, r->priority, r->started, r, rq, own});
  }
  // Greedy by the work a device loses (seconds since the checkpoint), which
  // covers the devices needed at the least total loss better than by each
  // victim's loss; then the lowest priority, then the youngest.
  std::sort(candidates.begin(), candidates.end(), [](const Victim& a, const Victim& b) {
    const double a_rate = a.lost / static_cast<double>(std::max<int64_t>(1, a.job->devices));
    const double b_rate = b.lost / static_cast<double>(std::max<int64_t>(1, b.job->devices));
    if (a_rate != b_rate) return a_rate < b_rate;
    if (a.priority != b.priority) return a.priority < b.priority;
    return a.started > b.started;
  });
  std::vector<Victim> chosen;
  absl::flat_hash_map<int, int64_t> taken;
  int64_t devices_left = devices, quota_left = quota;
  for (const Victim& c : candidates) {
    if (devices_left <= 0 && quota_left <= 0) break;
    if (devices_left <= 0 && !c.own) continue;  // a reclaim frees devices, not quota
    const QueueState& other = queues_[c.queue];
    // A queue gives back only what it borrowed.
    if (!c.own && other.used[pool] - taken[c.queue] <= other.nominal[pool]) continue;
    chosen.push_back(c);
    taken[c.queue] += c.job->devices;
    devices_left -= c.job->devices;
    if (c.own) quota_left -= c.job->devices;
  }
  if (devices_left > 0 || quota_left > 0) return {};
  auto enough = [&](const std::vector<Victim>& set, size_t skip) {
    int64_t freed = 0, freed_quota = 0;
    for (size_t j = 0; j < set.size(); ++j) {
      if (j == skip) continue;
      freed += set[j].job->devices;
      if (set[j].own) freed_quota += set[j].job->devices;
    }
    return freed >= devices && freed_quota >= quota;
  };
  // Victims a later, larger one made unnecessary, the costliest first.
  std::vector<size_t> by_loss(chosen.size());
  for (size_t i = 0; i < by_loss.size(); ++i) by_loss[i] = i;
  std::sort(by_loss.begin(), by_loss.end(),
            [&](size_t a, size_t b) { return chosen[a].lost > chosen[b].lost; });
  std::vector<bool> drop(chosen.size(), false);
  std::vector<Victim> kept = chosen;
  for (size_t i : by_loss) {
    std::vector<Victim> without;
    for (size_t j = 0; j < chosen.size(); ++j) {
      if (j != i && !drop[j]) without.push_back(chosen[j]);
    }
    if (enough(without, without.size())) {
      drop[i] = true;
      kept = std::move(without);
    }
  }
  // One victim that alone is enough may lose less than the set.
  double kept_loss = 0;
  for (const Victim& v : kept) kept_loss += v.lost;
  for (const Victim& c : candidates) {
    // (A candidate of another queue is one whose queue borrows: it may give
    // back any one job.)
    if (c.lost < kept_loss && enough({c}, 1)) {
      kept = {c};
      kept_loss = c.lost;
    }
  }
  return kept;
}

absl::Time Pass::QuotaFreed(int queue, int pool, int64_t devices) const {
  std::vector<EndEntry> ends;
  for (const EndEntry& e : pools_[pool].ends) {
    if (e.job->queue == queues_[queue].name) ends.push_back(e);
  }
  int64_t freed = 0;
  for (const EndEntry& e : ends) {
    if (e.end == absl::InfiniteFuture()) break;
    if ((freed += e.devices) >= devices) return std::max(e.end, now_);
  }
  return absl::InfiniteFuture();
}

void Pass::Reserve(const PendingJob& job, int pool, int64_t need, const InFlight& inflight) {
  PoolState& p = pools_[pool];
  int64_t have = p.free + inflight.devices;
  p.shadow_known = false;
  if (have >= need) {
    p.shadow_known = true;
    p.shadow = now_;
    p.extra = have - need;
    return;
  }
  // The running jobs' ends, with those started in this pass merged in.
  std::vector<EndEntry> started = p.started;
  std::sort(started.begin(), started.end(),
            [](const EndEntry& a, const EndEntry& b) { return a.end < b.end; });
  size_t i = 0, j = 0;
  while (i < p.ends.size() || j < started.size()) {
    const bool take_running =
        j == started.size() || (i < p.ends.size() && p.ends[i].end <= started[j].end);
    const EndEntry& e = take_running ? p.ends[i++] : started[j++];
    if (e.job != nullptr && e.job->preempting && e.job->preempted_for == job.id) continue;
    if (e.end == absl::InfiniteFuture()) return;  // unknown: no backfill
    have += e.devices;
    if (have >= need) {
      p.shadow_known = true;
      p.shadow = std::max(e.end, now_);
      p.extra = have - need;
      return;
    }
  }
}

void Pass::Backfill(const PendingJob& job, int queue, int pool, int64_t room,
                    const std::string& prefix) {
  PoolState& p = pools_[pool];
  const int64_t fitting_size = [&] {
    for (int64_t size : job.sizes) {
      if (size <= std::min(p.free, room)) return size;
    }
    return int64_t{0};
  }();
  if (room < job.sizes.back()) {
    actions_.Wait(job, absl::StrCat(prefix, QuotaReason(queue, pool)));
    return;
  }
  if (fitting_size == 0) {
    actions_.Wait(job, absl::StrCat(prefix, p.behind_reason));
    return;
  }
  if (job.estimate == absl::InfiniteDuration()) {
    actions_.Wait(job, absl::StrCat(prefix, p.behind_reason,
                                    "; without an estimate of its duration "
                                    "(max_duration_seconds) it is not backfilled ahead of it"));
    return;
  }
  if (!p.shadow_known) {
    actions_.Wait(job, absl::StrCat(prefix, p.reservation_reason));
    return;
  }
  const bool ends_before = now_ + job.estimate <= p.shadow;
  int64_t size = fitting_size;
  if (!ends_before) {
    size = 0;
    for (int64_t s : job.sizes) {
      if (s <= std::min(fitting_size, p.extra)) {
        size = s;
        break;
      }
    }
  }
  if (size == 0) {
    actions_.Wait(job, absl::StrCat(prefix, p.reservation_reason));
    return;
  }
  const std::string reason =
      ends_before
          ? absl::StrCat("backfilled: by its estimate it ends before ", p.reservation_reason)
          : absl::StrCat("backfilled on devices job ", p.head->id, " will not need");
  if (!TryStart(job, queue, pool, size, reason)) {
    actions_.Wait(job, absl::StrCat(prefix, "its mesh does not fit the hosts of the ", p.free,
                                    " free devices in pool ", job.pool));
    return;
  }
  if (!ends_before) p.extra -= size;
  ++stats_.backfilled;
}

}  // namespace internal
}  // namespace scheduling
}  // namespace substrax
