// Tests of Cluster: runner logs: shipped pieces, gaps, late pieces, the bound per process, and a
// restart.
#include "coordinator/cluster.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/cluster_test_util.h"
#include "coordinator/state_store.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

v1::ShipLogsRequest Piece(const std::string& job, const std::string& worker, int process,
                          int64_t offset, const std::string& data, bool eof = false) {
  v1::ShipLogsRequest request;
  request.set_job_id(job);
  request.set_attempt(1);
  request.set_worker_id(worker);
  request.set_process_index(process);
  request.set_host(worker == "w-1" ? "a" : "b");
  request.set_offset(offset);
  request.set_data(data);
  request.set_eof(eof);
  return request;
}

TEST_F(ClusterTest, ShipLogsStoresEachByteOnceAndNamesTheOffsetAfterAGap) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));  // process 0 on w-1, 1 on w-2
  absl::StatusOr<int64_t> next = cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\n"));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(*next, 4);
  // A retry, and one that overlaps: only the new bytes are stored.
  EXPECT_EQ(*cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\n")), 4);
  EXPECT_EQ(*cluster_->ShipLogs(Piece(job, "w-1", 0, 2, "e\ntwo\n")), 8);
  absl::StatusOr<int64_t> gap = cluster_->ShipLogs(Piece(job, "w-1", 0, 20, "x"));
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(gap.status().message(), HasSubstr("expected offset 8"));
  std::vector<LogChunk> chunks = *state_.ReadLogChunks(job, 1, 0, 0, 1 << 20);
  std::string stored;
  for (const LogChunk& c : chunks) stored += c.data;
  EXPECT_EQ(stored, "one\ntwo\n");
  EXPECT_EQ(chunks[0].host, "a");

  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-2", 0, 8, "not mine\n")).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(cluster_->ShipLogs(Piece(job, "w-2", 1, 0, "mine\n")).ok());
  v1::ShipLogsRequest later = Piece(job, "w-1", 0, 8, "x\n");
  later.set_attempt(2);
  EXPECT_EQ(cluster_->ShipLogs(later).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->ShipLogs(Piece("nope-9", "w-1", 0, 0, "x\n")).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-1", 0, 8, std::string(64 * 1024 + 1, 'x')))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-1", -1, 8, "x\n")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ClusterTest, LogsArriveAfterTheAttemptEndedAndGoWithTheJob) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "start\n")).ok());
  ASSERT_TRUE(cluster_->CancelJob(job, "").ok());
  // The runner exited after the cancel: its last bytes and its end still come in.
  ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, 6, "stopping\n", /*eof=*/true)).ok());
  std::vector<LogExtent> extents = *state_.LogExtents(job, 1);
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_EQ(extents[0].end, 15);
  EXPECT_TRUE(extents[0].eof);
  ASSERT_TRUE(cluster_->DeleteJob(job).ok());
  EXPECT_TRUE(state_.LogExtents(job, 1)->empty());
  EXPECT_EQ(cluster_->ShipLogs(Piece(job, "w-1", 0, 15, "late\n")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ClusterTest, ARestartedCoordinatorContinuesALogWhereTheStoreEndsIt) {
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\n")).ok());
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  // The daemon, unsure what arrived, ships from 0 again: nothing is stored twice.
  EXPECT_EQ(*cluster_->ShipLogs(Piece(job, "w-1", 0, 0, "one\ntwo\n")), 8);
  absl::StatusOr<std::vector<LogChunk>> chunks = state_.ReadLogChunks(job, 1, 0, 0, 1 << 20);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  std::string stored;
  for (const LogChunk& c : *chunks) stored += c.data;
  EXPECT_EQ(stored, "one\ntwo\n");
}

TEST_F(ClusterTest, EachProcessKeepsAtMostTheNewestLogMaxBytes) {
  options_.log_max_bytes_per_process = 64 * 1024;
  cluster_ = MakeCluster(state_);
  RegisterTwoWorkers();
  const std::string job = Submit(Spec("train", 4));
  const std::string piece(40000, 'x');
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(cluster_->ShipLogs(Piece(job, "w-1", 0, i * 40000, piece)).ok());
  }
  std::vector<LogExtent> extents = *state_.LogExtents(job, 1);
  ASSERT_EQ(extents.size(), 1u);
  EXPECT_EQ(extents[0].begin, 80000);  // the two oldest pieces were dropped
  EXPECT_EQ(extents[0].end, 120000);
}

}  // namespace
}  // namespace substrax
