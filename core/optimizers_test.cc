#include "core/optimizers.h"

#include <cmath>
#include <fstream>
#include <sstream>
#include <set>
#include <string>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::OptimizerSpec Spec(const std::string& type, double learning_rate) {
  v1::OptimizerSpec spec;
  spec.set_type(type);
  spec.set_learning_rate(learning_rate);
  return spec;
}

TEST(OptimizerTableTest, ListsOptaxOptimizersInAStableOrder) {
  std::vector<std::string> names;
  for (const OptimizerInfo& info : OptimizerTable()) names.push_back(info.name);
  EXPECT_THAT(names, ElementsAre("sgd", "momentum", "adam"));
  EXPECT_EQ(OptimizerNames(), "sgd, momentum, adam");
  EXPECT_EQ(FindOptimizer("lamb"), nullptr);
  ASSERT_NE(FindOptimizer("adam"), nullptr);
  EXPECT_THAT(FindOptimizer("adam")->slots, ElementsAre("mu", "nu"));
  EXPECT_TRUE(FindOptimizer("sgd")->slots.empty());
}

// Every row is usable as documented: names unique, defaults inside their ranges, a doc line.
TEST(OptimizerTableTest, RowsAreConsistent) {
  std::set<std::string> names;
  for (const OptimizerInfo& info : OptimizerTable()) {
    SCOPED_TRACE(info.name);
    EXPECT_TRUE(names.insert(info.name).second);
    EXPECT_FALSE(info.formula.empty());
    EXPECT_TRUE(absl::StartsWith(info.optax, "optax.")) << info.optax;
    std::set<std::string> hyper;
    for (const HyperParameter& h : info.hyper) {
      EXPECT_TRUE(hyper.insert(h.name).second) << h.name;
      EXPECT_NE(h.name, "type");
      EXPECT_NE(h.name, "learning_rate");
      EXPECT_FALSE(h.doc.empty()) << h.name;
      EXPECT_TRUE(CheckHyperParameter(h, h.default_value).ok()) << h.name;
    }
  }
}

TEST(ResolveOptimizerTest, AppliesOptaxDefaultsInTableOrder) {
  auto adam = ResolveOptimizer(Spec("adam", 0.001));
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_EQ(adam->info, FindOptimizer("adam"));
  EXPECT_DOUBLE_EQ(adam->learning_rate, 0.001);
  EXPECT_THAT(adam->hyper, ElementsAre(0.9, 0.999, 1e-8));
  EXPECT_DOUBLE_EQ(adam->Get("b2"), 0.999);

  v1::OptimizerSpec spec = Spec("momentum", 0.1);
  (*spec.mutable_hyperparameters())["nesterov"] = 1;
  auto momentum = ResolveOptimizer(spec);
  ASSERT_TRUE(momentum.ok()) << momentum.status();
  EXPECT_DOUBLE_EQ(momentum->Get("momentum"), 0.9);
  EXPECT_DOUBLE_EQ(momentum->Get("nesterov"), 1);
}

TEST(ResolveOptimizerTest, ErrorsNameTheField) {
  auto expect_error = [](const v1::OptimizerSpec& spec, const std::string& message) {
    auto config = ResolveOptimizer(spec);
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(message));
  };
  expect_error(Spec("", 0.1), "spec.optimizer.type: is required; use one of sgd, momentum, adam");
  expect_error(Spec("lamb", 0.1), "spec.optimizer.type: unknown optimizer 'lamb'");
  expect_error(Spec("sgd", 0), "spec.optimizer.learning_rate: must be a positive finite number");
  expect_error(Spec("sgd", std::nan("")), "spec.optimizer.learning_rate");
  v1::OptimizerSpec spec = Spec("adam", 0.1);
  (*spec.mutable_hyperparameters())["b1"] = 1;
  expect_error(spec, "spec.optimizer.b1: must be in [0, 1), got 1");
  spec = Spec("adam", 0.1);
  (*spec.mutable_hyperparameters())["eps"] = 0;
  expect_error(spec, "spec.optimizer.eps: must be a positive finite number, got 0");
  spec = Spec("sgd", 0.1);
  (*spec.mutable_hyperparameters())["b1"] = 0.9;
  expect_error(spec,
               "spec.optimizer.b1: is not used by optimizer sgd; remove it (b1 is a "
               "hyper-parameter of adam; sgd takes type, learning_rate)");
  spec = Spec("momentum", 0.1);
  (*spec.mutable_hyperparameters())["nesterov"] = 2;
  expect_error(spec, "spec.optimizer.nesterov: must be 0 or 1 (false or true), got 2");
  spec = Spec("adam", 0.1);
  (*spec.mutable_hyperparameters())["epsilon_"] = 1e-8;
  expect_error(spec,
               "spec.optimizer.epsilon_: unknown field; optimizer adam takes type, learning_rate, "
               "b1, b2, eps");
  spec = Spec("adam", 0.1);
  (*spec.mutable_hyperparameters())["esp"] = 1e-8;
  expect_error(spec, "spec.optimizer.esp: unknown field (did you mean 'eps'?)");
}

TEST(ResolveOptimizerTest, RangesReadAsMessagesWriteThem) {
  EXPECT_EQ(RangeString(*FindOptimizer("adam")->FindHyper("b1")), "[0, 1)");
  EXPECT_EQ(RangeString(*FindOptimizer("adam")->FindHyper("eps")), "(0, inf)");
}

// docs/job-spec.md shows the table as OptimizerTableMarkdown() writes it. When a row changes,
// paste the table this prints into the "spec.optimizer" section.
TEST(OptimizerTableTest, JobSpecDocShowsTheTable) {
  std::ifstream in("docs/job-spec.md");
  ASSERT_TRUE(in) << "docs/job-spec.md is not in the test's data";
  std::stringstream doc;
  doc << in.rdbuf();
  EXPECT_THAT(doc.str(), HasSubstr(OptimizerTableMarkdown()))
      << "docs/job-spec.md does not show the optimizer table; it should read:\n"
      << OptimizerTableMarkdown();
}

TEST(OptimizerConfigDeathTest, GetOfAnUnknownNameIsAProgrammingError) {
  auto sgd = ResolveOptimizer(Spec("sgd", 0.1));
  ASSERT_TRUE(sgd.ok());
  EXPECT_DEATH(sgd->Get("b1"), "optimizer 'sgd' has no hyper-parameter 'b1'");
}

}  // namespace
}  // namespace substrax
