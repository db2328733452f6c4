// The scheduling policy on fake times: FIFO, priorities, fair share, quotas
// with borrowing and reclaim, backfill (with a property test that it never
// delays the head job), preemption.
#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace scheduling {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1'800'000'000);  // 2027-01-15 08:00:00 UTC

class Recorder : public Actions {
 public:
  bool Start(const PendingJob& job, int64_t devices, const std::string& reason) override {
    if (refuse.count(job.id) > 0) return false;
    started.push_back(job.id);
    sizes[job.id] = devices;
    reasons[job.id] = reason;
    return true;
  }
  void Preempt(const RunningJob& victim, const PendingJob& for_job,
               const std::string& reason) override {
    preempted.push_back(victim.id);
    preempted_for[victim.id] = for_job.id;
    reasons[victim.id] = reason;
  }
  void Wait(const PendingJob& job, const std::string& why) override { waits[job.id] = why; }

  std::set<std::string> refuse;
  std::vector<std::string> started;
  std::vector<std::string> preempted;
  std::map<std::string, int64_t> sizes;
  std::map<std::string, std::string> preempted_for;
  std::map<std::string, std::string> reasons;
  std::map<std::string, std::string> waits;
};

PendingJob Pending(const std::string& id, int64_t size, int64_t order, int32_t priority = 0,
                   const std::string& queue = "default",
                   absl::Duration estimate = absl::InfiniteDuration()) {
  PendingJob job;
  job.id = id;
  job.queue = queue;
  job.priority = priority;
  job.priority_class = priority > 0 ? "high" : "default";
  job.pool = "cuda";
  job.sizes = {size};
  job.order = order;
  job.estimate = estimate;
  return job;
}

RunningJob Running(const std::string& id, int64_t devices, absl::Time expected_end,
                   const std::string& queue = "default", int32_t priority = 0) {
  RunningJob job;
  job.id = id;
  job.queue = queue;
  job.priority = priority;
  job.pool = "cuda";
  job.devices = devices;
  job.started = kT0 - absl::Hours(1);
  job.expected_end = expected_end;
  // It checkpoints: a preemption loses at most the grace period.
  job.last_checkpoint = kT0 - absl::Minutes(10);
  return job;
}

std::map<std::string, PoolDevices> Cuda(int64_t alive, int64_t free) {
  return {{"cuda", PoolDevices{alive, free}}};
}

v1::SchedulingConfig Config(const std::string& yaml) {
  absl::StatusOr<v1::SchedulingConfig> config = ParseSchedulingConfig(yaml, "test.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
  return *config;
}

// research and vision share a cohort, 8 cuda devices each; two priority
// classes.
constexpr const char* kTwoQueues = R"(queues:
  - {name: research, cohort: lab, quotas: [{backend: cuda, devices: 8}]}
  - {name: vision, cohort: lab, quotas: [{backend: cuda, devices: 8, borrowing_limit: 4}]}
priority_classes: [{name: default, value: 0}, {name: high, value: 10}]
)";

TEST(Fifo, TheOldestJobThatDoesNotFitHoldsEveryYoungerOne) {
  v1::SchedulingConfig config = DefaultSchedulingConfig();
  config.set_policy(v1::SCHEDULING_POLICY_FIFO);
  Scheduler s(config);
  Recorder r;
  PassStats stats = s.Schedule(kT0,
                               {Pending("small-old", 2, 1), Pending("big", 8, 2, 5),
                                Pending("small-young", 1, 3, 0, "default", absl::Minutes(1))},
                               {Running("r", 4, kT0 + absl::Hours(1))}, Cuda(8, 4), r);
  EXPECT_THAT(r.started, ElementsAre("small-old"));
  EXPECT_EQ(stats.started, 1);
  EXPECT_EQ(stats.backfilled, 0);
  EXPECT_EQ(r.waits["big"], "8 devices; 2 free of 8 in pool cuda");
  EXPECT_THAT(r.waits["small-young"], HasSubstr("behind job big, the oldest pending job"));
}

TEST(Queues, DefaultConfigurationIsFifoWithBackfill) {
  Scheduler s(DefaultSchedulingConfig());
  Recorder r;
  const absl::Time end = kT0 + absl::Minutes(30);
  s.Schedule(kT0,
             {Pending("big", 8, 1), Pending("no-estimate", 1, 2),
              Pending("short", 2, 3, 0, "default", absl::Minutes(20)),
              Pending("long", 2, 4, 0, "default", absl::Hours(2))},
             {Running("r", 6, end)}, Cuda(8, 2), r);
  EXPECT_THAT(r.started, ElementsAre("short"));
  EXPECT_THAT(r.waits["big"],
              HasSubstr("8 devices; 2 free of 8 in pool cuda; reserved for 08:30:00 UTC"));
  EXPECT_THAT(r.waits["no-estimate"],
              HasSubstr("behind job big, first in line for pool cuda (8 devices, 2 free); "
                        "without an estimate of its duration (max_duration_seconds) it is not "
                        "backfilled ahead of it"));
  EXPECT_THAT(r.waits["long"], HasSubstr("behind job big"));
  EXPECT_THAT(r.reasons["short"], HasSubstr("backfilled"));
}

TEST(Queues, NoBackfillWhileTheShadowTimeIsUnknown) {
  Scheduler s(DefaultSchedulingConfig());
  Recorder r;
  s.Schedule(kT0, {Pending("big", 8, 1), Pending("short", 1, 2, 0, "default", absl::Minutes(1))},
             {Running("r", 6, absl::InfiniteFuture())}, Cuda(8, 2), r);
  EXPECT_THAT(r.started, IsEmpty());
  EXPECT_THAT(r.waits["big"], HasSubstr("no reservation: a running job in pool cuda has no "
                                        "estimate"));
  EXPECT_THAT(r.waits["short"], HasSubstr("whose start no estimate bounds"));
}

TEST(Queues, BackfillUsesTheDevicesTheHeadWillNotNeed) {
  Scheduler s(DefaultSchedulingConfig());
  Recorder r;
  // At 08:30 the head needs 6 of the 8: 2 to spare, so a long 2-device job may
  // run past it.
  s.Schedule(kT0,
             {Pending("head", 6, 1), Pending("long3", 3, 2, 0, "default", absl::Hours(5)),
              Pending("long2", 2, 3, 0, "default", absl::Hours(5))},
             {Running("r", 4, kT0 + absl::Minutes(30))}, Cuda(8, 4), r);
  EXPECT_THAT(r.started, ElementsAre("long2"));
  EXPECT_THAT(r.reasons["long2"], HasSubstr("devices job head will not need"));
  EXPECT_THAT(r.waits["long3"], HasSubstr("the reservation of job head at 08:30:00 UTC"));
}

TEST(Queues, PriorityFirstAndTheReasonNamesThoseAhead) {
  Scheduler s(Config(kTwoQueues));
  Recorder r;
  s.Schedule(kT0,
             {Pending("old-low", 4, 1, 0, "research"), Pending("hi-1", 3, 2, 10, "research"),
              Pending("hi-2", 3, 3, 10, "research")},
             {Running("r", 2, kT0 + absl::Hours(1), "vision")}, Cuda(8, 6), r);
  EXPECT_THAT(r.started, ElementsAre("hi-1", "hi-2"));
  EXPECT_THAT(r.waits["old-low"], HasSubstr("behind 2 jobs of higher priority in queue "
                                            "research; "));
}

TEST(Queues, FairShareOrdersQueuesOfOnePriority) {
  Scheduler s(Config(kTwoQueues));
  Recorder warmup;
  // research ran on 8 devices for an hour; vision on none.
  s.Schedule(kT0, {}, {Running("r", 8, absl::InfiniteFuture(), "research")}, Cuda(16, 8), warmup);
  s.Schedule(kT0 + absl::Hours(1), {}, {Running("r", 8, absl::InfiniteFuture(), "research")},
             Cuda(16, 8), warmup);
  Recorder r;
  s.Schedule(
      kT0 + absl::Hours(1),
      {Pending("research-old", 8, 1, 0, "research"), Pending("vision-new", 8, 2, 0, "vision")}, {},
      Cuda(16, 8), r);
  EXPECT_THAT(r.started, ElementsAre("vision-new"));
  std::vector<QueueStatus> queues = s.Queues();
  ASSERT_EQ(queues.size(), 2u);
  EXPECT_GT(queues[0].fair_share, 0.2);
  EXPECT_EQ(queues[1].fair_share, 0);
  // One half-life later, without new use, research's share has halved.
  Recorder later;
  s.Schedule(kT0 + absl::Hours(2), {}, {}, Cuda(16, 16), later);
  EXPECT_LT(s.Queues()[0].fair_share, queues[0].fair_share * 0.6);
}

TEST(Queues, AReloadKeepsTheFairShareOfQueuesThatRemain) {
  Scheduler s(Config(kTwoQueues));
  Recorder r;
  s.Schedule(kT0, {}, {Running("r", 8, absl::InfiniteFuture(), "research")}, Cuda(16, 8), r);
  s.Schedule(kT0 + absl::Hours(1), {}, {Running("r", 8, absl::InfiniteFuture(), "research")},
             Cuda(16, 8), r);
  const double share = s.Queues()[0].fair_share;
  ASSERT_GT(share, 0);
  s.SetConfig(Config("queues: [{name: research}, {name: audio}]\n"));
  s.Schedule(kT0 + absl::Hours(1), {}, {}, Cuda(16, 16), r);
  std::vector<QueueStatus> queues = s.Queues();
  ASSERT_EQ(queues.size(), 2u);
  EXPECT_EQ(queues[0].name, "research");
  EXPECT_DOUBLE_EQ(queues[0].fair_share, share);
  EXPECT_EQ(queues[1].fair_share, 0);
  EXPECT_TRUE(queues[0].quota.empty());  // no quota entry: no limit
}

TEST(Queues, BorrowsIdleQuotaOfTheCohortWithinItsLimit) {
  Scheduler s(Config(kTwoQueues));
  Recorder r;
  s.Schedule(kT0,
             {Pending("v1", 8, 1, 0, "vision"), Pending("v2", 4, 2, 0, "vision"),
              Pending("v3", 1, 3, 0, "vision")},
             {}, Cuda(16, 16), r);
  // vision: 8 of its own plus at most 4 borrowed.
  EXPECT_THAT(r.started, ElementsAre("v1", "v2"));
  EXPECT_THAT(r.waits["v3"], HasSubstr("queue vision at its quota: 12 of 8 cuda devices in use "
                                       "(4 borrowed from cohort lab)"));
  std::vector<QueueStatus> queues = s.Queues();
  EXPECT_EQ(queues[1].used["cuda"], 12);
  EXPECT_EQ(queues[1].borrowed["cuda"], 4);
  EXPECT_EQ(queues[1].pending["default"], 3);
  Recorder r2;
  s.Schedule(kT0, {Pending("research-1", 8, 4, 0, "research")},
             {Running("v1", 8, absl::InfiniteFuture(), "vision"),
              Running("v2", 4, absl::InfiniteFuture(), "vision")},
             Cuda(16, 4), r2);
  // research is entitled to its 8: vision gives back what it borrowed.
  EXPECT_THAT(r2.preempted, ElementsAre("v2"));
  EXPECT_THAT(r2.waits["research-1"], HasSubstr("preempting v2 (4 devices)"));
}

TEST(Queues, ReclaimPreemptsTheBorrowerThatLosesTheLeastWork) {
  Scheduler s(Config(kTwoQueues));
  Recorder r;
  RunningJob own = Running("v-own", 8, absl::InfiniteFuture(), "vision");
  RunningJob fresh = Running("v-fresh", 2, absl::InfiniteFuture(), "vision");
  fresh.started = kT0 - absl::Minutes(30);
  // Without a checkpoint an hour's work is at risk: never a victim.
  RunningJob stale = Running("v-stale", 2, absl::InfiniteFuture(), "vision");
  stale.last_checkpoint = absl::InfinitePast();
  RunningJob research = Running("r-1", 4, absl::InfiniteFuture(), "research");
  PassStats stats = s.Schedule(kT0, {Pending("r-2", 2, 1, 0, "research")},
                               {own, fresh, stale, research}, Cuda(16, 0), r);
  EXPECT_THAT(r.preempted, ElementsAre("v-fresh"));
  EXPECT_EQ(stats.preempted, 1);
  EXPECT_EQ(r.preempted_for["v-fresh"], "r-2");
  EXPECT_THAT(r.reasons["v-fresh"], HasSubstr("queue research reclaims its quota lent to "
                                              "cohort lab"));
  EXPECT_THAT(r.waits["r-2"], HasSubstr("preempting v-fresh (2 devices)"));

  // The next pass: v-fresh is stopping for r-2; nothing more is preempted, and
  // the free device that appeared waits for r-2 rather than going to a younger
  // job.
  fresh.preempting = true;
  fresh.preempted_for = "r-2";
  Recorder next;
  stats = s.Schedule(
      kT0 + absl::Seconds(5),
      {Pending("r-2", 2, 1, 0, "research"), Pending("v-small", 1, 2, 0, "vision", absl::Hours(1))},
      {own, fresh, stale, research}, Cuda(16, 0), next);
  EXPECT_THAT(next.preempted, IsEmpty());
  EXPECT_THAT(next.started, IsEmpty());
  EXPECT_THAT(next.waits["r-2"], HasSubstr("2 devices of 1 job being preempted for it"));
  // Once the victim is gone, r-2 starts.
  Recorder done;
  s.Schedule(kT0 + absl::Seconds(30), {Pending("r-2", 2, 1, 0, "research")}, {own, stale, research},
             Cuda(16, 2), done);
  EXPECT_THAT(done.started, ElementsAre("r-2"));
}

TEST(Queues, NoReclaimBeyondTheNominalQuota) {
  Scheduler s(Config(kTwoQueues));
  Recorder r;
  // research already holds its 8; a ninth would be borrowing, which preempts
  // nobody.
  s.Schedule(kT0, {Pending("r-9", 1, 1, 0, "research")},
             {Running("r-8", 8, absl::InfiniteFuture(), "research"),
              Running("v-12", 8, absl::InfiniteFuture(), "vision")},
             Cuda(16, 0), r);
  EXPECT_THAT(r.preempted, IsEmpty());
}

TEST(Queues, HigherPriorityPreemptsWithinItsQueueNeverTheUnpreemptible) {
  Scheduler s(Config(kTwoQueues));
  RunningJob pinned = Running("pinned", 4, absl::InfiniteFuture(), "research");
  pinned.preemptible = false;
  // Neither has checkpointed: young risks 3 minutes, old an hour (more than ten grace periods:
  // not a victim).
  RunningJob young = Running("young", 2, absl::InfiniteFuture(), "research");
  young.started = kT0 - absl::Minutes(3);
  young.last_checkpoint = absl::InfinitePast();
  RunningJob old = Running("old", 2, absl::InfiniteFuture(), "research");
  old.last_checkpoint = absl::InfinitePast();
  RunningJob other = Running("other-queue", 8, absl::InfiniteFuture(), "vision");
  Recorder r;
  s.Schedule(kT0, {Pending("urgent", 2, 1, 10, "research")}, {pinned, young, old, other},
             Cuda(16, 0), r);
  // research is at its quota of 8 (no idle quota to borrow): the job of its own queue that
  // loses the least is preempted.
  EXPECT_THAT(r.preempted, ElementsAre("young"));
  EXPECT_THAT(r.reasons["young"], HasSubstr("of higher priority in queue research"));

  Recorder none;
  old.priority = 10;
  young.priority = 10;
  s.Schedule(kT0, {Pending("urgent", 2, 1, 10, "research")}, {pinned, young, old, other},
             Cuda(16, 0), none);
  EXPECT_THAT(none.preempted, IsEmpty());
  EXPECT_THAT(none.waits["urgent"], HasSubstr("queue research at its quota"));
}

TEST(Queues, PreemptsFewestVictimsAfterAGreedyChoice) {
  Scheduler s(DefaultSchedulingConfig());
  std::vector<RunningJob> running;
  for (int i = 0; i < 4; ++i) {
    running.push_back(Running(absl::StrCat("small-", i), 1, absl::InfiniteFuture()));
    running.back().started = kT0 - absl::Minutes(1);
  }
  for (RunningJob& small : running) small.last_checkpoint = absl::InfinitePast();
  running.push_back(Running("big", 4, absl::InfiniteFuture()));
  running.back().last_checkpoint = kT0 - absl::Seconds(20);
  Recorder r;
  s.Schedule(kT0, {Pending("urgent", 4, 1, 10)}, running, Cuda(8, 0), r);
  // The four small ones lost 4 minutes together; the big one 80 s.
  EXPECT_THAT(r.preempted, ElementsAre("big"));
}

TEST(Queues, WaitsRatherThanPreemptWhenDevicesFreeSoonOrVictimsLoseMore) {
  Scheduler s(DefaultSchedulingConfig());
  Recorder soon;
  // The running job ends within ten grace periods: the urgent job waits for it.
  s.Schedule(kT0, {Pending("urgent", 4, 1, 10)}, {Running("ending", 4, kT0 + absl::Minutes(4))},
             Cuda(4, 0), soon);
  EXPECT_THAT(soon.preempted, IsEmpty());
  EXPECT_THAT(soon.waits["urgent"], HasSubstr("reserved for 08:04:00 UTC"));
  // A 1-device job that starts in 20 minutes is not worth 64 devices' grace period (32 min).
  Recorder costly;
  s.Schedule(kT0, {Pending("small", 1, 1, 10)}, {Running("wide", 64, kT0 + absl::Minutes(20))},
             Cuda(64, 0), costly);
  EXPECT_THAT(costly.preempted, IsEmpty());
  Recorder worth;
  s.Schedule(kT0, {Pending("small", 1, 1, 10)}, {Running("wide", 64, kT0 + absl::Hours(2))},
             Cuda(64, 0), worth);
  EXPECT_THAT(worth.preempted, ElementsAre("wide"));
}

TEST(Queues, AStartTheCallerRefusesHoldsTheDevicesAsTheHead) {
  Scheduler s(DefaultSchedulingConfig());
  Recorder r;
  r.refuse.insert("fragmented");
  s.Schedule(kT0,
             {Pending("fragmented", 4, 1), Pending("small", 2, 2, 0, "default", absl::Hours(1))},
             {}, Cuda(8, 4), r);
  EXPECT_THAT(r.started, IsEmpty());
  EXPECT_THAT(r.waits["fragmented"], HasSubstr("its mesh of 4 devices does not fit the hosts"));
  EXPECT_THAT(r.waits["small"], HasSubstr("the reservation of job fragmented"));
}

TEST(Queues, ElasticJobStartsOnFewerDevices) {
  Scheduler s(DefaultSchedulingConfig());
  Recorder r;
  PendingJob elastic = Pending("elastic", 8, 1);
  elastic.sizes = {8, 4, 2};
  s.Schedule(kT0, {elastic}, {}, Cuda(8, 5), r);
  EXPECT_EQ(r.sizes["elastic"], 4);
}

// The simulation of the property test: all jobs are submitted at kT0, every job
// runs exactly its estimate, a pass runs at kT0 and at every end. Returns each
// job's start.
std::map<std::string, absl::Time> Simulate(const std::vector<PendingJob>& jobs,
                                           std::vector<RunningJob> running, int64_t capacity,
                                           bool backfill) {
  Scheduler s(DefaultSchedulingConfig());
  std::map<std::string, absl::Time> starts;
  absl::Time now = kT0;
  while (starts.size() < jobs.size()) {
    std::vector<PendingJob> pending;
    for (const PendingJob& j : jobs) {
      if (starts.count(j.id) > 0) continue;
      pending.push_back(j);
      // Without estimates nothing is backfilled (the running jobs keep theirs).
      if (!backfill) pending.back().estimate = absl::InfiniteDuration();
    }
    int64_t used = 0;
    for (const RunningJob& r : running) used += r.devices;
    Recorder r;
    s.Schedule(now, pending, running, Cuda(capacity, capacity - used), r);
    for (const std::string& id : r.started) {
      starts[id] = now;
      const PendingJob& j =
          *std::find_if(jobs.begin(), jobs.end(), [&](const PendingJob& p) { return p.id == id; });
      RunningJob run = Running(id, r.sizes[id], now + j.estimate);
      run.started = now;
      running.push_back(run);
    }
    absl::Time next = absl::InfiniteFuture();
    for (const RunningJob& run : running) next = std::min(next, run.expected_end);
    if (next == absl::InfiniteFuture()) break;
    now = next;
    running.erase(std::remove_if(running.begin(), running.end(),
                                 [&](const RunningJob& run) { return run.expected_end <= now; }),
                  running.end());
  }
  return starts;
}

TEST(Backfill, NeverDelaysTheHeadJob) {
  absl::BitGen rng;
  int heads = 0, backfilled_runs = 0;
  for (int scenario = 0; scenario < 300; ++scenario) {
    const int64_t capacity = absl::Uniform<int64_t>(rng, 2, 13);
    std::vector<RunningJob> running;
    int64_t used = 0;
    for (int i = 0; used < capacity && i < 4; ++i) {
      const int64_t d = absl::Uniform<int64_t>(absl::IntervalClosed, rng, 1, capacity - used);
      used += d;
      running.push_back(
          Running(absl::StrCat("run-", i), d, kT0 + absl::Minutes(absl::Uniform(rng, 1, 90))));
    }
    std::vector<PendingJob> jobs;
    const int n = absl::Uniform(absl::IntervalClosed, rng, 2, 10);
    for (int i = 0; i < n; ++i) {
      const int64_t size = absl::Uniform<int64_t>(absl::IntervalClosed, rng, 1, capacity);
      jobs.push_back(Pending(absl::StrCat("job-", i), size, i, 0, "default",
                             absl::Minutes(absl::Uniform(rng, 1, 120))));
    }
    const std::map<std::string, absl::Time> without = Simulate(jobs, running, capacity, false);
    const std::map<std::string, absl::Time> with = Simulate(jobs, running, capacity, true);
    ASSERT_EQ(without.size(), jobs.size());
    ASSERT_EQ(with.size(), jobs.size());
    // The head: the first job in order that could not start at once.
    for (const PendingJob& j : jobs) {
      if (without.at(j.id) == kT0) continue;
      ++heads;
      EXPECT_LE(with.at(j.id), without.at(j.id))
          << "scenario " << scenario << ": head " << j.id << " delayed by backfill";
      break;
    }
    for (const PendingJob& j : jobs) {
      if (with.at(j.id) < without.at(j.id)) {
        ++backfilled_runs;
        break;
      }
    }
  }
  // The scenarios exercise the property: most have a head, many a backfilled
  // job.
  EXPECT_GT(heads, 150);
  EXPECT_GT(backfilled_runs, 50);
}

}  // namespace
}  // namespace scheduling
}  // namespace substrax
