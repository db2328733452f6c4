// Tensor parallelism on one GPU: the MLP split in two over the model axis (two CudaModel shards,
// each on its own CudaDevice, i.e. its own stream, on ordinal 0, driven by its own thread) must
// give the loss and, block for block, the gradients of the full CPU Model on the same batch.
//
// NCCL refuses two ranks of one communicator on one GPU, so the shards' all-reduce is staged
// through the host: each shard waits for its stream, copies its values down, the two threads meet
// at a barrier where the values are summed, and each copies the sum back up before returning (the
// host-staged form CudaTensorParallelism::all_reduce_sum allows). Part of the GPU check
// (tests/gpu/run.sh); without a GPU, or without --config=cuda, it skips itself with a message.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "substrax/v1/job.pb.h"
#include "worker/compute/cuda_model.h"
#include "worker/compute/model.h"
#include "worker/gpu/cuda_device.h"
#include "worker/tensor/tensor.h"

#ifdef SUBSTRAX_CUDA
#include <cuda_runtime.h>
#endif

namespace substrax {
namespace {

constexpr int64_t kFeatures = 48, kBatch = 64, kClasses = 10, kShards = 2;
// Both sides compute in float32 (no TF32); the shards sum partial products in another order
// than the full model, so they differ by rounding only.
constexpr double kTolerance = 1e-5;

#define SKIP_WITHOUT_GPU()                                                                   \
  do {                                                                                       \
    if (!CudaBuilt()) GTEST_SKIP() << "built without --config=cuda";                         \
    absl::StatusOr<int> count = CudaDeviceCount();                                           \
    if (!count.ok()) GTEST_SKIP() << "no CUDA device: " << count.status().message();         \
  } while (false)

v1::ModelSpec MlpSpec() {
  v1::ModelSpec spec;
  spec.set_type(v1::MODEL_TYPE_MLP);
  spec.add_hidden_sizes(64);
  spec.add_hidden_sizes(32);
  spec.set_num_classes(kClasses);
  return spec;
}

Batch MakeBatch(uint32_t seed) {
  uint32_t s = seed * 2654435761u + 1;
  auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / static_cast<float>(1 << 24) - 0.5f;
  };
  std::vector<float> x(kBatch * kFeatures), t(kBatch);
  for (float& v : x) v = next();
  for (int64_t i = 0; i < kBatch; ++i) t[i] = static_cast<float>(i % kClasses);
  return Batch{Tensor({kBatch, kFeatures}, x), Tensor({kBatch}, t)};
}

// The sum over `n` threads of equal-sized vectors: each calls Sum with its values and gets the
// total back once all have called. Reusable round after round.
class HostAllReduce {
 public:
  explicit HostAllReduce(int n) : n_(n) {}

  absl::Status Sum(std::vector<float>& values) {
    absl::MutexLock lock(&mu_);
    if (sum_.empty()) sum_.assign(values.size(), 0.0f);
    if (sum_.size() != values.size()) {
      return absl::InvalidArgumentError("shards all-reduce different sizes");
    }
    for (size_t i = 0; i < values.size(); ++i) sum_[i] += values[i];
    const int64_t round = round_;
    if (++arrived_ == n_) {
      result_ = std::move(sum_);
      sum_.clear();
      arrived_ = 0;
      ++round_;
    } else {
      auto done = [this, round]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return round_ != round; };
      if (!mu_.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30))) {
        return absl::DeadlineExceededError("the other shard never joined the all-reduce");
      }
    }
    values = result_;  // stays until every thread has called again
    return absl::OkStatus();
  }

 private:
  const int n_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t round_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);
  std::vector<float> result_ ABSL_GUARDED_BY(mu_);
};

// Block `block` ([start, limit) per dimension) of a rank-1 or rank-2 tensor.
Tensor Slice(const Tensor& t, const std::vector<std::pair<int64_t, int64_t>>& block) {
  if (t.rank() == 1) {
    std::vector<float> v(t.data() + block[0].first, t.data() + block[0].second);
    return Tensor({block[0].second - block[0].first}, v);
  }
  const int64_t rows = block[0].second - block[0].first, cols = block[1].second - block[1].first;
  std::vector<float> v;
  v.reserve(rows * cols);
  for (int64_t r = block[0].first; r < block[0].second; ++r) {
    const float* row = t.data() + r * t.dim(1);
    v.insert(v.end(), row + block[1].first, row + block[1].second);
  }
  return Tensor({rows, cols}, v);
}

struct ShardResult {
  absl::Status status;
  TensorTree grads;
  EvalResult metrics;
  int all_reduces = 0;
};

#ifdef SUBSTRAX_CUDA
absl::Status Cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(std::string(what) + ": " + cudaGetErrorString(e));
}
#endif

// One shard, on its own thread: its own CudaDevice (stream) on ordinal 0.
void RunShard(int64_t index, const Batch& batch, uint64_t seed, HostAllReduce* reduce,
              ShardResult* out) {
  auto run = [&]() -> absl::Status {
    absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
    if (!device.ok()) return device.status();
    const CudaDevice* dev = device->get();
    CudaTensorParallelism tp;
    tp.axis_size = kShards;
    tp.index = index;
    tp.all_reduce_sum = [dev, reduce, out](float* values, int64_t count) -> absl::Status {
      ++out->all_reduces;
#ifdef SUBSTRAX_CUDA
      std::vector<float> host(count);
      absl::Status s = dev->Synchronize();
      if (!s.ok()) return s;
      s = Cuda(cudaMemcpy(host.data(), values, count * sizeof(float), cudaMemcpyDeviceToHost),
               "copying the shard's values down");
      if (!s.ok()) return s;
      s = reduce->Sum(host);
      if (!s.ok()) return s;
      return Cuda(cudaMemcpy(values, host.data(), count * sizeof(float), cudaMemcpyHostToDevice),
                  "copying the sum up");
#else
      (void)dev;
      (void)reduce;
      (void)values;
      (void)count;
      return CudaNotBuilt();
#endif
    };
    absl::StatusOr<std::unique_ptr<CudaModel>> model =
        CudaModel::Create(MlpSpec(), kFeatures, dev, tp);
    if (!model.ok()) return model.status();
    absl::StatusOr<std::unique_ptr<CudaMetrics>> metrics = CudaMetrics::Create(*dev);
    if (!metrics.ok()) return metrics.status();
    absl::StatusOr<DeviceTree> params = (*model)->Init(seed);
    if (!params.ok()) return params.status();
    absl::StatusOr<DeviceTensor> x = dev->Upload(batch.inputs);
    if (!x.ok()) return x.status();
    absl::StatusOr<DeviceTensor> t = dev->Upload(batch.targets);
    if (!t.ok()) return t.status();
    DeviceTree grads;
    absl::Status s = (*model)->LossAndGradients(
        *params, DeviceBatchView{x->data(), t->data(), kBatch, kFeatures, 1}, &grads,
        metrics->get());
    if (!s.ok()) return s;
    absl::StatusOr<EvalResult> m = (*metrics)->Read();
    if (!m.ok()) return m.status();
    out->metrics = *m;
    absl::StatusOr<TensorTree> host = dev->Download(grads);
    if (!host.ok()) return host.status();
    out->grads = *std::move(host);
    return absl::OkStatus();
  };
  out->status = run();
  // A shard that failed before an all-reduce would leave its peer waiting until the timeout.
}

TEST(TensorParallelOnOneGpuTest, TwoShardsMatchTheFullCpuModel) {
  SKIP_WITHOUT_GPU();
  constexpr uint64_t kSeed = 3;
  const Batch batch = MakeBatch(11);
  absl::StatusOr<std::unique_ptr<Model>> full = Model::Create(MlpSpec(), kFeatures);
  ASSERT_TRUE(full.ok()) << full.status();
  absl::StatusOr<LossAndGrads> want = (*full)->LossAndGradients((*full)->Init(kSeed), batch);
  ASSERT_TRUE(want.ok()) << want.status();

  HostAllReduce reduce(kShards);
  std::vector<ShardResult> shards(kShards);
  std::vector<std::thread> threads;
  for (int64_t i = 0; i < kShards; ++i) {
    threads.emplace_back(RunShard, i, std::cref(batch), kSeed, &reduce, &shards[i]);
  }
  for (std::thread& t : threads) t.join();

  for (int64_t i = 0; i < kShards; ++i) {
    SCOPED_TRACE("shard " + std::to_string(i));
    const ShardResult& shard = shards[i];
    ASSERT_TRUE(shard.status.ok()) << shard.status;
    EXPECT_GT(shard.all_reduces, 0) << "the model never all-reduced over the model axis";
    ASSERT_EQ(shard.metrics.count, kBatch);
    const double loss = shard.metrics.loss_sum / shard.metrics.count;
    EXPECT_NEAR(loss, want->loss, kTolerance * std::max(1.0, std::abs(want->loss)));
    // The CPU model's view of shard i gives the block of every parameter it holds.
    TensorParallelism cpu_tp;
    cpu_tp.axis_size = kShards;
    cpu_tp.index = i;
    cpu_tp.all_reduce_sum = [](absl::Span<float>) { return absl::OkStatus(); };  // never called
    absl::StatusOr<std::unique_ptr<Model>> layout = Model::Create(MlpSpec(), kFeatures, cpu_tp);
    ASSERT_TRUE(layout.ok()) << layout.status();
    TensorTree want_blocks;
    for (const ParamSpec& p : (*layout)->params()) {
      want_blocks[p.name] = Slice(want->grads.at(p.name), (*layout)->LocalBlock(p));
    }
    absl::StatusOr<TreeDifference> diff = CompareTrees(shard.grads, want_blocks);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(diff->max_normwise, kTolerance)
        << "worst tensor " << diff->normwise_where << "; worst element " << diff->where << " ("
        << diff->max_relative << ")";
  }
}

}  // namespace
}  // namespace substrax
