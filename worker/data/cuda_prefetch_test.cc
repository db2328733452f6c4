// CudaPrefetcher on a real GPU: every batch arrives on the device, in order, with its size, as the
// producer made it; the end and the producer's errors come through. Skips itself without a GPU
// (or without --config=cuda).
#include "worker/data/cuda_prefetch.h"

#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "worker/gpu/cuda_device.h"

namespace substrax {
namespace {

constexpr int64_t kFeatures = 3;

// Batch i: n(i) examples whose inputs are all i and whose labels are the row numbers.
int64_t Size(int i, int batches) { return i == batches - 1 ? 5 : 40 + i; }
Batch MakeBatch(int i, int batches) {
  const int64_t n = Size(i, batches);
  std::vector<float> labels(n);
  for (int64_t r = 0; r < n; ++r) labels[r] = static_cast<float>(r);
  return Batch{Tensor({n, kFeatures}, std::vector<float>(n * kFeatures, static_cast<float>(i))),
               Tensor({n}, labels)};
}

// The `count` floats at device address `data`, copied back.
std::vector<float> Read(const CudaDevice& device, const float* data, int64_t count) {
  DeviceTensor view{{count}, DeviceBuffer::View(const_cast<float*>(data), count)};
  absl::StatusOr<Tensor> host = device.Download(view);
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? std::vector<float>(host->data(), host->data() + host->size())
                   : std::vector<float>();
}

TEST(CudaPrefetcherTest, DeliversEveryBatchInOrder) {
  if (!CudaBuilt()) GTEST_SKIP() << "built without --config=cuda";
  if (absl::StatusOr<int> n = CudaDeviceCount(); !n.ok()) {
    GTEST_SKIP() << "no CUDA device: " << n.status().message();
  }
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  constexpr int kBatches = 12;
  int produced = 0;
  // Sizes vary (the last is smaller), so slots grow and views carry the size.
  Producer<Batch> producer = [&]() -> absl::StatusOr<std::optional<Batch>> {
    if (produced == kBatches) return std::optional<Batch>();
    return std::optional<Batch>(MakeBatch(produced++, kBatches));
  };
  auto batches = CudaPrefetcher::Create(device->get(), producer, 2);
  ASSERT_TRUE(batches.ok()) << batches.status();
  for (int i = 0; i < kBatches; ++i) {
    auto batch = (*batches)->Next();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_TRUE(batch->has_value()) << "batch " << i;
    const int64_t n = Size(i, kBatches);
    EXPECT_EQ((*batch)->size, n);
    EXPECT_EQ((*batch)->num_features, kFeatures);
    EXPECT_EQ((*batch)->target_width, 1);
    const Batch want = MakeBatch(i, kBatches);
    EXPECT_EQ(Read(**device, (*batch)->inputs, n * kFeatures),
              std::vector<float>(want.inputs.data(), want.inputs.data() + want.inputs.size()))
        << "batch " << i;
    EXPECT_EQ(Read(**device, (*batch)->targets, n),
              std::vector<float>(want.targets.data(), want.targets.data() + n))
        << "batch " << i;
  }
  auto end = (*batches)->Next();
  ASSERT_TRUE(end.ok());
  EXPECT_FALSE(end->has_value());
}

TEST(CudaPrefetcherTest, WithoutCudaCreateSaysHowToBuild) {
  if (CudaBuilt()) GTEST_SKIP() << "built with --config=cuda";
  auto batches = CudaPrefetcher::Create(nullptr, [] { return absl::StatusOr<std::optional<Batch>>(std::nullopt); });
  EXPECT_EQ(batches.status().code(), absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace substrax
