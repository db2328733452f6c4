#include "worker/collectives/nccl_errors.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

NcclCall Call() {
  NcclCall call;
  call.op = "all_reduce";
  call.communicator = "world";
  call.rank = 1;
  call.size = 4;
  call.self = "device 1 (cuda:1 on host-a)";
  return call;
}

struct Row {
  int result;
  absl::StatusCode code;
  const char* says;
};

TEST(NcclErrorsTest, EveryResultMapsByRetrySemantics) {
  const Row table[] = {
      {0, absl::StatusCode::kOk, ""},
      {1, absl::StatusCode::kInternal, "check the GPU (nvidia-smi, dmesg)"},
      {2, absl::StatusCode::kUnavailable, "a peer died or a connection to it broke"},
      {3, absl::StatusCode::kInternal, "internal NCCL error"},
      {4, absl::StatusCode::kInvalidArgument, "rejected the arguments"},
      {5, absl::StatusCode::kFailedPrecondition, "current state"},
      {6, absl::StatusCode::kUnavailable, "a peer died or a connection to it broke"},
      {7, absl::StatusCode::kOk, ""},  // in progress: keep polling, not an error
      {42, absl::StatusCode::kInternal, "unknown NCCL result"},
  };
  for (const Row& row : table) {
    SCOPED_TRACE(NcclResultName(row.result));
    const absl::Status s = TranslateNcclResult(row.result, "the last error text", Call());
    EXPECT_EQ(s.code(), row.code);
    if (s.ok()) continue;
    const std::string m(s.message());
    EXPECT_THAT(m, HasSubstr(row.says));
    EXPECT_THAT(m, HasSubstr("all_reduce on NCCL communicator 'world' (rank 1 of 4, device 1"));
    EXPECT_THAT(m, HasSubstr("the last error text"));
    EXPECT_THAT(m, HasSubstr(NcclResultName(row.result)));
  }
}

TEST(NcclErrorsTest, RemoteErrorNamesTheDeadPeer) {
  NcclCall call = Call();
  call.peers = "process 2 (worker w-2, host b; rank 2) died";
  const absl::Status s = TranslateNcclResult(NcclResult::kRemoteError, "", call);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("process 2 (worker w-2, host b; rank 2) died"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("(nccl: ncclRemoteError)"));
}

TEST(NcclErrorsTest, Names) {
  EXPECT_EQ(NcclResultName(6), "ncclRemoteError");
  EXPECT_EQ(NcclResultName(8), "ncclResult 8");
}

}  // namespace
}  // namespace substrax
