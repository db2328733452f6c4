#include "core/model_catalog.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

TEST(ModelCatalogTest, MlpLayersChainWidths) {
  v1::ModelSpec mlp;
  mlp.set_type(v1::MODEL_TYPE_MLP);
  mlp.add_hidden_sizes(512);
  mlp.add_hidden_sizes(256);
  mlp.set_num_classes(10);
  auto params = ModelParams(mlp, 784);
  ASSERT_TRUE(params.ok()) << params.status();
  ASSERT_EQ(params->size(), 6u);
  EXPECT_EQ((*params)[0].name, "dense_0/kernel");
  EXPECT_EQ((*params)[0].shape, (std::vector<int64_t>{784, 512}));
  EXPECT_EQ((*params)[3].name, "dense_1/bias");
  EXPECT_EQ((*params)[3].shape, (std::vector<int64_t>{256}));
  EXPECT_EQ((*params)[4].shape, (std::vector<int64_t>{256, 10}));
  EXPECT_EQ((*params)[4].fan_in, 256);
  EXPECT_EQ(ParamCount(*params), 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10);
  EXPECT_EQ((*params)[0].partition, PartitionSpec());
}

TEST(ModelCatalogTest, SingleLayerModels) {
  v1::ModelSpec linear;
  linear.set_type(v1::MODEL_TYPE_LINEAR);
  linear.set_output_size(2);
  auto params = ModelParams(linear, 8);
  ASSERT_TRUE(params.ok());
  ASSERT_EQ(params->size(), 2u);
  EXPECT_EQ((*params)[0].shape, (std::vector<int64_t>{8, 2}));
  EXPECT_EQ(ModelOutputSize(linear), 2);

  v1::ModelSpec softmax;
  softmax.set_type(v1::MODEL_TYPE_SOFTMAX_REGRESSION);
  softmax.set_num_classes(3);
  EXPECT_EQ((*ModelParams(softmax, 4))[1].shape, (std::vector<int64_t>{3}));
}

TEST(ModelCatalogTest, TensorParallelPairsColumnThenRow) {
  v1::ModelSpec mlp;
  mlp.set_type(v1::MODEL_TYPE_MLP);
  for (int h : {8, 6, 4}) mlp.add_hidden_sizes(h);
  mlp.set_num_classes(3);
  EXPECT_EQ(LayerSplits(mlp, 2), (std::vector<LayerSplit>{LayerSplit::kColumn, LayerSplit::kRow,
                                                          LayerSplit::kColumn, LayerSplit::kRow}));
  auto params = ModelParams(mlp, 5, 2);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_EQ((*params)[0].partition.ToString(), "(None, 'model')");  // dense_0/kernel
  EXPECT_EQ((*params)[1].partition.ToString(), "('model',)");       // dense_0/bias
  EXPECT_EQ((*params)[2].partition.ToString(), "('model', None)");  // dense_1/kernel
  EXPECT_EQ((*params)[3].partition, PartitionSpec());              // dense_1/bias
  // Three hidden layers: dense_3 (the output) pairs with dense_2.
  EXPECT_EQ((*params)[6].partition.ToString(), "('model', None)");
  mlp.clear_hidden_sizes();
  mlp.add_hidden_sizes(8);
  mlp.add_hidden_sizes(8);
  EXPECT_EQ(LayerSplits(mlp, 2).back(), LayerSplit::kReplicated);  // unpaired output layer
  EXPECT_EQ(LayerSplits(mlp, 1).front(), LayerSplit::kReplicated);
  mlp.set_hidden_sizes(0, 7);
  EXPECT_THAT(ModelParams(mlp, 5, 2).status().message(),
              HasSubstr("spec.model.hidden_sizes[0]: 7 does not divide over the model axis of size 2"));
}

TEST(ModelCatalogTest, RejectsWhatCannotBeBuilt) {
  v1::ModelSpec none;
  EXPECT_THAT(ModelParams(none, 4).status().message(), HasSubstr("unknown model"));
  v1::ModelSpec softmax;
  softmax.set_type(v1::MODEL_TYPE_SOFTMAX_REGRESSION);
  EXPECT_THAT(ModelParams(softmax, 4).status().message(), HasSubstr("spec.model.num_classes"));
  softmax.set_num_classes(3);
  EXPECT_THAT(ModelParams(softmax, 0).status().message(), HasSubstr("at least one input feature"));
}

}  // namespace
}  // namespace substrax
