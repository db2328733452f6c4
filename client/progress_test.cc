#include "client/progress.h"

#include <string>
#include <vector>

#include "client/format.h"
#include "gtest/gtest.h"

namespace substrax::ctl {
namespace {

v1::Job Running(int64_t step, int64_t total) {
  v1::Job job;
  job.set_id("mnist-3");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_attempt(1);
  job.mutable_progress()->set_step(step);
  job.mutable_progress()->set_total_steps(total);
  job.mutable_progress()->set_samples_per_second(1234.4);
  (*job.mutable_progress()->mutable_metrics())["loss"] = 0.51234;
  (*job.mutable_progress()->mutable_metrics())["accuracy"] = 0.81;
  (*job.mutable_progress()->mutable_metrics())["step"] = static_cast<double>(step);
  return job;
}

TEST(RenderBarTest, FullBlocksPartialEighthAndPadding) {
  EXPECT_EQ(RenderBar(0, 4), "    ");
  EXPECT_EQ(RenderBar(1, 4), "████");
  EXPECT_EQ(RenderBar(0.5, 4), "██  ");
  EXPECT_EQ(RenderBar(0.5625, 4), "██▎ ");  // 2.25 cells
  EXPECT_EQ(RenderBar(2, 3), "███");        // clamped
  EXPECT_EQ(RenderBar(-1, 3), "   ");
  EXPECT_EQ(DisplayWidth(RenderBar(0.37, 17)), 17u);
}

TEST(RenderProgressTest, PlainLineForLogsAndPipes) {
  EXPECT_EQ(RenderProgress(Running(120, 1000), absl::Seconds(65), {false, 80}),
            "step 120/1000 (12.0%)  loss=0.5123  accuracy=0.8100  samples/s=1234  eta 1m05s");
  EXPECT_EQ(RenderProgress(Running(0, 1000), std::nullopt, {false, 80}),
            "step 0/1000 (0.0%)  loss=0.5123  accuracy=0.8100  samples/s=1234");
}

TEST(RenderProgressTest, TerminalBarFitsTheWidth) {
  const std::string wide = RenderProgress(Running(500, 1000), absl::Seconds(65), {true, 200});
  EXPECT_EQ(wide, "|" + RenderBar(0.5, 30) +
                      "| 500/1000 50%  loss=0.5123  accuracy=0.8100  1234 samples/s  ETA 1m05s");
  // Narrower: loss only, then without the throughput, the bar always at least 10 wide.
  EXPECT_EQ(RenderProgress(Running(500, 1000), absl::Seconds(65), {true, 80}),
            "|" + RenderBar(0.5, 24) + "| 500/1000 50%  loss=0.5123  1234 samples/s  ETA 1m05s");
  EXPECT_EQ(RenderProgress(Running(500, 1000), absl::Seconds(65), {true, 50}),
            "|" + RenderBar(0.5, 10) + "| 500/1000 50%  loss=0.5123  ETA 1m05s");
  for (int columns : {100, 90, 80, 75, 60, 50}) {
    SCOPED_TRACE(columns);
    const std::string line = RenderProgress(Running(500, 1000), absl::Seconds(65), {true, columns});
    EXPECT_LE(DisplayWidth(line), static_cast<size_t>(columns - 1)) << line;
    EXPECT_NE(line.find("█"), std::string::npos) << line;
  }
  // Too narrow for a bar of 10: the text alone, cut to fit.
  const std::string narrow = RenderProgress(Running(500, 1000), absl::Seconds(65), {true, 30});
  EXPECT_EQ(narrow, "500/1000 50%  loss=0.5123  ET");
}

TEST(RenderProgressTest, LossTrendAfterTheLoss) {
  const std::vector<double> losses = {2.0, 1.2, 0.9, 0.7, 0.6, 0.51234};
  // Plain lines (logs, pipes): ASCII.
  EXPECT_EQ(RenderProgress(Running(500, 1000), std::nullopt, {false, 80}, losses),
            "step 500/1000 (50.0%)  loss=0.5123 trend=^-..__  accuracy=0.8100  samples/s=1234");
  // A UTF-8 terminal: blocks; an ASCII terminal: the ASCII glyphs.
  EXPECT_EQ(RenderProgress(Running(500, 1000), std::nullopt, {true, 200, true}, losses),
            "|" + RenderBar(0.5, 30) +
                "| 500/1000 50%  loss=0.5123 █▄▃▂▁▁  accuracy=0.8100  1234 samples/s");
  EXPECT_EQ(RenderProgress(Running(500, 1000), std::nullopt, {true, 200, false}, losses),
            "|" + RenderBar(0.5, 30) +
                "| 500/1000 50%  loss=0.5123 ^-..__  accuracy=0.8100  1234 samples/s");
  // One loss is no trend yet.
  EXPECT_EQ(RenderProgress(Running(500, 1000), std::nullopt, {false, 80}, {0.5}),
            "step 500/1000 (50.0%)  loss=0.5123  accuracy=0.8100  samples/s=1234");
  // The trend is the last thing to go as the terminal narrows.
  EXPECT_EQ(RenderProgress(Running(500, 1000), absl::Seconds(65), {true, 50, true}, losses),
            "|" + RenderBar(0.5, 10) + "| 500/1000 50%  loss=0.5123  ETA 1m05s");
  EXPECT_EQ(RenderProgress(Running(500, 1000), absl::Seconds(65), {true, 57, true}, losses),
            "|" + RenderBar(0.5, 10) + "| 500/1000 50%  loss=0.5123 █▄▃▂▁▁  ETA 1m05s");
}

TEST(EtaEstimatorTest, RateSinceFirstObservationRestartsWhenStepsGoBack) {
  EtaEstimator eta;
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  EXPECT_FALSE(eta.Remaining(1000).has_value());
  eta.Observe(t0, 100);
  EXPECT_FALSE(eta.Remaining(1000).has_value());  // one point is no rate
  eta.Observe(t0 + absl::Seconds(10), 200);        // 10 steps/s
  EXPECT_EQ(*eta.Remaining(1000), absl::Seconds(80));
  eta.Observe(t0 + absl::Seconds(20), 50);  // restarted from a checkpoint
  EXPECT_FALSE(eta.Remaining(1000).has_value());
  eta.Observe(t0 + absl::Seconds(25), 100);
  EXPECT_EQ(*eta.Remaining(1000), absl::Seconds(90));
}

TEST(RenderStateChangeTest, NamesTheStateAttemptAndLatestReason) {
  v1::Job job = Running(0, 10);
  auto* t = job.add_transitions();
  t->set_to(v1::JOB_STATE_RUNNING);
  t->set_reason("scheduled on 4 devices of 2 workers");
  t = job.add_transitions();
  t->set_to(v1::JOB_STATE_PENDING);
  t->set_reason("worker local-1 lease expired");
  t = job.add_transitions();
  t->set_to(v1::JOB_STATE_RUNNING);
  t->set_reason("restarted from step 0");
  job.set_attempt(2);
  EXPECT_EQ(RenderStateChange(job), "job mnist-3 RUNNING (attempt 2): restarted from step 0");
}

}  // namespace
}  // namespace substrax::ctl
