#include "worker/collectives/nccl_watchdog.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

// A watchdog whose clock, async error and abort are fields of the fixture.
class NcclWatchdogTest : public ::testing::Test {
 protected:
  NcclWatchdogTest() {
    NcclWatchdog::Options options;
    options.communicator = "axis 'data' group 0";
    options.rank = 2;
    options.size = 4;
    options.self = "device 2 (cuda:2 on host-a)";
    options.clock = [this] { return now_; };
    options.async_error = [this] { return async_; };
    options.last_error = [] { return std::string("NET/IB: connection closed by peer"); };
    options.abort = [this] { ++aborts_; };
    watchdog_ = std::make_unique<NcclWatchdog>(options);
  }

  NcclWatchdog::OpId Register(const std::string& op, absl::Duration timeout, bool* done) {
    absl::StatusOr<NcclWatchdog::OpId> id =
        watchdog_->Register(op, now_ + timeout, [done] { return *done; });
    EXPECT_TRUE(id.ok()) << id.status();
    return *id;
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  int async_ = static_cast<int>(NcclResult::kSuccess);
  int aborts_ = 0;
  std::unique_ptr<NcclWatchdog> watchdog_;
};

TEST_F(NcclWatchdogTest, InProgressKeepsWaitingAndFinishedIsOk) {
  bool done = false;
  async_ = static_cast<int>(NcclResult::kInProgress);
  const auto id = Register("all_reduce", absl::Seconds(30), &done);
  now_ += absl::Seconds(29);
  EXPECT_TRUE(watchdog_->Poll().ok());
  EXPECT_FALSE(watchdog_->Resolved(id));
  EXPECT_EQ(watchdog_->pending(), 1);
  done = true;
  async_ = static_cast<int>(NcclResult::kSuccess);
  EXPECT_TRUE(watchdog_->Poll().ok());
  EXPECT_TRUE(watchdog_->Resolved(id));
  EXPECT_TRUE(watchdog_->Wait(id).ok());
  EXPECT_EQ(aborts_, 0);
  EXPECT_EQ(watchdog_->Wait(id).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NcclWatchdogTest, DeadlineAbortsOnceNamingOpCommunicatorAndRank) {
  bool done = false;
  const auto id = Register("all_gather", absl::Seconds(30), &done);
  now_ += absl::Seconds(30);
  const absl::Status polled = watchdog_->Poll();
  EXPECT_EQ(polled.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(aborts_, 1);
  const absl::Status s = watchdog_->Wait(id);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("all_gather on NCCL communicator 'axis 'data' group 0' (rank 2 of 4"));
  // Later polls and collectives do not abort again; new collectives fail fast.
  now_ += absl::Seconds(60);
  EXPECT_TRUE(watchdog_->Poll().ok());
  EXPECT_EQ(aborts_, 1);
  const auto next = watchdog_->Register("barrier", now_ + absl::Seconds(1), [] { return false; });
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(next.status().message()), HasSubstr("did not complete by its deadline"));
}

TEST_F(NcclWatchdogTest, AsyncErrorAbortsWithTranslatedError) {
  bool done1 = false, done2 = false;
  const auto a = Register("all_reduce", absl::Seconds(30), &done1);
  const auto b = Register("broadcast", absl::Seconds(30), &done2);
  async_ = static_cast<int>(NcclResult::kRemoteError);
  EXPECT_EQ(watchdog_->Poll().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(aborts_, 1);
  for (auto id : {a, b}) {
    const absl::Status s = watchdog_->Wait(id);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(std::string(s.message()), HasSubstr("NET/IB: connection closed by peer"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("ncclRemoteError"));
  }
}

TEST_F(NcclWatchdogTest, AsyncCudaErrorIsInternal) {
  bool done = false;
  const auto id = Register("all_reduce", absl::Seconds(30), &done);
  async_ = static_cast<int>(NcclResult::kUnhandledCudaError);
  watchdog_->Poll().IgnoreError();
  const absl::Status s = watchdog_->Wait(id);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nvidia-smi"));
}

TEST_F(NcclWatchdogTest, DeadPeerAbortsWithUnavailableNamingIt) {
  bool done = false;
  const auto id = Register("reduce_scatter", absl::Seconds(30), &done);
  EXPECT_TRUE(watchdog_->Poll().ok());
  watchdog_->PeerDied("process 3 (worker w-3, host d) died: connection closed without goodbye");
  EXPECT_EQ(aborts_, 0);  // acted on by the next Poll, on the watchdog's thread
  EXPECT_EQ(watchdog_->Poll().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(aborts_, 1);
  const absl::Status s = watchdog_->Wait(id);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("process 3 (worker w-3, host d) died"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("reduce_scatter on NCCL communicator"));
}

TEST_F(NcclWatchdogTest, DeadPeerWithNoPendingOpStillAborts) {
  watchdog_->PeerDied("process 1 died");
  EXPECT_EQ(watchdog_->Poll().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(aborts_, 1);
  EXPECT_EQ(watchdog_->aborted().code(), absl::StatusCode::kUnavailable);
}

TEST_F(NcclWatchdogTest, FinishedOpsStayOkWhenALaterOneTimesOut) {
  bool done1 = true, done2 = false;
  const auto a = Register("all_reduce", absl::Seconds(10), &done1);
  const auto b = Register("all_reduce", absl::Seconds(10), &done2);
  now_ += absl::Seconds(11);
  EXPECT_EQ(watchdog_->Poll().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(watchdog_->Wait(a).ok());
  EXPECT_EQ(watchdog_->Wait(b).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(aborts_, 1);
}

TEST_F(NcclWatchdogTest, DeviceErrorFailsAtOnceAsInternalNotAsTimeout) {
  bool done = false;
  const auto a = Register("all_reduce", absl::Seconds(30), &done);
  absl::StatusOr<NcclWatchdog::OpId> b = watchdog_->Register(
      "all_gather", now_ + absl::Seconds(30),
      [] { return absl::StatusOr<bool>(absl::InternalError("cudaErrorIllegalAddress")); });
  ASSERT_TRUE(b.ok()) << b.status();
  // No time passes: the error is reported by the first poll, long before any deadline.
  const absl::Status polled = watchdog_->Poll();
  EXPECT_EQ(polled.code(), absl::StatusCode::kInternal) << polled;
  EXPECT_NE(polled.message().find("cudaErrorIllegalAddress"), std::string::npos) << polled;
  EXPECT_EQ(watchdog_->Wait(*b).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(watchdog_->Wait(a).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(aborts_, 1);
}

// An op queued behind several steps of compute: its timeout counts from when it starts.
TEST_F(NcclWatchdogTest, QueuedOpTimesOutOnlyAfterItStarted) {
  bool started = false, done = false;
  absl::StatusOr<NcclWatchdog::OpId> id = watchdog_->RegisterQueued(
      "all_reduce (group)", absl::Seconds(30), [&started] { return started; },
      [&done] { return done; });
  ASSERT_TRUE(id.ok()) << id.status();
  now_ += absl::Minutes(5);  // still queued: no deadline yet
  EXPECT_TRUE(watchdog_->Poll().ok());
  EXPECT_FALSE(watchdog_->Resolved(*id));
  started = true;
  EXPECT_TRUE(watchdog_->Poll().ok());  // started now: 30 s from here
  now_ += absl::Seconds(29);
  EXPECT_TRUE(watchdog_->Poll().ok());
  EXPECT_FALSE(watchdog_->Resolved(*id));
  now_ += absl::Seconds(1);
  EXPECT_EQ(watchdog_->Poll().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(watchdog_->Wait(*id).code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(aborts_, 1);
}

TEST_F(NcclWatchdogTest, QueuedOpFinishesAndItsStartErrorIsInternal) {
  bool done = false;
  absl::StatusOr<NcclWatchdog::OpId> ok = watchdog_->RegisterQueued(
      "all_reduce (group)", absl::Seconds(30), [] { return true; }, [&done] { return done; });
  ASSERT_TRUE(ok.ok()) << ok.status();
  done = true;
  EXPECT_TRUE(watchdog_->Poll().ok());
  EXPECT_TRUE(watchdog_->Wait(*ok).ok());
  absl::StatusOr<NcclWatchdog::OpId> bad = watchdog_->RegisterQueued(
      "all_reduce (group)", absl::Seconds(30),
      [] { return absl::StatusOr<bool>(absl::InternalError("cudaErrorLaunchFailure")); },
      [] { return false; });
  ASSERT_TRUE(bad.ok()) << bad.status();
  const absl::Status polled = watchdog_->Poll();
  EXPECT_EQ(polled.code(), absl::StatusCode::kInternal) << polled;
  EXPECT_NE(polled.message().find("cudaErrorLaunchFailure"), std::string::npos) << polled;
  EXPECT_EQ(watchdog_->Wait(*bad).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(aborts_, 1);
}

}  // namespace
}  // namespace substrax
