#include "worker/collectives/gloo_errors.h"

#include "gloo/common/error.h"
#include "gloo/common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

CollectiveCall Call() {
  CollectiveCall call;
  call.op = "all_reduce";
  call.communicator = "world";
  call.rank = 0;
  call.size = 4;
  call.self = "device 0 (cpu:0 on host-a)";
  call.ranks_of_process = {{0, 1}, {2, 3}};
  return call;
}

template <typename E>
GlooErrorKind Classify(const E& e, std::string* message) {
  try {
    throw e;
  } catch (...) {
    return ClassifyCurrentGlooException(message);
  }
}

TEST(GlooErrorsTest, ClassifiesEachExceptionType) {
  std::string message;
  EXPECT_EQ(Classify(gloo::IoException("Connection closed by peer [127.0.0.1]:4000"), &message),
            GlooErrorKind::kIo);
  EXPECT_THAT(message, HasSubstr("Connection closed"));
  EXPECT_EQ(Classify(gloo::IoException("Timed out waiting 2000ms for recv operation"), &message),
            GlooErrorKind::kTimeout);
  EXPECT_EQ(Classify(gloo::EnforceNotMet("f.cc", 1, "x == y", "sizes differ"), &message),
            GlooErrorKind::kMisuse);
  EXPECT_EQ(Classify(gloo::InvalidOperationException("closed"), &message),
            GlooErrorKind::kInvalidOperation);
  EXPECT_EQ(Classify(std::runtime_error("boom"), &message), GlooErrorKind::kOther);
}

// The table: every kind, with and without a known death.
TEST(GlooErrorsTest, MapsEveryKindToItsRetryCode) {
  const std::vector<PeerMonitor::Death> none;
  const std::vector<PeerMonitor::Death> dead = {
      {1, absl::Now(), "its connection closed without goodbye"}};
  struct Row {
    GlooErrorKind kind;
    bool with_death;
    absl::StatusCode code;
    const char* fragment;
  };
  const Row table[] = {
      {GlooErrorKind::kIo, true, absl::StatusCode::kUnavailable,
       "process 1 (ranks 2, 3) died: its connection closed without goodbye"},
      {GlooErrorKind::kTimeout, true, absl::StatusCode::kUnavailable, "process 1 (ranks 2, 3) died"},
      {GlooErrorKind::kIo, false, absl::StatusCode::kUnavailable, "a connection to a peer broke"},
      {GlooErrorKind::kTimeout, false, absl::StatusCode::kDeadlineExceeded,
       "did not complete within its timeout"},
      {GlooErrorKind::kMisuse, false, absl::StatusCode::kInvalidArgument, "gloo rejected the call"},
      {GlooErrorKind::kMisuse, true, absl::StatusCode::kInvalidArgument, "gloo rejected the call"},
      {GlooErrorKind::kInvalidOperation, false, absl::StatusCode::kFailedPrecondition,
       "current state"},
      {GlooErrorKind::kOther, false, absl::StatusCode::kInternal, "gloo says"},
  };
  for (const Row& row : table) {
    absl::Status s = TranslateGlooError(row.kind, "gloo says", Call(), row.with_death ? dead : none);
    EXPECT_EQ(s.code(), row.code) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(row.fragment)) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("all_reduce on communicator 'world' (rank 0 of 4, device 0 (cpu:0 on "
                          "host-a)) failed"));
  }
}

TEST(GlooErrorsTest, DeathNamesTheWorkerWhenKnown) {
  CollectiveCall call = Call();
  call.process_names = {"worker w-1 (host a)", "worker w-2 (host b)"};
  absl::Status s = TranslateGlooError(GlooErrorKind::kIo, "x", call,
                                      {{1, absl::Now(), "its connection closed without goodbye"}});
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("process 1 (worker w-2 (host b), ranks 2, 3) died"));
}

TEST(GlooErrorsTest, DeathOfAProcessOutsideTheGroupSaysSo) {
  absl::Status s = TranslateGlooError(GlooErrorKind::kIo, "x", Call(),
                                      {{7, absl::Now(), "its connection failed: reset"}});
  EXPECT_THAT(std::string(s.message()), HasSubstr("process 7 (no ranks of this group) died"));
}

}  // namespace
}  // namespace substrax
