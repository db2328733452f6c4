#include "agent/log_shipper.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

// Behaves as the coordinator's ShipLogs does for one log: bytes it has are ignored, a gap is
// FAILED_PRECONDITION naming the expected offset; it can fail the next calls with UNAVAILABLE
// or answer every call with an error.
class FakeSink : public LogSink {
 public:
  absl::StatusOr<int64_t> Ship(const v1::ShipLogsRequest& request, absl::Time) override {
    absl::MutexLock lock(&mu_);
    ++calls_;
    max_piece_ = std::max(max_piece_, request.data().size());
    if (unavailable_ > 0) {
      --unavailable_;
      return absl::UnavailableError("coordinator restarting");
    }
    if (!refuse_.ok()) return refuse_;
    const int64_t have = static_cast<int64_t>(data_.size());
    if (request.offset() > have) {
      return absl::FailedPreconditionError(
          absl::StrCat("the log has a gap: got offset ", request.offset(), ", expected offset ",
                       have));
    }
    const size_t skip = static_cast<size_t>(have - request.offset());
    if (skip < request.data().size()) data_ += request.data().substr(skip);
    eof_ = eof_ || request.eof();
    worker_ = request.worker_id();
    return static_cast<int64_t>(data_.size());
  }
  void Cancel() override {}

  std::string data() {
    absl::MutexLock lock(&mu_);
    return data_;
  }
  bool eof() {
    absl::MutexLock lock(&mu_);
    return eof_;
  }
  // Waits until the sink holds `n` bytes (the shipper ships while the runner runs).
  bool AwaitBytes(size_t n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return data_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout);
  }
  void FailNext(int n) {
    absl::MutexLock lock(&mu_);
    unavailable_ = n;
  }
  void Refuse(absl::Status status) {
    absl::MutexLock lock(&mu_);
    refuse_ = std::move(status);
  }
  // Forgets everything after `n` bytes (a coordinator that lost what it had queued).
  void Truncate(size_t n) {
    absl::MutexLock lock(&mu_);
    data_.resize(n);
  }
  size_t max_piece() {
    absl::MutexLock lock(&mu_);
    return max_piece_;
  }
  std::string worker() {
    absl::MutexLock lock(&mu_);
    return worker_;
  }

 private:
  absl::Mutex mu_;
  std::string data_ ABSL_GUARDED_BY(mu_);
  bool eof_ ABSL_GUARDED_BY(mu_) = false;
  int unavailable_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status refuse_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
  size_t max_piece_ ABSL_GUARDED_BY(mu_) = 0;
  std::string worker_ ABSL_GUARDED_BY(mu_);
};

class LogShipperTest : public ::testing::Test {
 protected:
  LogShipperTest() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    path_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/",
                         ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".log");
    std::ofstream(path_, std::ios::trunc).close();
    options_.worker_id = "w-1";
    options_.host = "host-a";
    options_.interval = absl::Milliseconds(10);
    options_.initial_backoff = absl::Milliseconds(5);
    options_.max_backoff = absl::Milliseconds(20);
    options_.log = [this](const std::string& line) {
      absl::MutexLock lock(&mu_);
      lines_.push_back(line);
    };
  }

  void Append(const std::string& text) {
    std::ofstream out(path_, std::ios::app | std::ios::binary);
    out << text;
  }
  std::string Logged() {
    absl::MutexLock lock(&mu_);
    std::string all;
    for (const std::string& line : lines_) absl::StrAppend(&all, line, "\n");
    return all;
  }

  std::string path_;
  LogShipperOptions options_;
  FakeSink sink_;
  absl::Mutex mu_;
  std::vector<std::string> lines_ ABSL_GUARDED_BY(mu_);
};

TEST_F(LogShipperTest, ShipsLinesWhileTheRunnerRunsThenTheRestWithItsEnd) {
  LogShipper shipper(options_, &sink_);
  shipper.Add("job-1", 1, 0, path_);
  Append("step 1\n");
  ASSERT_TRUE(sink_.AwaitBytes(7, absl::Seconds(10))) << "nothing shipped while running";
  EXPECT_FALSE(sink_.eof());
  Append("step 2\nno newline yet");
  shipper.Ended("job-1", 1, 0);
  ASSERT_TRUE(shipper.AwaitShipped("job-1", 1, 0, absl::Seconds(10)));
  EXPECT_EQ(sink_.data(), "step 1\nstep 2\nno newline yet");
  EXPECT_TRUE(sink_.eof());
  EXPECT_EQ(sink_.worker(), "w-1");
  EXPECT_TRUE(shipper.Pending().empty());
}

TEST_F(LogShipperTest, ABigLogGoesInPiecesOfAtMostTheChunkSize) {
  options_.max_chunk_bytes = 1000;
  options_.max_chunks_per_round = 3;
  std::string big;
  for (int i = 0; i < 2000; ++i) absl::StrAppend(&big, "line ", i, "\n");
  Append(big);
  LogShipper shipper(options_, &sink_);
  shipper.Add("job-1", 1, 0, path_);
  shipper.Ended("job-1", 1, 0);
  ASSERT_TRUE(shipper.AwaitShipped("job-1", 1, 0, absl::Seconds(10)));
  EXPECT_EQ(sink_.data(), big);
  EXPECT_TRUE(sink_.eof());
  EXPECT_LE(sink_.max_piece(), 1000u);
}

TEST_F(LogShipperTest, RetriesWhileTheCoordinatorIsUnavailable) {
  sink_.FailNext(5);
  Append("a\nb\n");
  LogShipper shipper(options_, &sink_);
  shipper.Add("job-1", 2, 1, path_);
  shipper.Ended("job-1", 2, 1);
  ASSERT_TRUE(shipper.AwaitShipped("job-1", 2, 1, absl::Seconds(10)));
  EXPECT_EQ(sink_.data(), "a\nb\n");
  EXPECT_TRUE(sink_.eof());
}

TEST_F(LogShipperTest, ResumesFromTheOffsetTheCoordinatorExpectsAfterAGap) {
  LogShipper shipper(options_, &sink_);
  shipper.Add("job-1", 1, 0, path_);
  Append("0123456789\n");
  ASSERT_TRUE(sink_.AwaitBytes(11, absl::Seconds(10)));
  sink_.Truncate(4);  // the coordinator lost bytes 4..10
  Append("more\n");
  shipper.Ended("job-1", 1, 0);
  ASSERT_TRUE(shipper.AwaitShipped("job-1", 1, 0, absl::Seconds(10)));
  EXPECT_EQ(sink_.data(), "0123456789\nmore\n");
}

TEST_F(LogShipperTest, GivesUpALogTheCoordinatorRefusesAndSaysSo) {
  sink_.Refuse(absl::NotFoundError("no job job-1"));
  Append("x\n");
  LogShipper shipper(options_, &sink_);
  shipper.Add("job-1", 1, 0, path_);
  ASSERT_TRUE(shipper.AwaitShipped("job-1", 1, 0, absl::Seconds(10)));
  EXPECT_TRUE(shipper.Pending().empty());
  EXPECT_NE(Logged().find("no job job-1"), std::string::npos) << Logged();
}

TEST_F(LogShipperTest, ALogNotShippedToItsEndIsPending) {
  sink_.Refuse(absl::UnavailableError("down"));
  LogShipper shipper(options_, &sink_);
  shipper.Add("job-1", 3, 0, path_);
  shipper.Ended("job-1", 3, 0);
  EXPECT_FALSE(shipper.AwaitShipped("job-1", 3, 0, absl::Milliseconds(100)));
  ASSERT_EQ(shipper.Pending().size(), 1u);
  EXPECT_EQ(shipper.Pending()[0], std::make_pair(std::string("job-1"), 3));
}

TEST(ExpectedOffsetTest, ReadsTheOffsetOfAGapOnly) {
  EXPECT_EQ(ExpectedOffset(absl::FailedPreconditionError("gap: got offset 9, expected offset 42")),
            42);
  EXPECT_EQ(ExpectedOffset(absl::FailedPreconditionError("the attempt ended")), -1);
  EXPECT_EQ(ExpectedOffset(absl::NotFoundError("expected offset 42")), -1);
}

}  // namespace
}  // namespace substrax
