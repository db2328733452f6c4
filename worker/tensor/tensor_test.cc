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

TEST(TensorTest, CreateChecksTheCountOfValues) {
  absl::StatusOr<Tensor> t = Tensor::Create({2, 3}, {0, 1, 2, 3, 4, 5}, "dense_0/kernel");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, Iota({2, 3}));

  absl::StatusOr<Tensor> short_by_one = Tensor::Create({5, 5, 1, 16}, std::vector<float>(399),
                                                       "conv_0/kernel");
  EXPECT_EQ(short_by_one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(short_by_one.status().message(),
            "tensor 'conv_0/kernel': shape (5, 5, 1, 16) has 400 elements, got 399 values");
  EXPECT_EQ(Tensor::Create({3}, {1, 2, 3, 4}).status().message(),
            "shape (3,) has 3 elements, got 4 values");
  EXPECT_THAT(Tensor::Create({2, -3}, {}, "w").status().message(),
              HasSubstr("tensor 'w': shape (2, -3) has a negative dimension"));
  // A scalar has one element.
  EXPECT_TRUE(Tensor::Create({}, {7}).ok());
  EXPECT_FALSE(Tensor::Create({}, {}).ok());
}

TEST(TensorTest, ZerosChecksTheShape) {
  absl::StatusOr<Tensor> zeros = Tensor::Zeros({2, 0, 3}, "empty");
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  EXPECT_EQ(zeros->size(), 0);
  absl::Status negative = Tensor::Zeros({-1, 4}, "b").status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("tensor 'b': shape (-1, 4) has a negative dimension"));
}

TEST(TensorTest, CopyFromChecksTheCountAndKeepsTheTensorOnError) {
  Tensor t({2, 2});
  const std::vector<float> four = {1, 2, 3, 4};
  ASSERT_TRUE(t.CopyFrom(four, "w").ok());
  EXPECT_THAT(t.span(), ElementsAre(1, 2, 3, 4));
  const std::vector<float> five = {9, 9, 9, 9, 9};
  absl::Status status = t.CopyFrom(five, "w");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "tensor 'w': shape (2, 2) has 4 elements, got 5 values");
  EXPECT_THAT(t.span(), ElementsAre(1, 2, 3, 4));
}

// The constructors cannot return an error: misuse stops the process with a message that names
// the sizes and the function that returns a status instead, not a source file of substrax.
TEST(TensorDeathTest, ConstructorsNameTheSizesAndTheAlternative) {
  using ::testing::AllOf;
  using ::testing::Not;
  EXPECT_DEATH(Tensor({2, 3}, std::vector<float>(5)),
               AllOf(HasSubstr("substrax::Tensor(shape, values): shape (2, 3) has 6 elements, "
                               "got 5 values (substrax::Tensor::Create returns this as an error "
                               "status instead)"),
                     Not(HasSubstr("tensor.cc"))));
  EXPECT_DEATH(Tensor(std::vector<int64_t>{-2, 3}),
               AllOf(HasSubstr("substrax::Tensor(shape): shape (-2, 3) has a negative dimension"),
                     HasSubstr("substrax::Tensor::Zeros returns this"),
                     Not(HasSubstr("tensor.cc"))));
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
