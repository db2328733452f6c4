#include "worker/collectives/shm_write_tuner.h"

#include "gtest/gtest.h"

namespace substrax::shm {
namespace {

constexpr size_t kMiB = 1 << 20;

// Runs one period of 1 MiB calls in which a streaming call takes `streaming_us` and a cached one
// `cached_us`; returns the mode in force after it, starting from `streaming`.
bool RunPeriod(WriteTuner& tuner, bool streaming, double streaming_us, double cached_us) {
  bool next = streaming;
  for (int i = 0; i < WriteTuner::kPeriod; ++i) {
    const bool streams = tuner.Streams(kMiB, streaming);
    // The first kTrials calls of a period try the other mode; the rest use the one in force.
    EXPECT_EQ(streams, i < WriteTuner::kTrials ? !streaming : streaming) << "call " << i;
    next = tuner.Record(kMiB, streams, streaming,
                        absl::Microseconds(streams ? streaming_us : cached_us));
    if (i + 1 < WriteTuner::kPeriod) {
      EXPECT_EQ(next, streaming) << "changed mid-period";
    }
  }
  return next;
}

TEST(WriteTunerTest, SwitchesToTheFasterModeAndBackWhenThePlacementChanges) {
  WriteTuner tuner;
  // Cores that share a cache: cached stays.
  EXPECT_FALSE(RunPeriod(tuner, false, 160, 110));
  // They move apart: the trials of streaming win, and streaming comes into force.
  EXPECT_TRUE(RunPeriod(tuner, false, 160, 500));
  EXPECT_TRUE(RunPeriod(tuner, true, 160, 500));
  // Back together: the cached trials win.
  EXPECT_FALSE(RunPeriod(tuner, true, 160, 110));
}

TEST(WriteTunerTest, KeepsTheModeWithinTheMargin) {
  WriteTuner tuner;
  EXPECT_FALSE(RunPeriod(tuner, false, 100, 105));  // 5% faster: not enough
  EXPECT_TRUE(RunPeriod(tuner, true, 105, 100));
}

TEST(WriteTunerTest, SmallCallsUseTheModeInForceAndAreNotCounted) {
  WriteTuner tuner;
  for (int i = 0; i < 10 * WriteTuner::kPeriod; ++i) {
    EXPECT_TRUE(tuner.Streams(WriteTuner::kMinBytes - 4, true));
    // However slow, they decide nothing.
    EXPECT_TRUE(tuner.Record(WriteTuner::kMinBytes - 4, true, true, absl::Seconds(1)));
  }
  // The schedule has not moved: the next large call is the period's first trial.
  EXPECT_FALSE(tuner.Streams(kMiB, true));
}

// Trials are compared with calls of their own size only: a period whose trials were all 1 MiB
// and whose calls in force were all of another size decides nothing.
TEST(WriteTunerTest, ComparesTrialsWithCallsOfTheirSize) {
  WriteTuner tuner;
  bool next = false;
  for (int i = 0; i < WriteTuner::kPeriod; ++i) {
    const size_t bytes = i < WriteTuner::kTrials ? kMiB : 2 * kMiB;
    const bool streams = tuner.Streams(bytes, false);
    // Trials (1 MiB) are much faster per call than the 2 MiB calls in force.
    next = tuner.Record(bytes, streams, false, absl::Microseconds(streams ? 10 : 1000));
  }
  EXPECT_FALSE(next);
}

}  // namespace
}  // namespace substrax::shm
