// The order of examples in training: per-epoch permutations, global batches, and each device's
// shard of a global batch.
//
// Every process computes the same global batches from the job seed alone, without talking to the
// others, and each device takes a contiguous block of each global batch by its coordinate on the
// data axis. The shards of a step, in data-axis order, are exactly the batch one device would see:
// this is what makes data-parallel training over any number of devices equal to single-device
// training.
//
// Thread-safe: a BatchSampler may be shared by the device threads of a process (it caches recent
// epoch permutations behind a mutex); the free functions are pure.
#ifndef SUBSTRAX_WORKER_DATA_SAMPLER_H_
#define SUBSTRAX_WORKER_DATA_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/data/dataset.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// A permutation of [0, n) for (seed, epoch): Fisher–Yates with the data layer's own generator
// (worker/data/random.h), identical on every platform. n >= 0, epoch >= 0 (checked).
std::vector<int64_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch);

// Global batches across epochs. Copyable (copies share the permutation cache).
class BatchSampler {
 public:
  // Errors: INVALID_ARGUMENT when global_batch_size < 1 or > num_examples (the message says how
  // many examples there are).
  static absl::StatusOr<BatchSampler> Create(int64_t num_examples, int64_t global_batch_size,
                                             uint64_t seed, bool shuffle);

  int64_t num_examples() const { return num_examples_; }
  int64_t global_batch_size() const { return global_batch_size_; }
  // num_examples / global_batch_size: the remainder of each epoch is dropped, so every step has a
  // full batch that divides over the data axis.
  int64_t steps_per_epoch() const { return num_examples_ / global_batch_size_; }

  // The example indices of global step `step` (0-based, across epochs; >= 0, checked): batch
  // step % steps_per_epoch() of epoch step / steps_per_epoch(), a contiguous block of that
  // epoch's permutation (the identity when !shuffle).
  std::vector<int64_t> GlobalBatch(int64_t step) const;

 private:
  struct PermutationCache;

  BatchSampler(int64_t num_examples, int64_t global_batch_size, uint64_t seed, bool shuffle);

  // The permutation of `epoch`, computed once per epoch and shared.
  std::shared_ptr<const std::vector<int64_t>> Permutation(int64_t epoch) const;

  int64_t num_examples_;
  int64_t global_batch_size_;
  uint64_t seed_;
  bool shuffle_;
  std::shared_ptr<PermutationCache> cache_;
};

// The examples `indices` of `data` as a Batch, rows copied in the order given. Every index must
// be in [0, data.num_examples()) (checked).
Batch Gather(const Dataset& data, absl::Span<const int64_t> indices);

// Shard `shard` of `num_shards` (the device's coordinate on the data axis, and the size of that
// axis) of a global batch: the contiguous block [shard·B, (shard+1)·B) with
// B = global_indices.size() / num_shards.
// Errors: INVALID_ARGUMENT when num_shards < 1, shard is outside [0, num_shards), the batch does
// not divide into num_shards equal blocks, or an index is outside the dataset.
absl::StatusOr<Batch> ShardOfGlobalBatch(const Dataset& data,
                                         absl::Span<const int64_t> global_indices, int shard,
                                         int num_shards);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DATA_SAMPLER_H_
