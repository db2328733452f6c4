#include "core/metric_reductions.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

const StackedMetrics kMetrics = {
    {"loss", {0.5, 1.5, 1.0, 3.0}},
    {"accuracy", {0.8, 0.9, 0.7, 0.6}},
    {"step", {10, 10, 11, 9}},
};

TEST(MetricReductionsTest, MeanAndSum) {
  auto mean = ReduceMean(kMetrics);
  ASSERT_TRUE(mean.ok()) << mean.status();
  EXPECT_DOUBLE_EQ(mean->at("loss"), 1.5);
  EXPECT_DOUBLE_EQ(mean->at("accuracy"), 0.75);
  auto sum = ReduceSum(kMetrics);
  ASSERT_TRUE(sum.ok());
  EXPECT_DOUBLE_EQ(sum->at("step"), 40);
}

TEST(MetricReductionsTest, CustomPerKey) {
  auto out = ReduceCustom(kMetrics, std::map<std::string, std::string>{
                                        {"loss", "mean"}, {"accuracy", "min"}, {"step", "max"}});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_DOUBLE_EQ(out->at("loss"), 1.5);
  EXPECT_DOUBLE_EQ(out->at("accuracy"), 0.6);
  EXPECT_DOUBLE_EQ(out->at("step"), 11);
}

TEST(MetricReductionsTest, CustomRejectsUnknownReductionAndKeys) {
  auto unknown = ReduceCustom(kMetrics, std::map<std::string, std::string>{
                                            {"loss", "median"}, {"accuracy", "mean"},
                                            {"step", "max"}});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(),
            "metric 'loss': unknown reduction 'median'; use one of mean, sum, max, min");

  auto missing = ReduceCustom(kMetrics, std::map<std::string, std::string>{{"loss", "mean"}});
  EXPECT_THAT(missing.status().message(),
              HasSubstr("no reduction given for metric(s) accuracy, step"));

  auto extra = ReduceCustom(kMetrics, std::map<std::string, std::string>{
                                          {"loss", "mean"}, {"accuracy", "mean"},
                                          {"step", "max"}, {"perplexity", "mean"}});
  EXPECT_THAT(extra.status().message(),
              HasSubstr("reduction given for metric 'perplexity', which is not among"));
}

TEST(MetricReductionsTest, ShapeErrors) {
  EXPECT_THAT(ReduceMean({{"loss", {}}}).status().message(), HasSubstr("has no device values"));
  EXPECT_THAT(ReduceSum({{"loss", {1, 2}}, {"step", {1}}}).status().message(),
              HasSubstr("'loss' has 2 values and 'step' has 1"));
  EXPECT_TRUE(ReduceMean({})->empty());
}

TEST(MetricReductionsTest, CollectFromDevicesSplitsPerDevice) {
  auto per_device = CollectFromDevices(kMetrics);
  ASSERT_TRUE(per_device.ok());
  ASSERT_EQ(per_device->size(), 4u);
  EXPECT_DOUBLE_EQ((*per_device)[3].at("loss"), 3.0);
  EXPECT_DOUBLE_EQ((*per_device)[2].at("step"), 11);
  EXPECT_FALSE(CollectFromDevices({{"a", {1}}, {"b", {1, 2}}}).ok());
}

TEST(MetricReductionsTest, NanPropagates) {
  for (ReduceOp op : {ReduceOp::kMean, ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    EXPECT_TRUE(std::isnan(*Reduce({1.0, std::nan(""), 2.0}, op))) << ReduceOpName(op);
  }
  EXPECT_FALSE(Reduce({}, ReduceOp::kMean).ok());
}

TEST(MetricReductionsTest, OpNamesAndProtoRoundTrip) {
  for (ReduceOp op : {ReduceOp::kMean, ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
    EXPECT_EQ(*ParseReduceOp(ReduceOpName(op)), op);
    EXPECT_EQ(*ReduceOpFromProto(ReduceOpToProto(op)), op);
  }
  EXPECT_FALSE(ReduceOpFromProto(v1::REDUCTION_NONE).ok());
  EXPECT_FALSE(ParseReduceOp("avg").ok());
}

}  // namespace
}  // namespace substrax
