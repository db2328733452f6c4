#include "coordinator/stragglers.h"

#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::IsEmpty;
using ::testing::SizeIs;

// Generated phase times: each device computes `base` seconds per interval times its `slowness`,
// with uniform noise of +-`noise` (seeded: the same series every run).
class Series {
 public:
  Series(int devices, double noise, uint32_t seed)
      : slowness_(devices, 1.0), noise_(-noise, noise), rng_(seed) {}
  void SetSlowness(int device, double factor) { slowness_[device] = factor; }

  // Feeds step `step` to the detector, device by device; the changes it returned.
  std::vector<StragglerChange> Step(StragglerDetector& d, int64_t step) {
    std::vector<StragglerChange> all;
    for (size_t device = 0; device < slowness_.size(); ++device) {
      PhaseTimes t;
      t.compute_seconds = 0.1 * slowness_[device] * (1 + noise_(rng_));
      t.data_seconds = 0.01 * (1 + noise_(rng_));
      for (const StragglerChange& c : d.Add(step, static_cast<int>(device), t)) all.push_back(c);
    }
    return all;
  }

 private:
  std::vector<double> slowness_;
  std::uniform_real_distribution<double> noise_;
  std::mt19937 rng_;
};

TEST(StragglerDetectorTest, NoisyButEqualDevicesAreNeverFlagged) {
  StragglerDetector d({0, 1, 2, 3});
  Series s(4, /*noise=*/0.3, /*seed=*/1);
  for (int64_t step = 1; step <= 2000; ++step) EXPECT_THAT(s.Step(d, step), IsEmpty()) << step;
  EXPECT_THAT(d.flagged(), IsEmpty());
}

TEST(StragglerDetectorTest, SpikyDataWaitsOfEqualDevicesAreNeverFlagged) {
  // As measured on 2 shared cores: data waits of a fraction of a millisecond with a heavy tail
  // (a prefetch thread starved now and then), compute with 30% noise, a long collective wait.
  StragglerDetector d({0, 1, 2, 3});
  std::mt19937 rng(3);
  std::exponential_distribution<double> spikes(1 / 0.0008);
  std::uniform_real_distribution<double> noise(0.7, 1.3);
  for (int64_t step = 1; step <= 5000; ++step) {
    for (int device = 0; device < 4; ++device) {
      const PhaseTimes t{0.012 * noise(rng), spikes(rng), 0.04 * noise(rng)};
      EXPECT_THAT(d.Add(step, device, t), IsEmpty()) << step;
    }
  }
}

TEST(StragglerDetectorTest, ASlowDeviceIsFlaggedOnceTheWindowSaysSoAndClearedWhenItRecovers) {
  StragglerDetector d({0, 1, 2, 3});
  Series s(4, 0.2, 2);
  for (int64_t step = 1; step <= 20; ++step) ASSERT_THAT(s.Step(d, step), IsEmpty());
  s.SetSlowness(2, 2.0);
  std::vector<StragglerChange> flagged;
  int64_t step = 20;
  while (flagged.empty() && step < 80) flagged = s.Step(d, ++step);
  ASSERT_THAT(flagged, SizeIs(1));
  EXPECT_EQ(flagged[0].device_id, 2);
  EXPECT_EQ(flagged[0].phase, "compute");
  EXPECT_TRUE(flagged[0].flagged);
  EXPECT_GE(flagged[0].ratio, 1.5);
  // Not on its first slow steps: about half the window must say so.
  EXPECT_GE(step, 20 + 5);
  EXPECT_LE(step, 20 + 20);
  EXPECT_THAT(d.flagged(), SizeIs(1));

  s.SetSlowness(2, 1.0);
  std::vector<StragglerChange> cleared;
  while (cleared.empty() && step < 140) cleared = s.Step(d, ++step);
  ASSERT_THAT(cleared, SizeIs(1));
  EXPECT_EQ(cleared[0].device_id, 2);
  EXPECT_FALSE(cleared[0].flagged);
  EXPECT_THAT(d.flagged(), IsEmpty());
}

TEST(StragglerDetectorTest, OneSlowReportIsNotAStraggler) {
  StragglerDetector d({0, 1});
  for (int64_t step = 1; step <= 30; ++step) {
    const double spike = step == 15 ? 5.0 : 1.0;
    EXPECT_THAT(d.Add(step, 0, {0.1 * spike, 0.01}), IsEmpty());
    EXPECT_THAT(d.Add(step, 1, {0.1, 0.01}), IsEmpty());
  }
}

TEST(StragglerDetectorTest, DataWaitIsItsOwnPhase) {
  StragglerDetector d({0, 1, 2});
  std::vector<StragglerChange> changes;
  for (int64_t step = 1; step <= 20; ++step) {
    for (int device : {0, 1, 2}) {
      PhaseTimes t{0.1, device == 1 ? 0.05 : 0.01};
      for (const StragglerChange& c : d.Add(step, device, t)) changes.push_back(c);
    }
  }
  ASSERT_THAT(changes, SizeIs(1));
  EXPECT_EQ(changes[0].device_id, 1);
  EXPECT_EQ(changes[0].phase, "data");
  EXPECT_DOUBLE_EQ(changes[0].ratio, 5.0);
}

TEST(StragglerDetectorTest, APhaseTooSmallToSlowTheJobIsNoise) {
  // Device 0 waits twice as long for data, but 2 ms of a 100 ms interval: not a straggler.
  StragglerDetector d({0, 1, 2});
  for (int64_t step = 1; step <= 40; ++step) {
    for (int device : {0, 1, 2}) {
      EXPECT_THAT(d.Add(step, device, {0.1, device == 0 ? 0.004 : 0.002, 0.01}), IsEmpty());
    }
  }
}

TEST(StragglerDetectorTest, OnlyCompleteStepsCountAndOneDeviceHasNoPeers) {
  StragglerDetector d({0, 1});
  // Device 1 never reports: no step is complete, nothing is evaluated.
  for (int64_t step = 1; step <= 100; ++step) EXPECT_THAT(d.Add(step, 0, {1.0, 0}), IsEmpty());
  // An unknown device and a step already evaluated are ignored.
  StragglerDetector alone({7});
  for (int64_t step = 1; step <= 20; ++step) {
    EXPECT_THAT(alone.Add(step, 7, {1.0, 1.0}), IsEmpty());
    EXPECT_THAT(alone.Add(step, 8, {9.0, 9.0}), IsEmpty());
  }
  EXPECT_THAT(alone.flagged(), IsEmpty());
}

TEST(StragglerDetectorTest, NothingMeasuredIsNothingFlagged) {
  StragglerDetector d({0, 1});
  for (int64_t step = 1; step <= 20; ++step) {
    EXPECT_THAT(d.Add(step, 0, {0, 0}), IsEmpty());
    EXPECT_THAT(d.Add(step, 1, {0, 0.0005}), IsEmpty());
  }
}

}  // namespace
}  // namespace substrax
