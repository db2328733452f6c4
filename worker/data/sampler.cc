#include "worker/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "core/status.h"
#include "worker/data/random.h"

namespace substrax {

// The permutations of the two most recent epochs. Two, not one: at an epoch boundary the device
// threads and their prefetchers straddle two epochs for a few steps, and a single entry would be
// recomputed on every alternation.
struct BatchSampler::PermutationCache {
  struct Entry {
    int64_t epoch = -1;
    std::shared_ptr<const std::vector<int64_t>> permutation;
  };
  absl::Mutex mu;
  Entry entries[2] ABSL_GUARDED_BY(mu);
  int next ABSL_GUARDED_BY(mu) = 0;  // the entry to replace next
};

std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  SUBSTRAX_CHECK(n >= 0 && epoch >= 0, absl::StrCat("n = ", n, ", epoch = ", epoch));
  std::vector<int64_t> permutation(n);
  std::iota(permutation.begin(), permutation.end(), 0);
  Rng rng(seed, RngStream::kShuffle, static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(rng.UniformInt(static_cast<uint64_t>(i) + 1));
    std::swap(permutation[i], permutation[j]);
  }
  return permutation;
}

BatchSampler::BatchSampler(int64_t num_examples, int64_t global_batch_size, uint64_t seed,
                           bool shuffle)
    : num_examples_(num_examples),
      global_batch_size_(global_batch_size),
      seed_(seed),
      shuffle_(shuffle),
      cache_(std::make_shared<PermutationCache>()) {}

absl::StatusOr<BatchSampler> BatchSampler::Create(int64_t num_examples, int64_t global_batch_size,
                                                  uint64_t seed, bool shuffle) {
  if (global_batch_size < 1 || global_batch_size > num_examples) {
    return absl::InvalidArgumentError(
        absl::StrCat("global batch size ", global_batch_size, " must be in [1, ", num_examples,
                     "]: the dataset has ", num_examples, " examples"));
  }
  return BatchSampler(num_examples, global_batch_size, seed, shuffle);
}

std::shared_ptr<const std::vector<int64_t>> BatchSampler::Permutation(int64_t epoch) const {
  absl::MutexLock lock(&cache_->mu);
  for (const PermutationCache::Entry& entry : cache_->entries) {
    if (entry.epoch == epoch) return entry.permutation;
  }
  // Computed under the lock: the other threads need the same permutation and would wait anyway.
  PermutationCache::Entry& entry = cache_->entries[cache_->next];
  cache_->next = 1 - cache_->next;
  entry.epoch = epoch;
  entry.permutation =
      std::make_shared<const std::vector<int64_t>>(EpochPermutation(num_examples_, seed_, epoch));
  return entry.permutation;
}

std::vector<int64_t> BatchSampler::GlobalBatch(int64_t step) const {
  SUBSTRAX_CHECK(step >= 0, absl::StrCat("step ", step));
  const int64_t epoch = step / steps_per_epoch();
  const int64_t start = (step % steps_per_epoch()) * global_batch_size_;
  std::vector<int64_t> batch(global_batch_size_);
  if (!shuffle_) {
    std::iota(batch.begin(), batch.end(), start);
    return batch;
  }
  const std::shared_ptr<const std::vector<int64_t>> permutation = Permutation(epoch);
  std::copy_n(permutation->begin() + start, global_batch_size_, batch.begin());
  return batch;
}

Batch Gather(const Dataset& data, absl::Span<const int64_t> indices) {
  SUBSTRAX_CHECK(data.features.rank() >= 1 && data.targets.rank() >= 1 &&
                     data.features.dim(0) == data.targets.dim(0),
                 absl::StrCat("features ", data.features.ShapeString(), " and targets ",
                              data.targets.ShapeString(), " are not a dataset"));
  const int64_t n = data.num_examples();
  const int64_t k = static_cast<int64_t>(indices.size());
  // Row widths: features [N, F]; targets [N] (classes) or [N, outputs] (values).
  const int64_t feature_width = n == 0 ? 0 : data.features.size() / n;
  const int64_t target_width = n == 0 ? 0 : data.targets.size() / n;
  std::vector<int64_t> feature_shape = data.features.shape();
  std::vector<int64_t> target_shape = data.targets.shape();
  feature_shape[0] = k;
  target_shape[0] = k;
  Batch batch{Tensor(std::move(feature_shape)), Tensor(std::move(target_shape))};
  for (int64_t i = 0; i < k; ++i) {
    const int64_t row = indices[i];
    SUBSTRAX_CHECK(row >= 0 && row < n, absl::StrCat("index ", row, " of a dataset of ", n));
    std::copy_n(data.features.data() + row * feature_width, feature_width,
                batch.inputs.data() + i * feature_width);
    std::copy_n(data.targets.data() + row * target_width, target_width,
                batch.targets.data() + i * target_width);
  }
  return batch;
}

absl::StatusOr<Batch> ShardOfGlobalBatch(const Dataset& data,
                                         absl::Span<const int64_t> global_indices, int shard,
                                         int num_shards) {
  const int64_t size = static_cast<int64_t>(global_indices.size());
  if (num_shards < 1 || shard < 0 || shard >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shard ", shard, " of ", num_shards, ": need num_shards >= 1 and 0 <= shard < num_shards"));
  }
  if (size % num_shards != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a global batch of ", size, " examples does not divide into ", num_shards,
        " equal shards (the data axis); use a global batch size that is a multiple of ",
        num_shards));
  }
  const int64_t b = size / num_shards;
  const absl::Span<const int64_t> mine = global_indices.subspan(shard * b, b);
  for (int64_t index : mine) {
    if (index < 0 || index >= data.num_examples()) {
      return absl::InvalidArgumentError(absl::StrCat("example index ", index,
                                                     " is outside the dataset of ",
                                                     data.num_examples(), " examples"));
    }
  }
  return Gather(data, mine);
}

}  // namespace substrax
