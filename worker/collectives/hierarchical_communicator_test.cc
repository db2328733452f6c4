#include "worker/collectives/hierarchical_communicator.h"

#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collectives/gloo_communicator.h"
#include "worker/collectives/store.h"

namespace substrax {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::vector<RankInfo> Ranks(int n, const std::string& what) {
  std::vector<RankInfo> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back({0, absl::StrCat(what, " rank ", r), ""});
  return ranks;
}

std::unique_ptr<Communicator> Gloo(Store* base, const std::string& prefix, int rank, int size,
                                   const GlooCommunicatorOptions& options) {
  PrefixStore store(base, prefix);
  GlooCommunicatorOptions named = options;
  named.name = prefix;
  auto comm = GlooCommunicator::Create(named, &store, rank, Ranks(size, prefix), nullptr);
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

// Rank `rank`'s parts, connected in the order every rank follows: local, leaders, all.
HierarchicalParts Connect(Store* store, const std::vector<std::string>& hosts, int rank,
                          const GlooCommunicatorOptions& options) {
  const HostTopology topology(hosts);
  const int h = topology.host_index[rank];
  HierarchicalParts parts;
  parts.local = Gloo(store, absl::StrCat("local/", h), topology.local_rank[rank],
                     static_cast<int>(topology.ranks_of_host[h].size()), options);
  if (topology.is_leader(rank)) {
    parts.leaders = Gloo(store, "leaders", h, topology.num_hosts(), options);
  }
  parts.all = Gloo(store, "all", rank, static_cast<int>(hosts.size()), options);
  return parts;
}

// Runs `body(comm)` on every rank of a group whose rank r is on hosts[r], one thread each;
// `wrap` may replace a rank's parts before the communicator is made of them.
void OnRanks(const std::vector<std::string>& hosts, const std::function<void(Communicator&)>& body,
             const std::function<void(int, HierarchicalParts&)>& wrap = nullptr,
             GlooCommunicatorOptions options = {}) {
  InMemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    threads.emplace_back([&, r] {
      HierarchicalParts parts = Connect(&store, hosts, r, options);
      if (wrap) wrap(r, parts);
      auto comm = HierarchicalCommunicator::Create("test group", hosts, r, std::move(parts));
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
}

const std::vector<std::string> kTwoByTwo = {"a", "a", "b", "b"};
const std::vector<std::string> kUneven = {"a", "a", "a", "b", "b", "c"};

TEST(HostTopologyTest, HostsInOrderOfTheirFirstRank) {
  const HostTopology t({"b", "a", "b", "c", "a"});
  EXPECT_THAT(t.hosts, ElementsAreArray({"b", "a", "c"}));
  EXPECT_THAT(t.host_index, ElementsAreArray({0, 1, 0, 2, 1}));
  EXPECT_THAT(t.local_rank, ElementsAreArray({0, 0, 1, 0, 1}));
  EXPECT_EQ(t.leader_of_host(1), 1);
  EXPECT_TRUE(t.is_leader(3));
  EXPECT_FALSE(t.is_leader(4));
}

class HierarchicalTest : public ::testing::TestWithParam<std::vector<std::string>> {};

template <typename T>
void ExpectEveryOp(Communicator& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  // Small integers: every summation order gives the exact sum.
  std::vector<T> sum = {T(r + 1), T(1), T(r * r)};
  ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(sum), ReduceOp::kSum).ok());
  EXPECT_EQ(sum, (std::vector<T>{T(n * (n + 1) / 2), T(n), T((n - 1) * n * (2 * n - 1) / 6)}));
  std::vector<T> mean = {T(r + 1), T(2 * r)};
  ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(mean), ReduceOp::kMean).ok());
  // The mean of every rank (not of host means), scaled once by 1/size as Gloo does.
  const T scale = T(1) / T(n);
  EXPECT_EQ(mean, (std::vector<T>{T(n * (n + 1) / 2) * scale, T(n * (n - 1)) * scale}));
  std::vector<T> mx = {T(r), -T(r)};
  ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(mx), ReduceOp::kMax).ok());
  EXPECT_EQ(mx, (std::vector<T>{T(n - 1), T(0)}));
  std::vector<T> mn = {T(r) + T(0.5), -T(r)};
  ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(mn), ReduceOp::kMin).ok());
  EXPECT_EQ(mn, (std::vector<T>{T(0.5), -T(n - 1)}));
}

TEST_P(HierarchicalTest, AllReduceEveryOpAndType) {
  OnRanks(GetParam(), [](Communicator& comm) {
    ExpectEveryOp<float>(comm);
    ExpectEveryOp<double>(comm);
  });
}

// Values whose sums round: every rank ends with the same bits, run after run, and the mean is
// that of every rank within rounding.
TEST_P(HierarchicalTest, AllReduceIsBitwiseReproducible) {
  const std::vector<std::string> hosts = GetParam();
  const int n = static_cast<int>(hosts.size());
  const size_t count = 1000;
  std::vector<std::vector<std::vector<float>>> runs(2, std::vector<std::vector<float>>(n));
  for (auto& run : runs) {
    OnRanks(hosts, [&](Communicator& comm) {
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i) data[i] = 0.1f * float(comm.rank() + 1) + 1e-3f * i;
      ASSERT_TRUE(comm.AllReduce(absl::MakeSpan(data), ReduceOp::kMean).ok());
      run[comm.rank()] = data;
    });
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(runs[0][r].size(), count);
    EXPECT_EQ(std::memcmp(runs[0][r].data(), runs[0][0].data(), count * sizeof(float)), 0)
        << "rank " << r << " differs from rank 0";
    EXPECT_EQ(std::memcmp(runs[1][r].data(), runs[0][r].data(), count * sizeof(float)), 0)
        << "rank " << r << " differs between runs";
  }
  for (size_t i = 0; i < count; ++i) {
    double mean = 0;
    for (int r = 0; r < n; ++r) mean += 0.1 * (r + 1) + 1e-3 * i;
    EXPECT_NEAR(runs[0][0][i], mean / n, 1e-5) << "element " << i;
  }
}

TEST_P(HierarchicalTest, GroupedAllReduceReducesEveryBuffer) {
  OnRanks(GetParam(), [](Communicator& comm) {
    const int n = comm.size();
    std::vector<double> flat = {1, 2, 3, 4, 5};
    for (double& v : flat) v *= comm.rank() + 1;
    const ReduceBuffer buffers[] = {{flat.data(), 2}, {flat.data() + 2, 0}, {flat.data() + 2, 3}};
    ASSERT_TRUE(comm.AllReduceGroupAsync(buffers, DataType::kFloat64, ReduceOp::kSum).Await().ok());
    const double ranks_sum = n * (n + 1) / 2.0;
    EXPECT_EQ(flat, (std::vector<double>{ranks_sum, 2 * ranks_sum, 3 * ranks_sum, 4 * ranks_sum,
                                         5 * ranks_sum}));
  });
}

TEST_P(HierarchicalTest, OtherCollectivesKeepGroupRankOrder) {
  OnRanks(GetParam(), [](Communicator& comm) {
    const int n = comm.size();
    const int r = comm.rank();
    std::vector<float> gathered(2 * n);
    ASSERT_TRUE(
        comm.AllGather(std::vector<float>{float(r), float(10 * r)}, absl::MakeSpan(gathered)).ok());
    for (int k = 0; k < n; ++k) {
      EXPECT_EQ(gathered[2 * k], k);
      EXPECT_EQ(gathered[2 * k + 1], 10 * k);
    }
    for (int root = 0; root < n; ++root) {
      std::vector<double> data = {double(r), double(r) + 0.25};
      ASSERT_TRUE(comm.Broadcast(absl::MakeSpan(data), root).ok());
      EXPECT_EQ(data, (std::vector<double>{double(root), double(root) + 0.25})) << "root " << root;
    }
    // Block k of rank r's input is 100k + r: block r of the sum is 100rn + n(n-1)/2.
    std::vector<float> input;
    for (int k = 0; k < n; ++k) input.insert(input.end(), {float(100 * k + r), 1.0f});
    std::vector<float> block(2);
    ASSERT_TRUE(comm.ReduceScatter(input, absl::MakeSpan(block), ReduceOp::kSum).ok());
    EXPECT_EQ(block, (std::vector<float>{float(100 * r * n + n * (n - 1) / 2), float(n)}));
    EXPECT_TRUE(comm.Barrier().ok());
  });
}

INSTANTIATE_TEST_SUITE_P(Topologies, HierarchicalTest, ::testing::Values(kTwoByTwo, kUneven));

// A part that fails its all-reduces (a broken link) and passes everything else to `inner`.
class FailingAllReduce final : public Communicator {
 public:
  explicit FailingAllReduce(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

 protected:
  CollectiveEvent DoAllReduce(void*, DataType, size_t, ReduceOp, ExecutionContext) override {
    return CollectiveEvent::Done(absl::UnavailableError("injected: the link broke"));
  }
  CollectiveEvent DoAllGather(const void* in, void* out, DataType t, size_t n,
                              ExecutionContext c) override {
    return inner_->AllGatherAsync(in, out, t, n, c);
  }
  CollectiveEvent DoBroadcast(void* data, DataType t, size_t n, int root,
                              ExecutionContext c) override {
    return inner_->BroadcastAsync(data, t, n, root, c);
  }
  CollectiveEvent DoReduceScatter(const void* in, void* out, DataType t, size_t n, ReduceOp op,
                                  ExecutionContext c) override {
    return inner_->ReduceScatterAsync(in, out, t, n, op, c);
  }
  CollectiveEvent DoBarrier(ExecutionContext c) override { return inner_->BarrierAsync(c); }

 private:
  std::unique_ptr<Communicator> inner_;
};

// Host b's leader (rank 2) loses its link between hosts: it reports that level with the part's
// code, and then FAILED_PRECONDITION; rank 3 (waiting for it inside host b) and host a's ranks
// fail too, within the (short) timeout, naming their level.
TEST(HierarchicalFailureTest, TheFailingLevelIsNamed) {
  GlooCommunicatorOptions options;
  options.timeout = absl::Seconds(5);
  std::vector<absl::Status> first(4), second(4);
  const absl::Time start = absl::Now();
  OnRanks(
      kTwoByTwo,
      [&](Communicator& comm) {
        std::vector<float> data = {1, 2};
        first[comm.rank()] = comm.AllReduce(absl::MakeSpan(data), ReduceOp::kSum);
        second[comm.rank()] = comm.Barrier();
      },
      [](int rank, HierarchicalParts& parts) {
        if (rank == 2) parts.leaders = std::make_unique<FailingAllReduce>(std::move(parts.leaders));
      },
      options);
  // Well under the timeout: rank 3 learns at once that its leader gave up.
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
  EXPECT_EQ(first[2].code(), absl::StatusCode::kUnavailable) << first[2];
  EXPECT_THAT(std::string(first[2].message()),
              HasSubstr("all_reduce on hierarchical communicator 'test group' (rank 2 of 4), "
                        "between hosts: injected: the link broke"));
  EXPECT_EQ(second[2].code(), absl::StatusCode::kFailedPrecondition) << second[2];
  EXPECT_THAT(std::string(second[2].message()), HasSubstr("injected: the link broke"));
  EXPECT_FALSE(first[3].ok());
  EXPECT_THAT(std::string(first[3].message()), HasSubstr("inside host b"));
  EXPECT_FALSE(first[0].ok());
  EXPECT_THAT(std::string(first[0].message()), HasSubstr("between hosts"));
  for (int r : {0, 1, 3}) {
    EXPECT_EQ(second[r].code(), absl::StatusCode::kFailedPrecondition) << r << ": " << second[r];
  }
}

// A part that has only a rank and a size: what Create checks.
class Fake final : public Communicator {
 public:
  Fake(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

 protected:
  CollectiveEvent DoAllReduce(void*, DataType, size_t, ReduceOp, ExecutionContext) override {
    return CollectiveEvent::Done();
  }
  CollectiveEvent DoAllGather(const void*, void*, DataType, size_t, ExecutionContext) override {
    return CollectiveEvent::Done();
  }
  CollectiveEvent DoBroadcast(void*, DataType, size_t, int, ExecutionContext) override {
    return CollectiveEvent::Done();
  }
  CollectiveEvent DoReduceScatter(const void*, void*, DataType, size_t, ReduceOp,
                                  ExecutionContext) override {
    return CollectiveEvent::Done();
  }
  CollectiveEvent DoBarrier(ExecutionContext) override { return CollectiveEvent::Done(); }

 private:
  const int rank_;
  const int size_;
  const std::string name_ = "fake";
};

TEST(HierarchicalCreateTest, PartsMustFitTheTopology) {
  auto make = [](int rank, std::unique_ptr<Communicator> local,
                 std::unique_ptr<Communicator> leaders) {
    HierarchicalParts parts;
    parts.local = std::move(local);
    parts.leaders = std::move(leaders);
    parts.all = std::make_unique<Fake>(rank, 4);
    return HierarchicalCommunicator::Create("g", kTwoByTwo, rank, std::move(parts)).status();
  };
  EXPECT_TRUE(make(2, std::make_unique<Fake>(0, 2), std::make_unique<Fake>(1, 2)).ok());
  EXPECT_TRUE(make(3, std::make_unique<Fake>(1, 2), nullptr).ok());
  const absl::Status no_leaders = make(2, std::make_unique<Fake>(0, 2), nullptr);
  EXPECT_EQ(no_leaders.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_leaders.message()), HasSubstr("no between-hosts (leaders)"));
  const absl::Status wrong_local = make(3, std::make_unique<Fake>(0, 2), nullptr);
  EXPECT_THAT(std::string(wrong_local.message()),
              HasSubstr("inside-host (host b) communicator 'fake' is rank 0 of 2, the topology "
                        "wants rank 1 of 2"));
  EXPECT_EQ(make(3, std::make_unique<Fake>(1, 2), std::make_unique<Fake>(1, 2)).code(),
            absl::StatusCode::kInvalidArgument);
}

// A CUDA stream is refused before anything runs, and does not break the group.
TEST(HierarchicalCreateTest, AStreamIsRefusedWithoutBreakingTheGroup) {
  HierarchicalParts parts;
  parts.local = std::make_unique<Fake>(1, 2);
  parts.all = std::make_unique<Fake>(3, 4);
  auto comm = HierarchicalCommunicator::Create("g", kTwoByTwo, 3, std::move(parts));
  ASSERT_TRUE(comm.ok()) << comm.status();
  float data[2] = {1, 2};
  const ExecutionContext stream = ExecutionContext::Stream(reinterpret_cast<CUstream_st*>(8));
  const absl::Status refused =
      (*comm)->AllReduceAsync(data, DataType::kFloat32, 2, ReduceOp::kSum, stream).Await();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("a CUDA stream was given"));
  EXPECT_EQ((*comm)->BarrierAsync(stream).Await().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE((*comm)->AllReduce(absl::MakeSpan(data), ReduceOp::kSum).ok());
  EXPECT_TRUE((*comm)->Barrier().ok());
}

}  // namespace
}  // namespace substrax
