// The scheduling policy: which pending jobs start, which running jobs are preempted for them,
// and why the others wait. Pure: no lock, no RPC, no clock of its own (every pass is given its
// `now`), no devices (counts per pool; the caller places meshes). Cluster::ScheduleLocked runs
// one pass over the coordinator's state; //bench:scheduling runs the same passes over a
// simulated cluster (docs/scheduling.md has the model).
//
// Two policies (v1::SchedulingPolicy):
//   FIFO   submission order over the whole cluster: the oldest job that does not fit in the
//          free devices holds every younger one. No quotas, no preemption.
//   QUEUES the order is priority (higher first), then the fair share of the job's queue (its
//          dominant share of devices: the largest over pools of its decayed device-seconds over
//          those of the pool's capacity, half-life fair_share_window_seconds; lower first), then
//          age (`order`). A job starts when it fits in the free devices of its pool and its
//          queue stays within its quota: nominal devices plus what it may borrow (the idle
//          nominal quota of its cohort's other queues, at most borrowing_limit). The first job
//          in that order that fits its quota but not the free devices is the pool's head: it
//          gets a reservation at the earliest time the running jobs' expected ends free enough
//          devices ("shadow time"), and a younger job starts before it only if it fits now and
//          either ends (by its estimate) before the shadow time or uses only devices the head
//          will not need then (backfill); a job without an estimate is never backfilled, and
//          no job is backfilled while the shadow time is unknown (a running job of the pool
//          has no expected end). The head may preempt, when the free devices plus those of
//          running jobs it may preempt would hold it: jobs of its queue with a lower priority,
//          and jobs of other queues of its cohort while their queue is above its nominal quota
//          and the head's is below its own (reclaim). Victims are chosen to lose the least
//          work: the least device-seconds since their newest checkpoint (or start), then the
//          lowest priority, then the youngest; only preemptible ones, never one already being
//          preempted. While victims stop, their devices count for the head, which waits.
//
// No limit: a queue without a quota entry for a pool has no limit in that pool (it neither
// borrows nor lends there, and nothing is reclaimed from it). DefaultSchedulingConfig's one
// queue has no entry at all, so QUEUES with it is submission order (within a priority) plus
// backfill of the jobs with estimates. A job whose queue a reload removed runs without limit.
// Preemption, in detail: a job with preemptions in flight for it (or whose victims stopped
// within the grace period plus five minutes) comes first in the order, so that no other head
// takes its devices and preempts again; within a priority, jobs of queues below their nominal
// quota come before those that would borrow. The head waits instead of preempting when the
// running jobs' expected ends give it its devices (and its quota) within ten grace periods, or
// when the victims would lose more device-time than it would wait. A job that has checkpointed
// is expected to write a final checkpoint when asked (it loses at most the grace period); one
// that would lose more than ten grace periods of work is never a victim (a job that cannot
// checkpoint is preempted early in its run or not at all). The greedy choice takes the least
// work lost per device first, then drops victims a later one made unnecessary, and prefers
// one victim alone when it loses less than the set.
//
// Not thread-safe: one caller at a time (the Cluster, under its lock).
#ifndef SUBSTRAX_COORDINATOR_SCHEDULER_H_
#define SUBSTRAX_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "substrax/v1/scheduling.pb.h"

namespace substrax {
namespace scheduling {

// A pending job the caller found schedulable now (not backing off, able to fit the alive
// workers when idle).
struct PendingJob {
  std::string id;
  std::string queue;
  int32_t priority = 0;
  std::string priority_class;
  // The backend's pool: "cpu" or "cuda".
  std::string pool;
  // The device counts it can run on, largest first (an elastic data axis gives several).
  std::vector<int64_t> sizes;
  // Submission order: smaller is older.
  int64_t order = 0;
  // How long it will run once started; InfiniteDuration: unknown (never backfilled).
  absl::Duration estimate = absl::InfiniteDuration();
};

struct RunningJob {
  std::string id;
  std::string queue;
  int32_t priority = 0;
  std::string priority_class;
  std::string pool;
  int64_t devices = 0;
  // This attempt's start.
  absl::Time started = absl::InfinitePast();
  // When it is expected to end (its estimate); InfiniteFuture: unknown.
  absl::Time expected_end = absl::InfiniteFuture();
  // May be preempted (spec.preemptible).
  bool preemptible = true;
  // Being preempted now, for `preempted_for`: its devices are on their way to that job.
  bool preempting = false;
  std::string preempted_for;
  // Its newest checkpoint's time; InfinitePast: none (a preemption loses all since `started`).
  absl::Time last_checkpoint = absl::InfinitePast();
};

// The devices of a pool: alive ones, and those not held by a running job.
struct PoolDevices {
  int64_t alive = 0;
  int64_t free = 0;
};

// What a pass asks of its caller, in the order decided.
class Actions {
 public:
  virtual ~Actions() = default;
  // Starts `job` on `devices` of the pool's free devices. Returns false when the free devices
  // cannot hold its mesh after all (the pass then treats the job as not fitting).
  virtual bool Start(const PendingJob& job, int64_t devices, const std::string& reason) = 0;
  // Asks `victim` to checkpoint and stop so that `for_job` can start.
  virtual void Preempt(const RunningJob& victim, const PendingJob& for_job,
                       const std::string& reason) = 0;
  // `job` keeps waiting; `why` completes "waiting for ..." ("4 free devices; behind 2 jobs of
  // higher priority in queue research").
  virtual void Wait(const PendingJob& job, const std::string& why) = 0;
};

// One queue as `queues` shows it.
struct QueueStatus {
  std::string name;
  std::string cohort;
  // Per pool: nominal quota, devices held by running jobs, of those borrowed.
  std::map<std::string, int64_t> quota;
  std::map<std::string, int64_t> used;
  std::map<std::string, int64_t> borrowed;
  // Pending jobs by priority class, as of the last pass.
  std::map<std::string, int64_t> pending;
  double fair_share = 0;
};

// What one pass did.
struct PassStats {
  int64_t started = 0;
  int64_t backfilled = 0;
  int64_t preempted = 0;
};

// Reads a configuration file's YAML (the fields of v1::SchedulingConfig by name, like a job
// spec), applies the defaults and validates it. Errors: INVALID_ARGUMENT naming each problem
// ("queues[1].quotas[0].backend: unknown backend 'tpu'", a repeated queue or class name, a
// default naming nothing, a negative quota, a name that is not a DNS-1123 label).
absl::StatusOr<v1::SchedulingConfig> ParseSchedulingConfig(const std::string& yaml,
                                                           const std::string& source);
// The configuration without a file: the QUEUES policy, one queue "default" with no quota limit,
// one priority class "default" of value 0.
v1::SchedulingConfig DefaultSchedulingConfig();

class Scheduler {
 public:
  // `config` as ParseSchedulingConfig or DefaultSchedulingConfig returns it.
  explicit Scheduler(v1::SchedulingConfig config);

  const v1::SchedulingConfig& config() const { return config_; }
  // Replaces the configuration (a reload); fair-share history is kept for queues that remain.
  void SetConfig(v1::SchedulingConfig config);

  // Admission at submit: the queue and priority class a job gets (empty names: the defaults),
  // or why not. Errors: INVALID_ARGUMENT (an unknown queue or class, naming those that exist),
  // PERMISSION_DENIED (the submitter is none of the queue's owners or roles; `admin` may submit
  // anywhere), RESOURCE_EXHAUSTED (the job's smallest size is more than its queue could ever
  // hold in `pool`: nominal quota plus the most it may borrow; naming the queue and its quota).
  struct Admission {
    std::string queue;
    std::string priority_class;
    int32_t priority = 0;
  };
  absl::StatusOr<Admission> Admit(const std::string& queue, const std::string& priority_class,
                                  const std::string& pool, int64_t smallest_size,
                                  const std::string& owner, const std::vector<std::string>& roles,
                                  bool admin) const;

  // One pass at `now`: accounts the running jobs' use since the last pass (fair share), then
  // decides as the policy says, calling `actions`. `pools`: by pool name.
  PassStats Schedule(absl::Time now, const std::vector<PendingJob>& pending,
                     const std::vector<RunningJob>& running,
                     const std::map<std::string, PoolDevices>& pools, Actions& actions);

  // The queues as of the last pass.
  std::vector<QueueStatus> Queues() const;

 private:
  v1::SchedulingConfig config_;
  // Decayed device-seconds per queue and pool, as of `accounted_at_`.
  std::map<std::string, std::map<std::string, double>> usage_;
  absl::Time accounted_at_ = absl::InfinitePast();
  std::vector<QueueStatus> last_queues_;
  // Jobs that running jobs were preempted for, and when: first in order until they start (the
  // victims' devices are theirs once the victims have stopped), for at most the grace period
  // plus five minutes.
  std::map<std::string, absl::Time> claims_;
};

}  // namespace scheduling
}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_SCHEDULER_H_
