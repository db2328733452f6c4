// Reads the real Fashion-MNIST, as Debian's dataset-fashion-mnist installs it
// (tools/install_deps.sh installs the package).
#include <algorithm>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/data/dataset.h"

namespace substrax {
namespace {

const std::string kDir = "/usr/share/datasets/fashion-mnist/";

struct Split {
  std::string name;
  int64_t examples;
  int64_t first_image_byte_sum;
};

class FashionMnistTest : public ::testing::TestWithParam<Split> {};

TEST_P(FashionMnistTest, ReadsEveryImageAndLabel) {
  const Split& split = GetParam();
  absl::StatusOr<Dataset> data = ReadIdx(kDir + split.name + "-images-idx3-ubyte.gz",
                                         kDir + split.name + "-labels-idx1-ubyte.gz", DataAccess::Unconfined());
  ASSERT_TRUE(data.ok()) << data.status()
                         << "\n(install Debian's dataset-fashion-mnist: tools/install_deps.sh)";
  EXPECT_EQ(data->features.shape(), (std::vector<int64_t>{split.examples, 784}));
  EXPECT_EQ(data->targets.shape(), (std::vector<int64_t>{split.examples}));
  EXPECT_EQ(data->num_classes, 10);

  float low = 1, high = 0;
  for (float v : data->features.span()) {
    low = std::min(low, v);
    high = std::max(high, v);
  }
  EXPECT_EQ(low, 0.0f);
  EXPECT_EQ(high, 1.0f);

  // Both splits are balanced: a tenth of the examples in each class.
  std::vector<int64_t> per_class(10, 0);
  for (float label : data->targets.span()) {
    ASSERT_GE(label, 0);
    ASSERT_LE(label, 9);
    ++per_class[static_cast<int>(label)];
  }
  EXPECT_THAT(per_class, ::testing::Each(split.examples / 10));
  // The first example of each split is an ankle boot (class 9).
  EXPECT_EQ(data->targets.data()[0], 9.0f);
  // Its pixels, scaled by 1/255, add up to the bytes' sum in the file.
  double first_sum = 0;
  for (int i = 0; i < 784; ++i) first_sum += data->features.data()[i];
  EXPECT_NEAR(first_sum, split.first_image_byte_sum / 255.0, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Splits, FashionMnistTest,
                         ::testing::Values(Split{"train", 60000, 76247},
                                           Split{"t10k", 10000, 33456}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace substrax
