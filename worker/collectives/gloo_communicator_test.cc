#include "worker/collectives/gloo_communicator.h"

#include <cmath>
#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::vector<RankInfo> Ranks(int n) {
  std::vector<RankInfo> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back({0, "device " + std::to_string(r), ""});
  return ranks;
}

// Runs `body(comm)` on `n` ranks, one thread each, connected through one in-memory store.
void OnRanks(int n, const std::function<void(Communicator&)>& body,
             GlooCommunicatorOptions options = {}) {
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      auto comm = GlooCommunicator::Create(options, &store, r, Ranks(n), nullptr);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

class GlooCommunicatorTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCommunicatorTest, AllReduceEveryOp) {
  const int n = GetParam();
  OnRanks(n, [n](Communicator& comm) {
    const int r = comm.rank();
    // Several collectives in a row: the runtime's tags keep them apart.
    std::vector<float> sum = {float(r), 1.0f, float(r * r)};
    ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(sum), ReduceOp::kSum).ok());
    EXPECT_FLOAT_EQ(sum[0], n * (n - 1) / 2.0f);
    EXPECT_FLOAT_EQ(sum[1], n);
    std::vector<double> mean = {double(r)};
    ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(mean), ReduceOp::kMean).ok());
    EXPECT_DOUBLE_EQ(mean[0], (n - 1) / 2.0);
    std::vector<float> mx = {float(r), -float(r)};
    ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(mx), ReduceOp::kMax).ok());
    EXPECT_THAT(mx, ElementsAre(n - 1, 0));
    std::vector<double> mn = {double(r) + 0.5};
    ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(mn), ReduceOp::kMin).ok());
    EXPECT_DOUBLE_EQ(mn[0], 0.5);
  });
}

TEST_P(GlooCommunicatorTest, LargeAllReduceIsExact) {
  const int n = GetParam();
  OnRanks(n, [n](Communicator& comm) {
    std::vector<float> data(1 << 20);
    for (size_t i = 0; i < data.size(); ++i) data[i] = float((i % 1000) + comm.rank());
    ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(data), ReduceOp::kSum).ok());
    int wrong = 0;
    for (size_t i = 0; i < data.size(); ++i) {
      wrong += data[i] != float(n * (i % 1000) + n * (n - 1) / 2);
    }
    EXPECT_EQ(wrong, 0);
  });
}

// A grouped all-reduce (the step loop's buckets): every buffer reduced, empty ones skipped, one
// handle for them all; a null buffer refused before anything is sent.
TEST_P(GlooCommunicatorTest, AllReduceGroupReducesEveryBuffer) {
  const int n = GetParam();
  OnRanks(n, [n](Communicator& comm) {
    std::vector<float> flat = {1, 2, 3, 4, 5};
    for (float& v : flat) v += static_cast<float>(comm.rank());
    const ReduceBuffer buckets[] = {{flat.data(), 2}, {flat.data() + 2, 0}, {flat.data() + 2, 3}};
    CollectiveEvent group =
        comm.AllReduceGroupAsync(buckets, DataType::kFloat32, ReduceOp::kMean);
    ASSERT_TRUE(group.Await().ok()) << group.Await();
    EXPECT_TRUE(group.IsReady());
    const float shift = (n - 1) / 2.0f;
    EXPECT_THAT(flat, ElementsAre(1 + shift, 2 + shift, 3 + shift, 4 + shift, 5 + shift));
    const ReduceBuffer null_bucket[] = {{nullptr, 1}};
    EXPECT_EQ(comm.AllReduceGroupAsync(null_bucket, DataType::kFloat32, ReduceOp::kSum)
                  .Await()
                  .code(),
              absl::StatusCode::kInvalidArgument);
  });
}

TEST_P(GlooCommunicatorTest, GatherBroadcastScatterBarrier) {
  const int n = GetParam();
  OnRanks(n, [n](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> mine = {float(r), float(10 * r)};
    std::vector<float> all(2 * n);
    ASSERT_TRUE(comm.AllGather(mine, absl::MakeSpan(all)).ok());
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(all[2 * k], k);
      EXPECT_EQ(all[2 * k + 1], 10 * k);
    }
    std::vector<double> d = {r + 0.25};
    std::vector<double> dall(n);
    ASSERT_TRUE(comm.AllGather(d, absl::MakeSpan(dall)).ok());
    EXPECT_DOUBLE_EQ(dall[n - 1], n - 1 + 0.25);

    std::vector<float> b = {float(r), float(r)};
    ASSERT_TRUE(comm.Broadcast(absl::MakeSpan(b), n - 1).ok());
    EXPECT_THAT(b, ElementsAre(n - 1, n - 1));

    std::vector<float> in(3 * n);
    for (int i = 0; i < 3 * n; ++i) in[i] = float(i);
    std::vector<float> block(3);
    ASSERT_TRUE(comm.ReduceScatter(in, absl::MakeSpan(block), ReduceOp::kSum).ok());
    EXPECT_THAT(block, ElementsAre(n * 3 * r, n * (3 * r + 1), n * (3 * r + 2)));

    EXPECT_TRUE(comm.Barrier().ok());
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooCommunicatorTest, ::testing::Values(1, 2, 3, 4));

TEST(GlooCommunicatorArgsTest, BadArgumentsAreRejectedBeforeAnythingIsSent) {
  OnRanks(2, [](Communicator& comm) {
    std::vector<float> in(2), out(3);
    absl::Status s = comm.AllGather(in, absl::MakeSpan(out));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("needs an output of 4, got 3"));
    std::vector<float> odd(3), block(1);
    EXPECT_THAT(std::string(comm.ReduceScatter(odd, absl::MakeSpan(block), ReduceOp::kSum).message()),
                HasSubstr("do not split into 2 equal blocks"));
    EXPECT_THAT(std::string(comm.Broadcast(absl::MakeSpan(in), 2).message()),
                HasSubstr("root 2 is not a rank"));
    // The group still works after rejected calls.
    std::vector<float> one = {1};
    ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(one), ReduceOp::kSum).ok());
    EXPECT_EQ(one[0], 2);
  });
  InMemoryStore store;
  EXPECT_EQ(GlooCommunicator::Create({}, &store, 3, Ranks(2), nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlooCommunicatorArgsTest, MissingPeerAtConnectIsDeadlineExceeded) {
  InMemoryStore store;
  GlooCommunicatorOptions options;
  options.connect_timeout = absl::Milliseconds(300);
  auto comm = GlooCommunicator::Create(options, &store, 0, Ranks(2), nullptr);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(comm.status().message()),
              HasSubstr("connecting communicator 'world' (rank 0 of 2, device 0)"));
}

// A peer that never calls the collective: the others time out with DEADLINE_EXCEEDED (nobody
// died), and the communicator refuses further work with FAILED_PRECONDITION.
TEST(GlooCommunicatorArgsTest, StuckPeerTimesOut) {
  GlooCommunicatorOptions options;
  options.timeout = absl::Milliseconds(500);
  absl::Notification done;
  InMemoryStore store;
  std::thread stuck([&] {
    auto comm = GlooCommunicator::Create(options, &store, 1, Ranks(2), nullptr);
    ASSERT_TRUE(comm.ok());
    done.WaitForNotificationWithTimeout(absl::Seconds(30));
  });
  auto comm = GlooCommunicator::Create(options, &store, 0, Ranks(2), nullptr);
  ASSERT_TRUE(comm.ok()) << comm.status();
  std::vector<float> data(16);
  absl::Status s = (*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("every peer is still alive"));
  EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  done.Notify();
  stuck.join();
}

}  // namespace
}  // namespace substrax
