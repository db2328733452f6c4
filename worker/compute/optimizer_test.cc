#include "worker/compute/optimizer.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/optimizers.h"
#include "core/optimizers_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

// Expected values below are worked out by hand (or in double precision from the formulas in
// optimizer.h); the optimizer computes in float, so they agree to float rounding over a few
// steps: 1e-6 absolute on values of order 1.
constexpr float kTol = 1e-6f;

std::unique_ptr<Optimizer> Make(const v1::OptimizerSpec& spec) {
  auto opt = Optimizer::Create(spec);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? std::move(opt).value() : nullptr;
}

v1::OptimizerSpec Spec(const std::string& type, double learning_rate) {
  v1::OptimizerSpec spec;
  spec.set_type(type);
  spec.set_learning_rate(learning_rate);
  return spec;
}

TensorTree Scalar(float value) { return {{"w", Tensor({1}, {value})}}; }

// Updates a one-element parameter starting at `start` with each of `grads` in turn and checks
// its value after each step against `expected`.
void ExpectTrajectory(Optimizer& opt, float start, const std::vector<float>& grads,
                      const std::vector<float>& expected) {
  TensorTree params = Scalar(start);
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_TRUE(opt.Update(Scalar(grads[i]), &params).ok());
    EXPECT_NEAR(params["w"].data()[0], expected[i], kTol) << "step " << i + 1;
  }
  EXPECT_EQ(opt.steps(), static_cast<int64_t>(grads.size()));
}

TEST(OptimizerTest, Sgd) {
  auto opt = Make(Spec("sgd", 0.1));
  TensorTree params = {{"b", Tensor({1}, {3.0f})}, {"w", Tensor({2}, {1.0f, -2.0f})}};
  const TensorTree grads = {{"b", Tensor({1}, {-1.0f})}, {"w", Tensor({2}, {0.5f, 0.25f})}};
  ASSERT_TRUE(opt->Update(grads, &params).ok());
  EXPECT_THAT(params["w"].span(), ElementsAre(FloatNear(0.95f, kTol), FloatNear(-2.025f, kTol)));
  ASSERT_TRUE(opt->Update(grads, &params).ok());
  EXPECT_THAT(params["w"].span(), ElementsAre(FloatNear(0.9f, kTol), FloatNear(-2.05f, kTol)));
  EXPECT_THAT(params["b"].span(), ElementsAre(FloatNear(3.2f, kTol)));
  EXPECT_EQ(opt->steps(), 2);
}

// m = 0.9 (the default), lr = 0.1, grads 1, 0.5, -1:
//   t = 1,              p = 1 - 0.1          = 0.9
//   t = 0.5 + 0.9 = 1.4, p = 0.9 - 0.14        = 0.76
//   t = -1 + 1.26 = 0.26, p = 0.76 - 0.026      = 0.734
TEST(OptimizerTest, MomentumDefaultsToNineTenths) {
  auto opt = Make(Spec("momentum", 0.1));
  ExpectTrajectory(*opt, 1.0f, {1.0f, 0.5f, -1.0f}, {0.9f, 0.76f, 0.734f});
}

// m = 0.5, lr = 0.1, Nesterov (u = g + m * t), grads 1, 0.5, -1:
//   t = 1,    u = 1 + 0.5     = 1.5,   p = 1 - 0.15      = 0.85
//   t = 1,    u = 0.5 + 0.5   = 1,     p = 0.85 - 0.1    = 0.75
//   t = -0.5, u = -1 - 0.25   = -1.25, p = 0.75 + 0.125  = 0.875
TEST(OptimizerTest, MomentumNesterov) {
  v1::OptimizerSpec spec = Spec("momentum", 0.1);
  (*spec.mutable_hyperparameters())["momentum"] = 0.5;
  (*spec.mutable_hyperparameters())["nesterov"] = 1;
  auto opt = Make(spec);
  ExpectTrajectory(*opt, 1.0f, {1.0f, 0.5f, -1.0f}, {0.85f, 0.75f, 0.875f});
}

TEST(OptimizerTest, MomentumKeepsStatePerParameter) {
  v1::OptimizerSpec spec = Spec("momentum", 1.0);
  (*spec.mutable_hyperparameters())["momentum"] = 0.5;
  auto opt = Make(spec);
  TensorTree params = {{"a", Tensor({1}, {0.0f})}, {"b", Tensor({1}, {0.0f})}};
  const TensorTree grads = {{"a", Tensor({1}, {1.0f})}, {"b", Tensor({1}, {-2.0f})}};
  ASSERT_TRUE(opt->Update(grads, &params).ok());
  ASSERT_TRUE(opt->Update(grads, &params).ok());
  // a: traces 1, 1.5 -> p = -2.5; b: traces -2, -3 -> p = 5.
  EXPECT_NEAR(params["a"].data()[0], -2.5f, kTol);
  EXPECT_NEAR(params["b"].data()[0], 5.0f, kTol);
}

// b1 = b2 = 0.5, eps = 0.5, lr = 1, grads 2, -2, 4 (corrections 1 - 0.5^t = 0.5, 0.75, 0.875):
//   m = 1,    v = 2:   m^ = 2,    v^ = 4,    p = 0 - 2 / (2 + 0.5)               = -0.8
//   m = -0.5, v = 3:   m^ = -2/3, v^ = 4,    p = -0.8 + (2/3) / 2.5              = -0.5333333
//   m = 1.75, v = 9.5: m^ = 2,    v^ = 76/7, p = -0.5333 - 2 / (sqrt(76/7) + 0.5) = -1.0603401
TEST(OptimizerTest, Adam) {
  v1::OptimizerSpec spec = Spec("adam", 1.0);
  (*spec.mutable_hyperparameters())["b1"] = 0.5;
  (*spec.mutable_hyperparameters())["b2"] = 0.5;
  (*spec.mutable_hyperparameters())["eps"] = 0.5;
  auto opt = Make(spec);
  ExpectTrajectory(*opt, 0.0f, {2.0f, -2.0f, 4.0f}, {-0.8f, -0.53333333f, -1.06034007f});
}

// Defaults b1 0.9, b2 0.999, eps 1e-8; lr = 0.01, grads 0.3, -0.1:
//   step 1: m^ = g, v^ = g^2, p = 1 - 0.01 * 0.3 / (0.3 + 1e-8)               = 0.99000000033
//   step 2: m = 0.017, v = 9.991e-5, m^ = 0.017 / 0.19, v^ = 9.991e-5 / 0.001999,
//           p = 0.99 - 0.01 * m^ / (sqrt(v^) + 1e-8)                          = 0.98599781479
TEST(OptimizerTest, AdamDefaults) {
  auto opt = Make(Spec("adam", 0.01));
  TensorTree params = Scalar(1.0f);
  ASSERT_TRUE(opt->Update(Scalar(0.3f), &params).ok());
  EXPECT_NEAR(params["w"].data()[0], 0.99f, kTol);
  ASSERT_TRUE(opt->Update(Scalar(-0.1f), &params).ok());
  EXPECT_NEAR(params["w"].data()[0], 0.98599781f, kTol);
}

TEST(OptimizerTest, MismatchedGradsAreRejectedAndChangeNothing) {
  auto opt = Make(Spec("adam", 0.1));
  TensorTree params = {{"dense_0/bias", Tensor({2}, {1.0f, 2.0f})},
                       {"dense_0/kernel", Tensor({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f})}};
  const TensorTree before = params;

  TensorTree missing = {{"dense_0/kernel", Tensor({2, 2})}};
  absl::Status status = opt->Update(missing, &params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'dense_0/bias'"));

  TensorTree wrong_shape = {{"dense_0/bias", Tensor({2})}, {"dense_0/kernel", Tensor({4})}};
  status = opt->Update(wrong_shape, &params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'dense_0/kernel'"));

  TensorTree extra = {{"dense_0/bias", Tensor({2})},
                      {"dense_0/kernel", Tensor({2, 2})},
                      {"dense_9/bias", Tensor({2})}};
  status = opt->Update(extra, &params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'dense_9/bias'"));

  EXPECT_EQ(params, before);
  EXPECT_EQ(opt->steps(), 0);
}

TEST(OptimizerTest, StateOfAnotherShapeIsRejected) {
  auto opt = Make(Spec("momentum", 0.1));
  TensorTree params = {{"w", Tensor({2})}};
  ASSERT_TRUE(opt->Update({{"w", Tensor({2})}}, &params).ok());
  params = {{"w", Tensor({3})}};
  const absl::Status status = opt->Update({{"w", Tensor({3})}}, &params);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'w'"));
  EXPECT_EQ(opt->steps(), 1);
}

// Two threads updating disjoint ranges of the same parameters, step by step, end exactly where
// Update over whole tensors ends (the update is elementwise), and the state they leave is the
// same.
TEST(OptimizerTest, RangeUpdatesOnTwoThreadsEqualWholeUpdates) {
  const TensorTree start = {{"b", Tensor({3}, {0.5f, -1.0f, 2.0f})},
                            {"w", Tensor({2, 3}, {1.0f, -2.0f, 0.25f, 3.0f, -0.5f, 1.5f})}};
  const TensorTree grads = {{"b", Tensor({3}, {-1.0f, 0.3f, 0.7f})},
                            {"w", Tensor({2, 3}, {0.5f, 0.25f, -0.125f, 2.0f, -1.0f, 0.1f})}};
  auto whole = Make(Spec("adam", 0.01));
  auto ranged = Make(Spec("adam", 0.01));
  TensorTree expected = start, params = start;
  ASSERT_TRUE(PrepareRangeUpdates(*ranged, params).ok());
  // Thread 0: all of b and the first value of w; thread 1: the rest of w.
  const std::vector<ParamRange> first = {{"b", 0, 3, grads.at("b").data()},
                                         {"w", 0, 1, grads.at("w").data()}};
  const std::vector<ParamRange> second = {{"w", 1, 5, grads.at("w").data() + 1}};
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(whole->Update(grads, &expected).ok());
    absl::Status a, b;
    std::thread t([&] { a = UpdateRanges(*ranged, first, step, &params); });
    b = UpdateRanges(*ranged, second, step, &params);
    t.join();
    ASSERT_TRUE(a.ok()) << a;
    ASSERT_TRUE(b.ok()) << b;
  }
  EXPECT_EQ(params, expected);
  EXPECT_EQ(ranged->ExportState(params), whole->ExportState(expected));
}

TEST(OptimizerTest, RangeUpdatesRejectUnknownRangesAndMissingState) {
  auto opt = Make(Spec("adam", 0.01));
  TensorTree params = {{"w", Tensor({2}, {1.0f, 2.0f})}};
  const float g[2] = {0.5f, 0.5f};
  const std::vector<ParamRange> ok = {{"w", 0, 2, g}};
  absl::Status s = UpdateRanges(*opt, ok, 1, &params);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("PrepareRangeUpdates"));
  ASSERT_TRUE(PrepareRangeUpdates(*opt, params).ok());
  const std::vector<ParamRange> outside = {{"w", 1, 2, g}};
  s = UpdateRanges(*opt, outside, 1, &params);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("outside parameter 'w'"));
  const std::vector<ParamRange> unknown = {{"v", 0, 1, g}};
  s = UpdateRanges(*opt, unknown, 1, &params);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(params["w"].span(), ElementsAre(1.0f, 2.0f));  // nothing changed
}

TEST(OptimizerTest, CreateRejectsBadSpecs) {
  auto unknown = Optimizer::Create(Spec("", 0.1));
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("spec.optimizer.type"));
  for (double lr : {0.0, -0.1}) {
    auto bad_lr = Optimizer::Create(Spec("sgd", lr));
    EXPECT_EQ(bad_lr.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(bad_lr.status().message(), HasSubstr("spec.optimizer.learning_rate"));
  }
  v1::OptimizerSpec adam = Spec("adam", 0.1);
  (*adam.mutable_hyperparameters())["b2"] = 1.0;
  EXPECT_THAT(Optimizer::Create(adam).status().message(), HasSubstr("spec.optimizer.b2"));
}

// An optimizer the core table knows but the cpu backend has no kernel for is refused by name,
// never run as another.
TEST(OptimizerTest, OptimizerWithoutCpuKernelIsUnimplemented) {
  const OptimizerConfig config = UnimplementedOptimizerConfig();
  EXPECT_EQ(FindCpuOptimizerKernel("lion"), nullptr);
  auto opt = Optimizer::Create(config);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(opt.status().message(), "optimizer 'lion' is not implemented on the cpu backend");
}

// Every optimizer of the core table has a CPU kernel: the CPU backend is the reference the other
// backends are tested against.
TEST(OptimizerTest, EveryTableOptimizerHasACpuKernel) {
  for (const OptimizerInfo& info : OptimizerTable()) {
    EXPECT_NE(FindCpuOptimizerKernel(info.name), nullptr) << info.name;
  }
}

}  // namespace
}  // namespace substrax
