#include "worker/tensor/tensor.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

Tensor Iota(std::vector<int64_t> shape) {
  Tensor t(std::move(shape));
  for (int64_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(i);
  return t;
}

TEST(TensorTest, ShapesAndZeros) {
  Tensor t({2, 3});
  EXPECT_EQ(t.size(), 6);
  EXPECT_EQ(t.rank(), 2);
  EXPECT_EQ(t.ShapeString(), "(2, 3)");
  EXPECT_THAT(t.span(), ElementsAre(0, 0, 0, 0, 0, 0));
  t.Fill(2);
  EXPECT_EQ(t.data()[5], 2);
  EXPECT_EQ(Tensor().size(), 1);
}

TEST(TensorTest, SliceRowsAndBlocks) {
  Tensor t = Iota({4, 3});
  auto rows = t.SliceRows(1, 3);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(rows->shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_THAT(rows->span(), ElementsAre(3, 4, 5, 6, 7, 8));
  EXPECT_THAT(t.SliceRows(3, 5).status().message(), HasSubstr("out of range"));

  auto block = t.Slice({{1, 3}, {1, 3}});
  ASSERT_TRUE(block.ok());
  EXPECT_THAT(block->span(), ElementsAre(4, 5, 7, 8));
  Tensor cube = Iota({2, 2, 2});
  auto half = cube.Slice({{0, 2}, {1, 2}, {0, 2}});
  ASSERT_TRUE(half.ok());
  EXPECT_THAT(half->span(), ElementsAre(2, 3, 6, 7));
  EXPECT_FALSE(t.Slice({{0, 1}}).ok());
}

TEST(TensorTest, CompareTreesFindsTheWorstElement) {
  TensorTree a = {{"w", Tensor({2}, {1.0f, 2.0f})}, {"b", Tensor({1}, {0.5f})}};
  TensorTree b = a;
  b["w"].data()[1] = 2.002f;
  auto diff = CompareTrees(a, b);
  ASSERT_TRUE(diff.ok());
  EXPECT_NEAR(diff->max_relative, 0.002 / 2.002, 1e-6);
  EXPECT_EQ(diff->where, "w[1]");
  EXPECT_NEAR(diff->max_normwise, 0.002 / 2.002, 1e-6);
  EXPECT_EQ(diff->normwise_where, "w");
  b.erase("b");
  EXPECT_FALSE(CompareTrees(a, b).ok());
}

}  // namespace
}  // namespace substrax
