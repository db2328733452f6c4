#include "worker/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"
#include "worker/tensor/tensor.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

bool IsPermutation(std::vector<int64_t> p) {
  std::sort(p.begin(), p.end());
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// n examples whose single feature is the example's index (so a batch tells which examples it
// holds), with targets [n, 2] = (10 i, 10 i + 1).
Dataset Numbered(int64_t n) {
  Dataset data;
  data.features = Tensor({n, 1});
  data.targets = Tensor({n, 2});
  for (int64_t i = 0; i < n; ++i) {
    data.features.data()[i] = static_cast<float>(i);
    data.targets.data()[2 * i] = static_cast<float>(10 * i);
    data.targets.data()[2 * i + 1] = static_cast<float>(10 * i + 1);
  }
  return data;
}

// The example indices a batch of Numbered() holds.
std::vector<int64_t> Examples(const Batch& batch) {
  std::vector<int64_t> out;
  for (float v : batch.inputs.span()) out.push_back(static_cast<int64_t>(v));
  return out;
}

TEST(EpochPermutationTest, IsAPermutationForEverySize) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    for (int64_t epoch : {0, 1, 5}) {
      EXPECT_TRUE(IsPermutation(EpochPermutation(n, 3, epoch))) << n << " " << epoch;
    }
  }
}

TEST(EpochPermutationTest, DeterministicPerSeedAndEpoch) {
  EXPECT_EQ(EpochPermutation(1000, 3, 2), EpochPermutation(1000, 3, 2));
  EXPECT_NE(EpochPermutation(1000, 3, 2), EpochPermutation(1000, 3, 3));
  EXPECT_NE(EpochPermutation(1000, 3, 2), EpochPermutation(1000, 4, 2));
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(EpochPermutation(1000, 3, 0), identity);
}

// The shuffle order is part of reproducibility (a resumed or rerun job must see the same
// batches): pinned so that a change to the generator or to Fisher–Yates shows up here.
TEST(EpochPermutationTest, PinnedOrder) {
  EXPECT_THAT(EpochPermutation(10, 42, 0), ElementsAre(6, 0, 7, 5, 9, 4, 1, 3, 2, 8));
  EXPECT_THAT(EpochPermutation(10, 42, 1), ElementsAre(7, 1, 6, 3, 0, 5, 2, 8, 4, 9));
}

TEST(BatchSamplerTest, CreateRejectsBadBatchSizes) {
  for (int64_t batch : {0, -1, 11}) {
    absl::StatusOr<BatchSampler> sampler = BatchSampler::Create(10, batch, 1, true);
    EXPECT_EQ(sampler.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(sampler.status().message(), HasSubstr("10 examples"));
  }
  EXPECT_TRUE(BatchSampler::Create(10, 10, 1, true).ok());
}

TEST(BatchSamplerTest, DropsTheRemainderOfEachEpoch) {
  absl::StatusOr<BatchSampler> sampler = BatchSampler::Create(10, 3, 1, false);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  EXPECT_EQ(sampler->steps_per_epoch(), 3);
  // Without shuffling: the identity order, example 9 dropped, the next epoch starts over.
  EXPECT_THAT(sampler->GlobalBatch(0), ElementsAre(0, 1, 2));
  EXPECT_THAT(sampler->GlobalBatch(2), ElementsAre(6, 7, 8));
  EXPECT_THAT(sampler->GlobalBatch(3), ElementsAre(0, 1, 2));
  EXPECT_THAT(sampler->GlobalBatch(7), ElementsAre(3, 4, 5));
}

TEST(BatchSamplerTest, ShuffledBatchesAreBlocksOfTheEpochPermutation) {
  constexpr int64_t kN = 103, kBatch = 10;
  absl::StatusOr<BatchSampler> sampler = BatchSampler::Create(kN, kBatch, 77, true);
  ASSERT_TRUE(sampler.ok()) << sampler.status();
  ASSERT_EQ(sampler->steps_per_epoch(), 10);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const std::vector<int64_t> permutation = EpochPermutation(kN, 77, epoch);
    absl::flat_hash_set<int64_t> seen;
    for (int64_t b = 0; b < 10; ++b) {
      const std::vector<int64_t> batch = sampler->GlobalBatch(epoch * 10 + b);
      EXPECT_THAT(batch, ElementsAreArray(permutation.begin() + b * kBatch,
                                          permutation.begin() + (b + 1) * kBatch));
      for (int64_t i : batch) EXPECT_TRUE(seen.insert(i).second) << "repeated example " << i;
    }
    EXPECT_EQ(seen.size(), 100u);  // disjoint batches; 3 examples dropped
  }
  EXPECT_NE(sampler->GlobalBatch(0), sampler->GlobalBatch(10));  // reshuffled
}

TEST(BatchSamplerTest, IndependentSamplersAgreeAndThreadsMayShareOne) {
  absl::StatusOr<BatchSampler> a = BatchSampler::Create(500, 20, 5, true);
  absl::StatusOr<BatchSampler> b = BatchSampler::Create(500, 20, 5, true);
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<std::vector<int64_t>> expected;
  for (int64_t step = 0; step < 100; ++step) {
    expected.push_back(b->GlobalBatch(step));
    ASSERT_EQ(a->GlobalBatch(step), expected.back());
  }
  // Threads walking different epochs at once, through copies that share one cache.
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t, sampler = *a] {
      for (int64_t round = 0; round < 20; ++round) {
        for (int64_t step = t % 4; step < 100; step += 7) {
          mismatches[t] += sampler.GlobalBatch(step) != expected[step];
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_THAT(mismatches, ::testing::Each(0));
}

TEST(GatherTest, CopiesRowsInTheOrderGiven) {
  const Dataset data = Numbered(5);
  const std::vector<int64_t> indices = {4, 0, 4};
  const Batch batch = Gather(data, indices);
  EXPECT_EQ(batch.size(), 3);
  EXPECT_EQ(batch.inputs.shape(), (std::vector<int64_t>{3, 1}));
  EXPECT_THAT(batch.inputs.span(), ElementsAre(4, 0, 4));
  EXPECT_EQ(batch.targets.shape(), (std::vector<int64_t>{3, 2}));
  EXPECT_THAT(batch.targets.span(), ElementsAre(40, 41, 0, 1, 40, 41));

  Dataset classes;
  classes.features = Tensor({3, 2}, {0, 1, 2, 3, 4, 5});
  classes.targets = Tensor({3}, {7, 8, 9});
  const Batch labelled = Gather(classes, std::vector<int64_t>{2, 1});
  EXPECT_EQ(labelled.targets.shape(), (std::vector<int64_t>{2}));
  EXPECT_THAT(labelled.targets.span(), ElementsAre(9, 8));
  EXPECT_THAT(labelled.inputs.span(), ElementsAre(4, 5, 2, 3));
}

TEST(ShardOfGlobalBatchTest, RejectsWhatDoesNotDivide) {
  const Dataset data = Numbered(10);
  const std::vector<int64_t> batch = {0, 1, 2, 3, 4, 5};
  absl::StatusOr<Batch> shard = ShardOfGlobalBatch(data, batch, 0, 4);
  EXPECT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shard.status().message(), HasSubstr("does not divide into 4"));
  for (const auto& [s, n] : std::vector<std::pair<int, int>>{{3, 3}, {-1, 3}, {0, 0}}) {
    EXPECT_EQ(ShardOfGlobalBatch(data, batch, s, n).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(ShardOfGlobalBatch(data, std::vector<int64_t>{0, 10}, 1, 2).status().message(),
              HasSubstr("outside the dataset"));
  shard = ShardOfGlobalBatch(data, batch, 2, 3);
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_THAT(Examples(*shard), ElementsAre(4, 5));
}

// processes x devices per process; the data axis has processes x devices shards, and process p
// holds shards [p d, (p + 1) d) (devices in row-major mesh order, hosts in order).
struct Topology {
  int processes;
  int devices_per_process;
};

class DataParallelCoverageTest : public ::testing::TestWithParam<Topology> {};

TEST_P(DataParallelCoverageTest, ProcessesSeeDisjointShardsThatMakeUpTheGlobalBatch) {
  const auto [processes, devices] = GetParam();
  const int shards = processes * devices;
  constexpr int64_t kN = 203, kBatch = 24;  // 8 steps per epoch, 11 examples dropped
  const Dataset data = Numbered(kN);
  // Every process builds its own sampler from the job seed; one device is the reference.
  std::vector<BatchSampler> samplers;
  for (int p = 0; p < processes; ++p)
    samplers.push_back(*BatchSampler::Create(kN, kBatch, 9, true));
  const BatchSampler single_device = *BatchSampler::Create(kN, kBatch, 9, true);
  const int64_t steps = single_device.steps_per_epoch();
  ASSERT_EQ(steps, 8);

  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    std::vector<absl::flat_hash_set<int64_t>> per_process(processes);
    for (int64_t step = epoch * steps; step < (epoch + 1) * steps; ++step) {
      std::vector<int64_t> concatenated;
      for (int p = 0; p < processes; ++p) {
        const std::vector<int64_t> global = samplers[p].GlobalBatch(step);
        for (int d = 0; d < devices; ++d) {
          const int shard = p * devices + d;
          absl::StatusOr<Batch> batch = ShardOfGlobalBatch(data, global, shard, shards);
          ASSERT_TRUE(batch.ok()) << batch.status();
          ASSERT_EQ(batch->size(), kBatch / shards);
          for (int64_t i : Examples(*batch)) {
            EXPECT_TRUE(per_process[p].insert(i).second)
                << "process " << p << " got " << i << " twice in epoch " << epoch;
            concatenated.push_back(i);
          }
        }
      }
      // The shards in data-axis order are exactly the single-device batch, targets included.
      const Batch reference = Gather(data, single_device.GlobalBatch(step));
      EXPECT_EQ(concatenated, Examples(reference)) << "step " << step;
      std::vector<Batch> parts;
      for (int s = 0; s < shards; ++s) {
        parts.push_back(*ShardOfGlobalBatch(data, single_device.GlobalBatch(step), s, shards));
      }
      std::vector<float> targets;
      for (const Batch& part : parts) {
        targets.insert(targets.end(), part.targets.span().begin(), part.targets.span().end());
      }
      EXPECT_THAT(reference.targets.span(), ElementsAreArray(targets));
    }
    // Processes are disjoint and together cover the epoch but for the dropped remainder.
    absl::flat_hash_set<int64_t> all;
    for (const auto& mine : per_process) {
      for (int64_t i : mine) EXPECT_TRUE(all.insert(i).second) << "example " << i << " twice";
    }
    EXPECT_EQ(all.size(), static_cast<size_t>(steps * kBatch));
    const std::vector<int64_t> permutation = EpochPermutation(kN, 9, epoch);
    for (int64_t k = steps * kBatch; k < kN; ++k) EXPECT_FALSE(all.contains(permutation[k]));
  }
}

INSTANTIATE_TEST_SUITE_P(Topologies, DataParallelCoverageTest,
                         ::testing::Values(Topology{2, 2}, Topology{1, 1}, Topology{1, 4},
                                           Topology{3, 2}, Topology{4, 2}, Topology{8, 1}),
                         [](const auto& info) {
                           return std::to_string(info.param.processes) + "x" +
                                  std::to_string(info.param.devices_per_process);
                         });

}  // namespace
}  // namespace substrax
