#include "coordinator/hang_attribution.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kData[] = "axis 'data' group 0";

// A job of 2 processes x 2 devices, all 4 ranks of one data axis, every rank at collective
// #`n` (waiting in it) unless changed.
class Job {
 public:
  explicit Job(int64_t n) {
    for (int p = 0; p < 2; ++p) {
      ProcessView& v = views_.emplace_back();
      v.name = "process " + std::to_string(p) + " (worker w-" + std::to_string(p) + ")";
      v.has_activity = true;
      for (int d = 2 * p; d < 2 * p + 2; ++d) {
        v1::DeviceActivity* a = v.activity.add_devices();
        a->set_device_id(d);
        a->set_step(812);
        a->set_phase("collective");
        a->mutable_since()->set_seconds(1796579000);  // 2026-12-06 17:43:20 UTC
        Counter(d, kData, n, n - 1, "all_reduce", 1024);
      }
    }
  }
  v1::CollectiveCounter* Counter(int device, const std::string& group, int64_t entered,
                                 int64_t completed, const std::string& kind, int64_t count) {
    v1::CollectiveCounter* c = views_[device / 2].activity.add_collectives();
    c->set_group(group);
    c->set_device_id(device);
    c->set_rank(device);
    c->set_size(4);
    c->set_entered(entered);
    c->set_completed(completed);
    c->set_last_kind(kind);
    c->set_last_count(count);
    return c;
  }
  v1::CollectiveCounter* Find(int device, const std::string& group) {
    for (v1::CollectiveCounter& c : *views_[device / 2].activity.mutable_collectives()) {
      if (c.device_id() == device && c.group() == group) return &c;
    }
    return nullptr;
  }
  v1::DeviceActivity* Device(int device) {
    return views_[device / 2].activity.mutable_devices(device % 2);
  }
  std::vector<ProcessView>& views() { return views_; }

 private:
  std::vector<ProcessView> views_;
};

TEST(HangAttributionTest, TheRankThatHasNotEnteredIsNamedWithWhatItDoesInstead) {
  Job job(4061);
  // Device 3 never entered #4061: it is still in compute.
  job.Find(3, kData)->set_entered(4060);
  job.Find(3, kData)->set_completed(4060);
  job.Device(3)->set_phase("compute");
  const HangAttribution a = AttributeHang(job.views());
  ASSERT_TRUE(a.found);
  EXPECT_EQ(a.summary,
            "all_reduce #4061 over axis 'data' group 0 entered by 3 of 4 ranks; rank 3 (device 3 "
            "of process 1 (worker w-1)) has not entered it: in compute since 17:43:20 UTC "
            "(step 812)");
  EXPECT_THAT(a.blamed, ElementsAre(1));

  // With its log: its last whole lines are quoted; the others' are not.
  job.views()[0].log_tail = "step 811\nstep 812\n";
  job.views()[1].log_tail = "loading shard 7\n\nstep 811\nstep 812\nwaiting for the NFS mount\n";
  EXPECT_THAT(AttributeHang(job.views()).summary,
              ::testing::EndsWith("(step 812); last log lines of process 1 (worker w-1): "
                                  "'step 811' | 'step 812' | 'waiting for the NFS mount'"));
  job.views()[1].log_tail = "tail of a cut line\nwhole\n" + std::string(kHangLogTailBytes, ' ');
  EXPECT_THAT(AttributeHang(job.views()).summary,
              ::testing::EndsWith("last log lines of process 1 (worker w-1): 'whole'"));
}

TEST(HangAttributionTest, ARankBehindBecauseItWaitsElsewhereIsNotBlamed) {
  Job job(100);
  // The world group: device 1 is behind there, but it waits in the data axis like the others;
  // device 2 is behind in the data axis and waits nowhere: it is the one.
  for (int d = 0; d < 4; ++d) job.Counter(d, "world", d == 1 ? 6 : 7, d == 1 ? 6 : 6, "barrier", 0);
  job.Find(2, kData)->set_entered(99);
  job.Find(2, kData)->set_completed(99);
  job.Find(2, "world")->set_completed(7);  // not waiting anywhere
  job.Device(2)->set_phase("data");
  const HangAttribution a = AttributeHang(job.views());
  ASSERT_TRUE(a.found);
  EXPECT_THAT(a.summary, HasSubstr("rank 2 (device 2 of process 1 (worker w-1)) has not entered"));
  EXPECT_THAT(a.summary, HasSubstr("in data since"));
  EXPECT_THAT(a.summary, Not(HasSubstr("rank 1 ")));
  EXPECT_THAT(a.blamed, ElementsAre(1));
}

TEST(HangAttributionTest, RanksInDifferentCollectivesAtTheSameCountAreADesync) {
  Job job(50);
  // Device 1 skipped all-reduce #50 of 5 values: its #50 is the next one, of 80,000.
  for (int d = 0; d < 4; ++d) job.Find(d, kData)->set_last_count(d == 1 ? 80000 : 5);
  const HangAttribution a = AttributeHang(job.views());
  ASSERT_TRUE(a.found);
  EXPECT_THAT(a.summary, HasSubstr("desync over axis 'data' group 0 at collective #50: 3 of 4 "
                                   "ranks are in all_reduce of 5 values, but rank 1 (device 1 of "
                                   "process 0 (worker w-0)) is in all_reduce of 80000 values"));
  EXPECT_THAT(a.blamed, ElementsAre(0));
}

TEST(HangAttributionTest, AProcessThatRelaysNothingShowsNoSignOfLife) {
  Job job(10);
  job.views()[1].has_activity = false;
  job.views()[1].activity.Clear();
  const HangAttribution a = AttributeHang(job.views());
  ASSERT_TRUE(a.found);
  EXPECT_THAT(a.summary, HasSubstr("process 1 (worker w-1): no sign of life"));
  EXPECT_THAT(a.blamed, ElementsAre(1));
}

TEST(HangAttributionTest, AStoppedProcessIsSaidToBe) {
  Job job(10);
  job.Find(2, kData)->set_entered(9);
  job.Find(2, kData)->set_completed(9);
  job.views()[1].suspended = true;
  const HangAttribution a = AttributeHang(job.views());
  ASSERT_TRUE(a.found);
  EXPECT_THAT(a.summary, HasSubstr("rank 2 (device 2 of process 1 (worker w-1)) has not entered "
                                   "it: its process is stopped by a signal"));
}

TEST(HangAttributionTest, AStallOfManyRanksNamesTheFirstOnesNotAll) {
  // 64 processes of one device each; all but process 0 have not entered #10.
  std::vector<ProcessView> views(64);
  for (int p = 0; p < 64; ++p) {
    views[p].name = "process " + std::to_string(p);
    views[p].has_activity = true;
    views[p].log_tail = "line of " + std::to_string(p) + "\n";
    v1::CollectiveCounter* c = views[p].activity.add_collectives();
    c->set_group(kData);
    c->set_device_id(p);
    c->set_rank(p);
    c->set_size(64);
    c->set_entered(p == 0 ? 10 : 9);
    c->set_completed(9);
  }
  const HangAttribution a = AttributeHang(views);
  ASSERT_TRUE(a.found);
  EXPECT_EQ(a.blamed.size(), 63u);
  EXPECT_THAT(a.summary, HasSubstr("rank 8 (device 8 of process 8) has not entered it"));
  EXPECT_THAT(a.summary, Not(HasSubstr("rank 9 (")));
  EXPECT_THAT(a.summary, HasSubstr("; and 55 more"));
  EXPECT_THAT(a.summary, HasSubstr("last log lines of process 2: 'line of 2'"));
  EXPECT_THAT(a.summary, Not(HasSubstr("line of 3")));
  EXPECT_LT(a.summary.size(), 2000u);
}

TEST(HangAttributionTest, NothingWaitingIsNothingFound) {
  Job job(10);
  for (int d = 0; d < 4; ++d) job.Find(d, kData)->set_completed(10);
  EXPECT_FALSE(AttributeHang(job.views()).found);
  // Every rank waits in the same collective: a slow collective, not one rank's fault.
  Job same(10);
  EXPECT_FALSE(AttributeHang(same.views()).found);
  EXPECT_FALSE(AttributeHang({}).found);
  // No process relays anything (agents of an older release, or the counters off): unknown.
  std::vector<ProcessView> blind(2);
  EXPECT_FALSE(AttributeHang(blind).found);
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

// A command job's process whose report file last had a line at `at` (step `step`); none if
// `at` is 0.
ProcessView Command(int p, int64_t at, int64_t step) {
  ProcessView v;
  v.name = "process " + std::to_string(p) + " (worker w-" + std::to_string(p) + ")";
  v.has_activity = true;
  v.device_ids = {p};
  if (at > 0) {
    v1::DeviceActivity* d = v.activity.add_devices();
    d->set_device_id(p);
    d->set_phase("report");
    d->set_step(step);
    d->mutable_since()->set_seconds(at);
  }
  return v;
}

constexpr int64_t kNow = 1796579000;  // 2026-12-06 17:43:20 UTC

TEST(CommandStallTest, TheProcessWhoseReportFileWentSilentFirstIsBlamed) {
  // Process 1 stopped at step 40; processes 0 and 2 still write heartbeats (waiting for it).
  const HangAttribution a = AttributeCommandStall(
      {Command(0, kNow, 40), Command(1, kNow - 30, 40), Command(2, kNow - 1, 40)});
  ASSERT_TRUE(a.found);
  EXPECT_EQ(a.summary,
            "device 1 (process 1 (worker w-1)) stopped reporting at 17:42:50 UTC (step 40); the "
            "others "
            "reported until 17:43:20 UTC (a process whose report file still has heartbeats is "
            "alive, waiting)");
  EXPECT_THAT(a.blamed, ElementsAre(1));
}

TEST(CommandStallTest, AProcessWithNoLineAtAllIsBlamedAndNothingKnownIsNothingFound) {
  const HangAttribution a = AttributeCommandStall({Command(0, kNow, 3), Command(1, 0, 0)});
  ASSERT_TRUE(a.found);
  EXPECT_THAT(a.summary, HasSubstr("device 1 (process 1 (worker w-1)) has written no report line"));
  EXPECT_THAT(a.blamed, ElementsAre(1));
  // Every process went silent together, or none reports: no process to name.
  EXPECT_FALSE(AttributeCommandStall({Command(0, kNow, 3), Command(1, kNow - 1, 3)}).found);
  EXPECT_FALSE(AttributeCommandStall({Command(0, 0, 0), Command(1, 0, 0)}).found);
}

TEST(CommandStallTest, OneSilentDeviceOfAProcessWhoseOtherDeviceStillReportsIsNamed) {
  ProcessView two = Command(1, kNow, 20);  // device 1 heartbeats
  two.device_ids = {1, 2};
  v1::DeviceActivity* silent = two.activity.add_devices();
  silent->set_device_id(2);
  silent->set_phase("report");
  silent->set_step(20);
  silent->mutable_since()->set_seconds(kNow - 10);
  const HangAttribution a = AttributeCommandStall({Command(0, kNow, 20), two});
  ASSERT_TRUE(a.found);
  EXPECT_THAT(a.summary, ::testing::StartsWith("device 2 (process 1 (worker w-1)) stopped "
                                               "reporting at 17:43:10 UTC (step 20); the others"));
  EXPECT_THAT(a.blamed, ElementsAre(1));
}

}  // namespace
}  // namespace substrax
