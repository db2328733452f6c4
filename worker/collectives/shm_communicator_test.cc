// ShmCommunicator in its in-process mode: ranks are threads of this test. Results are checked
// bit for bit against sums in rank order (shm_test_util.h), and against GlooCommunicator's.
#include "worker/collectives/shm_communicator.h"

#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collectives/shm_test_util.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;
using shm_test::CountDifferent;
using shm_test::ExerciseCollectives;
using shm_test::Values;

std::vector<RankInfo> Ranks(int n) {
  std::vector<RankInfo> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back({0, "device " + std::to_string(r), ""});
  return ranks;
}

// Runs `body(comm)` on `n` ranks, one thread each, meeting through one in-memory store.
void OnRanks(int n, const std::function<void(ShmCommunicator&)>& body,
             ShmCommunicatorOptions options = {}) {
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = ShmCommunicator::Create(options, &store, r, Ranks(n), nullptr);
      ASSERT_TRUE(comm.ok()) << comm.status();
      EXPECT_TRUE((*comm)->in_process());
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

class ShmInProcessTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmInProcessTest, EveryCollectiveMatchesTheRankOrderReference) {
  OnRanks(GetParam(), [](ShmCommunicator& comm) {
    int seed = 0;
    for (size_t count : {size_t{1}, size_t{7}, size_t{100}, size_t{40009}}) {
      EXPECT_EQ(ExerciseCollectives(comm, count, ++seed), "");
    }
  });
}

// A large odd count (blocks of unequal sizes, many tiles), every op and type; the references
// are computed once, before the ranks start.
template <typename T>
void LargeAllReduce(int n) {
  constexpr size_t kCount = 1000003;
  const ReduceOp ops[] = {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin};
  std::vector<std::vector<T>> expected;
  for (ReduceOp op : ops) expected.push_back(shm_test::Reference<T>(n, kCount, 9, op));
  std::vector<std::vector<T>> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(Values<T>(r, kCount, 9));
  OnRanks(n, [&](ShmCommunicator& comm) {
    for (size_t k = 0; k < expected.size(); ++k) {
      std::vector<T> data = inputs[comm.rank()];
      ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(data), ops[k]).ok());
      EXPECT_EQ(CountDifferent(data, expected[k]), 0u) << ReduceOpName(ops[k]);
    }
  });
}

TEST_P(ShmInProcessTest, LargeOddAllReduce) {
  LargeAllReduce<float>(GetParam());
  LargeAllReduce<double>(GetParam());
}

TEST_P(ShmInProcessTest, CountZeroAndBackToBack) {
  const int n = GetParam();
  OnRanks(n, [n](ShmCommunicator& comm) {
    std::vector<float> none;
    EXPECT_TRUE(comm.AllReduce(absl::MakeSpan(none), ReduceOp::kSum).ok());
    // Many small collectives in a row, of changing kinds and sizes: a sequencing bug (a rank
    // reading a peer's previous buffer, a barrier counted twice) shows as a wrong value.
    for (int k = 0; k < 200; ++k) {
      const size_t count = 1 + (k * 37) % 300;
      if (k % 3 == 2) {
        ASSERT_TRUE(comm.Barrier().ok());
        std::vector<double> data = Values<double>(comm.rank(), count, k);
        ASSERT_TRUE(comm.Broadcast(absl::MakeSpan(data), k % n).ok());
        ASSERT_EQ(CountDifferent(data, Values<double>(k % n, count, k)), 0u) << k;
        continue;
      }
      std::vector<float> data = Values<float>(comm.rank(), count, k);
      ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(data), ReduceOp::kSum).ok());
      ASSERT_EQ(CountDifferent(data, shm_test::Reference<float>(n, count, k, ReduceOp::kSum)), 0u)
          << k;
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmInProcessTest, ::testing::Values(1, 2, 3, 4));

// Two ranks: every op gives Gloo's bits (a + b is b + a; the mean's scale is the same).
TEST(ShmCommunicatorTest, TwoRanksEqualGloo) {
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      PrefixStore gloo_store(&store, "gloo"), shm_store(&store, "shm");
      auto gloo = GlooCommunicator::Create({}, &gloo_store, r, Ranks(2), nullptr);
      auto shm = ShmCommunicator::Create({}, &shm_store, r, Ranks(2), nullptr);
      ASSERT_TRUE(gloo.ok() && shm.ok()) << gloo.status() << shm.status();
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
        std::vector<float> a = Values<float>(r, 100003, 5), b = a;
        ASSERT_TRUE((*gloo)->AllReduce(absl::MakeSpan(a), op).ok());
        ASSERT_TRUE((*shm)->AllReduce(absl::MakeSpan(b), op).ok());
        EXPECT_EQ(CountDifferent(a, b), 0u) << ReduceOpName(op);
        std::vector<double> c = Values<double>(r, 1001, 6), d = c;
        ASSERT_TRUE((*gloo)->AllReduce(absl::MakeSpan(c), op).ok());
        ASSERT_TRUE((*shm)->AllReduce(absl::MakeSpan(d), op).ok());
        EXPECT_EQ(CountDifferent(c, d), 0u) << ReduceOpName(op);
      }
    });
  }
  for (auto& t : threads) t.join();
}

TEST(ShmCommunicatorTest, BadArguments) {
  InMemoryStore store;
  EXPECT_EQ(ShmCommunicator::Create({}, &store, 2, Ranks(2), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  OnRanks(2, [](ShmCommunicator& comm) {
    std::vector<float> data(4);
    const absl::Status s = comm.AllReduce(data.data(), DataType::kFloat32, data.size(),
                                          ReduceOp::kSum,
                                          ExecutionContext::Stream(reinterpret_cast<CUstream_st*>(1)));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("CUDA stream"));
    // A refused call is not a failure of the group.
    EXPECT_TRUE(comm.AllReduce(absl::MakeSpan(data), ReduceOp::kSum).ok());
  });
}

TEST(ShmCommunicatorTest, MissingPeerAtConnectIsDeadlineExceeded) {
  InMemoryStore store;
  ShmCommunicatorOptions options;
  options.connect_timeout = absl::Milliseconds(200);
  auto comm = ShmCommunicator::Create(options, &store, 0, Ranks(3), nullptr);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("missing: rank 1 (device 1), rank 2 (device 2)"));
}

// A rank whose communicator is destroyed while another waits for it: UNAVAILABLE naming it at
// once (not after the timeout), then FAILED_PRECONDITION.
TEST(ShmCommunicatorTest, DestroyedPeerIsUnavailable) {
  InMemoryStore store;
  ShmCommunicatorOptions options;
  options.timeout = absl::Seconds(60);
  std::vector<RankInfo> ranks = Ranks(2);
  ranks[1].process_name = "worker w-1";
  std::thread leaver([&] {
    auto comm = ShmCommunicator::Create(options, &store, 1, ranks, nullptr);
    ASSERT_TRUE(comm.ok()) << comm.status();
  });  // destroyed at once
  auto comm = ShmCommunicator::Create(options, &store, 0, ranks, nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status();
  leaver.join();
  const absl::Time start = absl::Now();
  std::vector<float> data(1000, 1.0f);
  absl::Status s = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 1 (device 1, worker w-1) left"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  s = (*comm)->Barrier();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
}

// A rank that never calls: the others fail with DEADLINE_EXCEEDED naming it within about the
// timeout; when it calls at last, the group is unusable.
TEST(ShmCommunicatorTest, StuckPeerTimesOut) {
  InMemoryStore store;
  ShmCommunicatorOptions options;
  options.timeout = absl::Milliseconds(300);
  absl::Notification others_failed;
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto comm = ShmCommunicator::Create(options, &store, r, Ranks(3), nullptr);
      ASSERT_TRUE(comm.ok()) << comm.status();
      ASSERT_TRUE((*comm)->Barrier().ok());
      std::vector<double> data(100, 1.0);
      if (r == 2) {
        ASSERT_TRUE(others_failed.WaitForNotificationWithTimeout(absl::Seconds(60)));
        const absl::Status s = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        return;
      }
      const absl::Time start = absl::Now();
      const absl::Status s = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("not arrived: rank 2 (device 2)"));
      EXPECT_LT(absl::Now() - start, absl::Seconds(5));
      EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kFailedPrecondition);
      // Both have failed once the second gets here (the first may still be failing: fine, it
      // no longer reads anyone's buffers).
      if (r == 1) others_failed.Notify();
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

// Ranks that call different collectives (one skipped an all-reduce and called its next): no
// rank touches another's buffers (a larger count would read past the smaller buffer); each
// waits out the timeout as for a hang and fails naming every rank's call; the group is
// unusable afterwards.
TEST(ShmCommunicatorTest, DesyncedRanksFailWithoutTouchingEachOthersBuffers) {
  InMemoryStore store;
  ShmCommunicatorOptions options;
  options.timeout = absl::Milliseconds(300);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto comm = ShmCommunicator::Create(options, &store, r, Ranks(2), nullptr);
      ASSERT_TRUE(comm.ok()) << comm.status();
      std::vector<float> data(r == 0 ? 4 : 4096, 1.0f);
      const absl::Status s = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
      EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr("desync: the ranks called different collectives (rank 0 (device 0) "
                            "called all_reduce of 4 float32 values, rank 1 (device 1) called "
                            "all_reduce of 4096 float32 values)"));
      for (float v : data) ASSERT_EQ(v, 1.0f);
      EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kFailedPrecondition);
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace substrax
