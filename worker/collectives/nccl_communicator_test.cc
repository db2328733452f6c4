// NcclCommunicator on a real GPU. NCCL refuses two ranks of one communicator on one GPU, and a
// test machine has at most one, so these tests cover single-rank communicators (world size 1:
// all-reduce, all-gather, broadcast, reduce-scatter, barrier, split, device pointers); ranks
// across GPUs are covered by the multi-GPU job tests. Without a GPU (or without
// --config=cuda) every test skips itself with a message.
#include "worker/collectives/nccl_communicator.h"

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "absl/time/clock.h"
#include "worker/collectives/store.h"

#ifdef SUBSTRAX_CUDA
#include <cuda_runtime.h>
#endif

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Skips the calling test unless this is a CUDA build on a machine with a GPU.
#define SKIP_WITHOUT_GPU()                                                              \
  do {                                                                                  \
    if (std::string why = NoGpuReason(); !why.empty()) GTEST_SKIP() << why;             \
  } while (0)

std::string NoGpuReason() {
#ifndef SUBSTRAX_CUDA
  return "built without --config=cuda: no NCCL communicator to test";
#else
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (count == 0) return "no CUDA device: cudaGetDeviceCount returned 0";
  return "";
#endif
}

TEST(NcclCommunicatorTest, WithoutCudaCreateSaysHowToRebuild) {
#ifdef SUBSTRAX_CUDA
  GTEST_SKIP() << "built with --config=cuda: the stub is not in this build";
#else
  InMemoryStore store;
  auto comm = NcclCommunicator::Create(NcclCommunicatorOptions(), &store, 0, 1);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("bazel build --config=cuda"));
#endif
}

TEST(NcclCommunicatorTest, RankOutOfRangeIsInvalidArgument) {
#ifndef SUBSTRAX_CUDA
  GTEST_SKIP() << "built without --config=cuda";
#else
  InMemoryStore store;
  auto comm = NcclCommunicator::Create(NcclCommunicatorOptions(), &store, 2, 2);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
#endif
}

std::unique_ptr<NcclCommunicator> SingleRank(Store* store) {
  NcclCommunicatorOptions options;
  options.self = "device 0 (cuda:0 on test)";
  options.timeout = absl::Seconds(20);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm =
      NcclCommunicator::Create(options, store, 0, 1);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? std::move(*comm) : nullptr;
}

TEST(NcclCommunicatorTest, SingleRankHostCollectives) {
  SKIP_WITHOUT_GPU();
  InMemoryStore store;
  std::unique_ptr<NcclCommunicator> comm = SingleRank(&store);
  ASSERT_NE(comm, nullptr);
  // The unique id went through the store.
  EXPECT_EQ(store.Get("nccl_unique_id", absl::ZeroDuration())->size(), 128u);

  std::vector<float> f = {1.5f, -2.0f, 3.0f};
  ASSERT_TRUE(comm->AllReduce(absl::MakeSpan(f), ReduceOp::kSum).ok());
  EXPECT_THAT(f, ElementsAre(1.5f, -2.0f, 3.0f));
  ASSERT_TRUE(comm->AllReduce(absl::MakeSpan(f), ReduceOp::kMean).ok());
  EXPECT_THAT(f, ElementsAre(1.5f, -2.0f, 3.0f));
  std::vector<double> d = {0.25, 7.0};
  ASSERT_TRUE(comm->AllReduce(absl::MakeSpan(d), ReduceOp::kMax).ok());
  EXPECT_THAT(d, ElementsAre(0.25, 7.0));

  std::vector<float> gathered(3);
  ASSERT_TRUE(comm->AllGather(absl::MakeConstSpan(f), absl::MakeSpan(gathered)).ok());
  EXPECT_THAT(gathered, ElementsAre(1.5f, -2.0f, 3.0f));
  std::vector<double> gathered_d(2);
  ASSERT_TRUE(comm->AllGather(absl::MakeConstSpan(d), absl::MakeSpan(gathered_d)).ok());
  EXPECT_THAT(gathered_d, ElementsAre(0.25, 7.0));

  ASSERT_TRUE(comm->Broadcast(absl::MakeSpan(f), 0).ok());
  EXPECT_THAT(f, ElementsAre(1.5f, -2.0f, 3.0f));
  EXPECT_EQ(comm->Broadcast(absl::MakeSpan(f), 1).code(), absl::StatusCode::kInvalidArgument);

  std::vector<float> scattered(3);
  ASSERT_TRUE(comm->ReduceScatter(f, absl::MakeSpan(scattered), ReduceOp::kSum).ok());
  EXPECT_THAT(scattered, ElementsAre(1.5f, -2.0f, 3.0f));
  EXPECT_TRUE(comm->Barrier().ok());
}

TEST(NcclCommunicatorTest, SingleRankDevicePointersAndSplit) {
  SKIP_WITHOUT_GPU();
#ifdef SUBSTRAX_CUDA
  InMemoryStore store;
  std::unique_ptr<NcclCommunicator> comm = SingleRank(&store);
  ASSERT_NE(comm, nullptr);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 4 * sizeof(float)), cudaSuccess);
  const float in[4] = {1, 2, 3, 4};
  ASSERT_EQ(cudaMemcpy(d, in, sizeof(in), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(comm->AllReduce(d, DataType::kFloat32, 4, ReduceOp::kMin,
                                ExecutionContext::Stream(comm->stream())).ok());
  float out[4] = {};
  ASSERT_EQ(cudaMemcpy(out, d, sizeof(out), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 4));

  absl::StatusOr<std::unique_ptr<NcclCommunicator>> axis = comm->Split(0, 0, "axis 'data'");
  ASSERT_TRUE(axis.ok()) << axis.status();
  EXPECT_EQ((*axis)->size(), 1);
  EXPECT_EQ((*axis)->rank(), 0);
  EXPECT_EQ((*axis)->name(), "axis 'data'");
  std::vector<float> f = {5, 6};
  EXPECT_TRUE((*axis)->AllReduce(absl::MakeSpan(f), ReduceOp::kSum).ok());
  EXPECT_THAT(f, ElementsAre(5, 6));
  EXPECT_EQ(comm->Split(-1, 0, "none").status().code(), absl::StatusCode::kInvalidArgument);
  // The world still works after the split.
  EXPECT_TRUE(comm->Barrier().ok());
  cudaFree(d);
#endif
}

// A group on the caller's stream: the communicator's stream waits for the copy queued before it,
// the caller's stream for the group, and the host for neither (the handle is awaited at the end,
// after many groups, as the step loop does). One rank: the values come back unchanged.
TEST(NcclCommunicatorTest, SingleRankGroupsOrderedOnTheCallersStream) {
  SKIP_WITHOUT_GPU();
#ifdef SUBSTRAX_CUDA
  InMemoryStore store;
  std::unique_ptr<NcclCommunicator> comm = SingleRank(&store);
  ASSERT_NE(comm, nullptr);
  cudaStream_t caller = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&caller, cudaStreamNonBlocking), cudaSuccess);
  float* d = nullptr;
  ASSERT_EQ(cudaMalloc(&d, 8 * sizeof(float)), cudaSuccess);
  std::vector<CollectiveEvent> events;
  for (int round = 0; round < 20; ++round) {
    const float in[8] = {1.0f * round, 2, 3, 4, 5, 6, 7, 8};
    ASSERT_EQ(cudaMemcpyAsync(d, in, sizeof(in), cudaMemcpyHostToDevice, caller), cudaSuccess);
    const ReduceBuffer buckets[] = {{d, 3}, {d + 3, 5}};
    events.push_back(comm->AllReduceGroupAsync(buckets, DataType::kFloat32, ReduceOp::kSum,
                                               ExecutionContext::Stream(caller)));
    float out[8] = {};
    ASSERT_EQ(cudaMemcpyAsync(out, d, sizeof(out), cudaMemcpyDeviceToHost, caller), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(caller), cudaSuccess);
    EXPECT_THAT(out, ElementsAre(1.0f * round, 2, 3, 4, 5, 6, 7, 8)) << "round " << round;
  }
  for (const CollectiveEvent& e : events) EXPECT_TRUE(e.Await().ok()) << e.Await();
  const ReduceBuffer null_bucket[] = {{nullptr, 2}};
  EXPECT_EQ(comm->AllReduceGroupAsync(null_bucket, DataType::kFloat32, ReduceOp::kSum)
                .Await()
                .code(),
            absl::StatusCode::kInvalidArgument);
  cudaFree(d);
  cudaStreamDestroy(caller);
#endif
}

TEST(NcclCommunicatorTest, DeadPeerAbortsAndLaterCallsFailFast) {
  SKIP_WITHOUT_GPU();
  InMemoryStore store;
  std::unique_ptr<NcclCommunicator> comm = SingleRank(&store);
  ASSERT_NE(comm, nullptr);
  comm->PeerDied("process 1 (worker w-1, host b) died: connection closed without goodbye");
  // The watchdog thread aborts within a poll interval; the next collective then fails.
  absl::Status s;
  for (int i = 0; i < 2000 && s.ok(); ++i) {
    s = comm->Barrier();
    if (s.ok()) absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(absl::IsFailedPrecondition(s) || absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("process 1 (worker w-1, host b) died"));
}


#ifdef SUBSTRAX_CUDA
// A 1-rank communicator, a non-blocking stream of the caller's and 4 floats on the device.
struct OneRank {
  InMemoryStore store;
  std::unique_ptr<NcclCommunicator> comm;
  cudaStream_t stream = nullptr;
  float* d = nullptr;

  explicit OneRank(NcclCommunicatorOptions options) {
    options.self = "device 0 (cuda:0 on test)";
    absl::StatusOr<std::unique_ptr<NcclCommunicator>> made =
        NcclCommunicator::Create(options, &store, 0, 1);
    EXPECT_TRUE(made.ok()) << made.status();
    if (made.ok()) comm = *std::move(made);
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&d, 4 * sizeof(float)), cudaSuccess);
  }
  ~OneRank() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
    if (d != nullptr) cudaFree(d);
  }
  absl::Status AllReduce() {
    return comm->AllReduce(d, DataType::kFloat32, 4, ReduceOp::kSum,
                           ExecutionContext::Stream(stream));
  }
};
#endif

// A collective that does not finish within its timeout aborts the communicator: it fails with
// DEADLINE_EXCEEDED within seconds, and every later call fails fast. One GPU has no peer to
// wait for, so the test stalls the communicator's own stream after the collective could start
// (test_stall_after_start), as a hung peer would hold it.
TEST(NcclCommunicatorTest, TimeoutAbortsTheCommunicator) {
  SKIP_WITHOUT_GPU();
#ifdef SUBSTRAX_CUDA
  NcclCommunicatorOptions options;
  options.timeout = absl::Milliseconds(200);
  options.test_stall_after_start = absl::Seconds(2);
  OneRank r(options);
  ASSERT_NE(r.comm, nullptr);
  const absl::Time start = absl::Now();
  const absl::Status s = r.AllReduce();
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  const absl::Status after = r.comm->Barrier();
  EXPECT_TRUE(absl::IsFailedPrecondition(after)) << after;
#endif
}

// Work queued on the caller's stream before a collective does not count against its timeout:
// the host may be steps ahead of the device.
TEST(NcclCommunicatorTest, WorkBeforeTheCollectiveDoesNotCountAgainstItsTimeout) {
  SKIP_WITHOUT_GPU();
#ifdef SUBSTRAX_CUDA
  NcclCommunicatorOptions options;
  options.timeout = absl::Milliseconds(500);
  OneRank r(options);
  ASSERT_NE(r.comm, nullptr);
  ASSERT_EQ(cudaLaunchHostFunc(
                r.stream, [](void*) { absl::SleepFor(absl::Seconds(2)); }, nullptr),
            cudaSuccess);
  const absl::Status s = r.AllReduce();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(r.comm->Barrier().ok());
#endif
}

}  // namespace
}  // namespace substrax
