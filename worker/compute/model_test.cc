#include "worker/compute/model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::HasSubstr;

v1::ModelSpec Linear(int64_t outputs) {
  v1::ModelSpec spec;
  spec.set_type(v1::MODEL_TYPE_LINEAR);
  spec.set_output_size(outputs);
  return spec;
}

v1::ModelSpec SoftmaxRegression(int64_t classes) {
  v1::ModelSpec spec;
  spec.set_type(v1::MODEL_TYPE_SOFTMAX_REGRESSION);
  spec.set_num_classes(classes);
  return spec;
}

v1::ModelSpec Mlp(std::vector<int64_t> hidden, int64_t classes) {
  v1::ModelSpec spec;
  spec.set_type(v1::MODEL_TYPE_MLP);
  for (int64_t h : hidden) spec.add_hidden_sizes(h);
  spec.set_num_classes(classes);
  return spec;
}

std::unique_ptr<Model> Make(const v1::ModelSpec& spec, int64_t features) {
  auto model = Model::Create(spec, features);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// Uniform floats from mt19937, whose sequence the standard fixes (std distributions are not
// fixed, so they would make the test data differ between standard libraries).
class Rng {
 public:
  explicit Rng(uint32_t seed) : gen_(seed) {}
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(gen_() >> 8) * (1.0f / 16777216.0f);
  }
  int64_t Below(int64_t n) { return static_cast<int64_t>(gen_() % static_cast<uint32_t>(n)); }

 private:
  std::mt19937 gen_;
};

Tensor RandomTensor(std::vector<int64_t> shape, Rng& rng, float scale) {
  Tensor t(std::move(shape));
  for (float& v : t.span()) v = rng.Uniform(-scale, scale);
  return t;
}

// Every parameter (biases too, so that a lost bias term shows) drawn from U(-scale, scale).
TensorTree RandomParams(const Model& model, Rng& rng, float scale) {
  TensorTree params;
  for (const ParamSpec& spec : model.params()) {
    params[spec.name] = RandomTensor(spec.shape, rng, scale);
  }
  return params;
}

Batch RandomBatch(const Model& model, int64_t n, int64_t features, int64_t outputs, Rng& rng) {
  Batch batch;
  batch.inputs = RandomTensor({n, features}, rng, 1.0f);
  if (model.is_classification()) {
    batch.targets = Tensor({n});
    for (float& v : batch.targets.span()) v = static_cast<float>(rng.Below(outputs));
  } else {
    batch.targets = RandomTensor({n, outputs}, rng, 1.0f);
  }
  return batch;
}

// The hidden layers' pre-activations, by plain loops (an implementation independent of the
// model's), in order; empty for single-layer models.
std::vector<float> HiddenPreActivations(const Model& model, const TensorTree& params,
                                        const Batch& batch) {
  std::vector<float> all;
  const int64_t n = batch.inputs.dim(0);
  std::vector<float> a(batch.inputs.span().begin(), batch.inputs.span().end());
  const size_t layers = model.params().size() / 2;
  for (size_t l = 0; l + 1 < layers; ++l) {
    const Tensor& w = params.at(model.params()[2 * l].name);
    const Tensor& b = params.at(model.params()[2 * l + 1].name);
    const int64_t in = w.dim(0), out = w.dim(1);
    std::vector<float> next(n * out);
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < out; ++j) {
        double z = b.data()[j];
        for (int64_t k = 0; k < in; ++k) z += double{a[i * in + k]} * w.data()[k * out + j];
        all.push_back(static_cast<float>(z));
        next[i * out + j] = std::max(static_cast<float>(z), 0.0f);
      }
    }
    a = std::move(next);
  }
  return all;
}

std::vector<bool> ReluPattern(const Model& model, const TensorTree& params, const Batch& batch) {
  std::vector<bool> pattern;
  for (float z : HiddenPreActivations(model, params, batch)) pattern.push_back(z > 0);
  return pattern;
}

double Loss(const Model& model, const TensorTree& params, const Batch& batch) {
  auto result = model.LossAndGradients(params, batch);
  EXPECT_TRUE(result.ok()) << result.status();
  return result.ok() ? result->loss : 0.0;
}

// Central differences in float32 with a step of 1e-2. The forward pass rounds each O(1) loss to
// ~1e-7, which the difference divides by 2e-2 into ~5e-6 of noise; the truncation error
// h^2/6 * |L'''| is ~1e-5 for O(1) inputs and parameters (zero for the quadratic MSE). Observed
// errors are below 4e-6. The tolerance, 1e-4 + 1e-3 * |g|, is ten times those estimates, and
// every parameter must have some gradient above 100x the absolute tolerance, so a dropped term
// (a bias gradient, a ReLU mask, a factor) fails by orders of magnitude.
constexpr float kStep = 1e-2f;
constexpr double kAbsTol = 1e-4;
constexpr double kRelTol = 1e-3;

void ExpectGradientsMatchFiniteDifferences(const Model& model, TensorTree params,
                                           const Batch& batch) {
  auto analytic = model.LossAndGradients(params, batch);
  ASSERT_TRUE(analytic.ok()) << analytic.status();
  ASSERT_EQ(analytic->grads.size(), params.size());
  const std::vector<bool> pattern = ReluPattern(model, params, batch);
  for (const ParamSpec& spec : model.params()) {
    SCOPED_TRACE(spec.name);
    const Tensor& grad = analytic->grads.at(spec.name);
    ASSERT_EQ(grad.shape(), spec.shape);
    float* p = params[spec.name].data();
    double largest = 0;
    for (int64_t i = 0; i < grad.size(); ++i) {
      const float original = p[i];
      const float plus = original + kStep, minus = original - kStep;
      p[i] = plus;
      const double loss_plus = Loss(model, params, batch);
      ASSERT_EQ(ReluPattern(model, params, batch), pattern) << "a ReLU kink within the step";
      p[i] = minus;
      const double loss_minus = Loss(model, params, batch);
      ASSERT_EQ(ReluPattern(model, params, batch), pattern) << "a ReLU kink within the step";
      p[i] = original;
      const double numeric = (loss_plus - loss_minus) / (double{plus} - double{minus});
      EXPECT_NEAR(grad.data()[i], numeric, kAbsTol + kRelTol * std::abs(numeric))
          << "[" << i << "]";
      largest = std::max(largest, std::abs(numeric));
    }
    EXPECT_GT(largest, 100 * kAbsTol) << "gradients too small for the check to mean anything";
  }
}

TEST(ModelGradientTest, Linear) {
  Rng rng(1);
  auto model = Make(Linear(3), 5);
  const TensorTree params = RandomParams(*model, rng, 1.0f);
  ExpectGradientsMatchFiniteDifferences(*model, params, RandomBatch(*model, 6, 5, 3, rng));
}

TEST(ModelGradientTest, SoftmaxRegression) {
  Rng rng(2);
  auto model = Make(SoftmaxRegression(4), 5);
  const TensorTree params = RandomParams(*model, rng, 1.0f);
  ExpectGradientsMatchFiniteDifferences(*model, params, RandomBatch(*model, 7, 5, 4, rng));
}

TEST(ModelGradientTest, MlpWithTwoHiddenLayers) {
  Rng rng(3);
  auto model = Make(Mlp({6, 5}, 3), 4);
  // Draw until every hidden pre-activation is at least 0.1 from the ReLU kink, so that no
  // perturbation of kStep crosses it (the check above asserts that too). Deterministic.
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 10000) << "no draw keeps away from the ReLU kinks";
    const TensorTree params = RandomParams(*model, rng, 1.0f);
    const Batch batch = RandomBatch(*model, 4, 4, 3, rng);
    const std::vector<float> z = HiddenPreActivations(*model, params, batch);
    if (std::any_of(z.begin(), z.end(), [](float v) { return std::abs(v) < 0.1f; })) continue;
    // Both signs present, so the mask matters.
    ASSERT_TRUE(std::any_of(z.begin(), z.end(), [](float v) { return v < 0; }));
    ExpectGradientsMatchFiniteDifferences(*model, params, batch);
    break;
  }
}

// 2 examples x 3 features, 2 outputs:
//   y = [[1*0.1 + 2*0.3 + 0.5, 1*0.2 - 2*0.1 + 3*0.5 - 0.5], ...] = [[1.2, 1.0], [2.4, 2.8]]
//   errors against [[1, 1], [2, 3]]: [[0.2, 0], [0.4, -0.2]]; squares sum to 0.24; mean 0.06.
//   dL/dy = 2 * error / 4 = [[0.1, 0], [0.2, -0.1]]; db = [0.3, -0.1];
//   dW = x^T dL/dy = [[0.9, -0.4], [1.2, -0.5], [1.5, -0.6]].
TEST(ModelLossTest, LinearByHand) {
  auto model = Make(Linear(2), 3);
  const TensorTree params = {
      {"dense_0/kernel", Tensor({3, 2}, {0.1f, 0.2f, 0.3f, -0.1f, 0.0f, 0.5f})},
      {"dense_0/bias", Tensor({2}, {0.5f, -0.5f})}};
  Batch batch{Tensor({2, 3}, {1, 2, 3, 4, 5, 6}), Tensor({2, 2}, {1, 1, 2, 3})};
  auto result = model->LossAndGradients(params, batch);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->loss, 0.06, 1e-6);
  EXPECT_EQ(result->accuracy, 0);
  EXPECT_THAT(result->grads["dense_0/bias"].span(),
              ElementsAre(FloatNear(0.3f, 1e-6f), FloatNear(-0.1f, 1e-6f)));
  EXPECT_THAT(
      result->grads["dense_0/kernel"].span(),
      ElementsAre(FloatNear(0.9f, 1e-6f), FloatNear(-0.4f, 1e-6f), FloatNear(1.2f, 1e-6f),
                  FloatNear(-0.5f, 1e-6f), FloatNear(1.5f, 1e-6f), FloatNear(-0.6f, 1e-6f)));
}

// W = I, b = 0: logits are the inputs, [1, 0, 0] and [0, 2, 0]; labels 0 and 2.
//   loss_1 = log(e + 2) - 1, loss_2 = log(e^2 + 2) - 0; the first is classified correctly.
TEST(ModelLossTest, SoftmaxRegressionByHand) {
  auto model = Make(SoftmaxRegression(3), 3);
  const TensorTree params = {{"dense_0/kernel", Tensor({3, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1})},
                             {"dense_0/bias", Tensor({3})}};
  Batch batch{Tensor({2, 3}, {1, 0, 0, 0, 2, 0}), Tensor({2}, {0, 2})};
  auto result = model->LossAndGradients(params, batch);
  ASSERT_TRUE(result.ok()) << result.status();
  const double e = std::exp(1.0);
  EXPECT_NEAR(result->loss, (std::log(e + 2) - 1 + std::log(e * e + 2)) / 2, 1e-6);
  EXPECT_EQ(result->accuracy, 0.5);
  // db = mean of (softmax - onehot): [(e/(e+2) - 1 + 1/(e^2+2)) / 2, ...].
  EXPECT_NEAR(result->grads["dense_0/bias"].data()[0], (e / (e + 2) - 1 + 1 / (e * e + 2)) / 2,
              1e-6);
}

// Logits far apart must not overflow: log-sum-exp keeps the loss finite and exact.
TEST(ModelLossTest, SoftmaxIsStableForLargeLogits) {
  auto model = Make(SoftmaxRegression(2), 1);
  const TensorTree params = {{"dense_0/kernel", Tensor({1, 2}, {1000, -1000})},
                             {"dense_0/bias", Tensor({2})}};
  Batch batch{Tensor({1, 1}, {1}), Tensor({1}, {1})};
  auto result = model->LossAndGradients(params, batch);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->loss, 2000, 1e-3);
  EXPECT_TRUE(std::isfinite(result->grads["dense_0/kernel"].data()[0]));
}

// One hidden layer of 2 units computing relu(x0) and relu(-x0); the output layer passes them on.
//   x0 = 1:  hidden [1, 0], logits [1, 0], label 0: loss log(e + 1) - 1, correct
//   x0 = -2: hidden [0, 2], logits [0, 2], label 0: loss log(1 + e^2),   wrong
TEST(ModelLossTest, MlpByHand) {
  auto model = Make(Mlp({2}, 2), 3);
  const TensorTree params = {{"dense_0/kernel", Tensor({3, 2}, {1, -1, 0, 0, 0, 0})},
                             {"dense_0/bias", Tensor({2})},
                             {"dense_1/kernel", Tensor({2, 2}, {1, 0, 0, 1})},
                             {"dense_1/bias", Tensor({2})}};
  Batch batch{Tensor({2, 3}, {1, 5, 5, -2, 5, 5}), Tensor({2}, {0, 0})};
  auto result = model->LossAndGradients(params, batch);
  ASSERT_TRUE(result.ok()) << result.status();
  const double e = std::exp(1.0);
  EXPECT_NEAR(result->loss, (std::log(e + 1) - 1 + std::log(1 + e * e)) / 2, 1e-6);
  EXPECT_EQ(result->accuracy, 0.5);
  // Each hidden unit is active for one example only, and the output layer passes the logit
  // gradients (softmax - onehot) / 2 straight back to it:
  //   unit 0, example 1: dz = -1 / (2 (e + 1));  dW0[0][0] = x0 * dz = -1 / (2 (e + 1))
  //   unit 1, example 2: dz = e^2 / (2 (1 + e^2)); dW0[0][1] = x0 * dz = -e^2 / (1 + e^2)
  // and feature 1 (5 in both examples) gets 5 * dz.
  const Tensor& dw0 = result->grads["dense_0/kernel"];
  EXPECT_NEAR(dw0.data()[0], -1 / (2 * (e + 1)), 1e-6);
  EXPECT_NEAR(dw0.data()[1], -e * e / (1 + e * e), 1e-6);
  EXPECT_NEAR(dw0.data()[2], -5 / (2 * (e + 1)), 1e-6);
  EXPECT_NEAR(dw0.data()[3], 5 * e * e / (2 * (1 + e * e)), 1e-6);
}

// Examples [start, limit) of a batch: one device's shard.
Batch Rows(const Batch& batch, int64_t start, int64_t limit) {
  return Batch{*batch.inputs.SliceRows(start, limit), *batch.targets.SliceRows(start, limit)};
}

// Each built-in model with random parameters and a random batch of 10 examples of 6 features.
class ModelEvalTest : public ::testing::TestWithParam<v1::ModelSpec> {
 protected:
  void SetUp() override {
    Rng rng(4);
    model_ = Make(GetParam(), 6);
    params_ = RandomParams(*model_, rng, 1.0f);
    batch_ = RandomBatch(*model_, 10, 6, model_->params().back().shape[0], rng);
  }

  std::unique_ptr<Model> model_;
  TensorTree params_;
  Batch batch_;
};

TEST_P(ModelEvalTest, EvaluateSumsMatchTheMeanLossAndAccuracy) {
  auto train = model_->LossAndGradients(params_, batch_);
  auto eval = model_->Evaluate(params_, batch_);
  ASSERT_TRUE(train.ok()) << train.status();
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->count, 10);
  EXPECT_NEAR(eval->loss_sum / eval->count, train->loss, 1e-6 * std::abs(train->loss));
  EXPECT_EQ(static_cast<double>(eval->correct) / eval->count, train->accuracy);
  if (!model_->is_classification()) {
    EXPECT_EQ(eval->correct, 0);
  }

  // Sums over shards of any size add up.
  auto a = model_->Evaluate(params_, Rows(batch_, 0, 3));
  auto b = model_->Evaluate(params_, Rows(batch_, 3, 10));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->loss_sum + b->loss_sum, eval->loss_sum, 1e-5 * std::abs(eval->loss_sum));
  EXPECT_EQ(a->correct + b->correct, eval->correct);
  EXPECT_EQ(a->count + b->count, eval->count);

  // An empty shard contributes nothing.
  auto empty = model_->Evaluate(params_, Rows(batch_, 0, 0));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->count, 0);
  EXPECT_EQ(empty->loss_sum, 0);
}

// Data parallelism: the mean of the gradients of equal shards is the gradient of the batch.
TEST_P(ModelEvalTest, MeanOfShardGradientsIsTheBatchGradient) {
  auto whole = model_->LossAndGradients(params_, batch_);
  auto a = model_->LossAndGradients(params_, Rows(batch_, 0, 5));
  auto b = model_->LossAndGradients(params_, Rows(batch_, 5, 10));
  ASSERT_TRUE(whole.ok() && a.ok() && b.ok());
  TensorTree mean = a->grads;
  for (auto& [name, g] : mean) {
    for (int64_t i = 0; i < g.size(); ++i) {
      g.data()[i] = (g.data()[i] + b->grads.at(name).data()[i]) / 2;
    }
  }
  auto diff = CompareTrees(mean, whole->grads);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_LT(diff->max_relative, 1e-4) << diff->where;
  EXPECT_NEAR((a->loss + b->loss) / 2, whole->loss, 1e-6 * std::abs(whole->loss));
}

INSTANTIATE_TEST_SUITE_P(AllModels, ModelEvalTest,
                         ::testing::Values(Linear(2), SoftmaxRegression(4), Mlp({5, 3}, 4)),
                         [](const auto& info) { return v1::ModelType_Name(info.param.type()); });

TEST(ModelTest, CreateRejectsBadSpecs) {
  auto unknown = Model::Create(v1::ModelSpec(), 4);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), HasSubstr("spec.model.type"));
  auto no_classes = Model::Create(SoftmaxRegression(0), 4);
  EXPECT_THAT(no_classes.status().message(), HasSubstr("spec.model.num_classes"));
  EXPECT_FALSE(Model::Create(Linear(1), 0).ok());
}

TEST(ModelTest, InitGivesTheCatalogShapes) {
  auto model = Make(Mlp({8}, 3), 5);
  EXPECT_TRUE(model->is_classification());
  EXPECT_FALSE(Make(Linear(1), 5)->is_classification());
  const TensorTree params = model->Init(1);
  ASSERT_EQ(params.size(), 4u);
  EXPECT_EQ(params.at("dense_0/kernel").shape(), (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(params.at("dense_1/bias").shape(), (std::vector<int64_t>{3}));
  EXPECT_EQ(model->Init(1), params);
}

class ModelErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Rng rng(6);
    model_ = Make(Mlp({4}, 3), 5);
    params_ = model_->Init(0);
    batch_ = RandomBatch(*model_, 3, 5, 3, rng);
  }

  // Both entry points fail the same way.
  void ExpectInvalid(const TensorTree& params, const Batch& batch, const std::string& names) {
    auto train = model_->LossAndGradients(params, batch);
    EXPECT_EQ(train.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(train.status().message(), HasSubstr(names));
    auto eval = model_->Evaluate(params, batch);
    EXPECT_EQ(eval.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(eval.status().message(), HasSubstr(names));
  }

  std::unique_ptr<Model> model_;
  TensorTree params_;
  Batch batch_;
};

TEST_F(ModelErrorTest, WrongFeatureWidth) {
  ExpectInvalid(params_, Batch{Tensor({3, 4}), batch_.targets}, "batch.inputs");
  ExpectInvalid(params_, Batch{Tensor({15}), batch_.targets}, "batch.inputs");
}

TEST_F(ModelErrorTest, WrongTargetShape) {
  ExpectInvalid(params_, Batch{batch_.inputs, Tensor({3, 1})}, "batch.targets");
  ExpectInvalid(params_, Batch{batch_.inputs, Tensor({2})}, "batch.targets");
  auto linear = Make(Linear(2), 5);
  auto result = linear->LossAndGradients(linear->Init(0), Batch{batch_.inputs, Tensor({3})});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("batch.targets"));
}

TEST_F(ModelErrorTest, LabelOutOfRange) {
  for (float bad : {3.0f, -1.0f, 0.5f, NAN}) {
    Batch batch = batch_;
    batch.targets.data()[1] = bad;
    ExpectInvalid(params_, batch, "batch.targets[1]");
  }
}

TEST_F(ModelErrorTest, MissingParameter) {
  TensorTree params = params_;
  params.erase("dense_1/bias");
  ExpectInvalid(params, batch_, "'dense_1/bias' is missing");
}

TEST_F(ModelErrorTest, WrongParameterShape) {
  TensorTree params = params_;
  params["dense_0/kernel"] = Tensor({4, 5});
  ExpectInvalid(params, batch_, "'dense_0/kernel' has shape (4, 5), expected (5, 4)");
}

TEST_F(ModelErrorTest, UnexpectedParameter) {
  TensorTree params = params_;
  params["dense_7/kernel"] = Tensor({1, 1});
  ExpectInvalid(params, batch_, "'dense_7/kernel'");
}

TEST_F(ModelErrorTest, EmptyBatchHasNoMeanLoss) {
  auto result = model_->LossAndGradients(params_, Batch{Tensor({0, 5}), Tensor({0})});
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("empty"));
}

// ---- Tensor parallelism ----

// The fake of the collective layer: `size` threads sum equal-length spans in place, one round per
// call. Contributions are summed in index order, so every participant gets bitwise the same sum
// whatever the arrival order. Every wait has a deadline, so a test whose threads diverge fails
// instead of hanging.
class FakeAllReduce {
 public:
  explicit FakeAllReduce(int64_t size) : size_(size), contributions_(size) {}

  // The callback of the device at `index`.
  std::function<absl::Status(absl::Span<float>)> For(int64_t index) {
    return [this, index](absl::Span<float> values) { return Sum(index, values); };
  }

 private:
  absl::Status Sum(int64_t index, absl::Span<float> values) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    absl::MutexLock lock(&mu_);
    // The previous round must be handed out to everyone before a new one starts.
    if (!mu_.AwaitWithDeadline(absl::Condition(this, &FakeAllReduce::AcceptingLocked),
                               deadline)) {
      return absl::DeadlineExceededError(absl::StrCat("device ", index, ": previous round stuck"));
    }
    contributions_[index].assign(values.begin(), values.end());
    const uint64_t round = round_;
    if (++arrived_ == size_) {
      sum_.assign(values.size(), 0.0f);
      for (const std::vector<float>& c : contributions_) {
        if (c.size() != sum_.size()) return absl::InvalidArgumentError("sizes differ");
        for (size_t i = 0; i < c.size(); ++i) sum_[i] += c[i];
      }
      ++round_;
    } else {
      auto done = [this, round]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return round_ != round; };
      if (!mu_.AwaitWithDeadline(absl::Condition(&done), deadline)) {
        return absl::DeadlineExceededError(
            absl::StrCat("device ", index, ": peers did not join the all-reduce"));
      }
    }
    std::copy(sum_.begin(), sum_.end(), values.begin());
    if (++departed_ == size_) arrived_ = departed_ = 0;
    return absl::OkStatus();
  }

  bool AcceptingLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return arrived_ < size_; }

  const int64_t size_;
  absl::Mutex mu_;
  std::vector<std::vector<float>> contributions_ ABSL_GUARDED_BY(mu_);
  std::vector<float> sum_ ABSL_GUARDED_BY(mu_);
  int64_t arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t departed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_ ABSL_GUARDED_BY(mu_) = 0;
};

std::unique_ptr<Model> MakeParallel(const v1::ModelSpec& spec, int64_t features, int64_t m,
                                    int64_t index, FakeAllReduce* reducer) {
  auto model = Model::Create(spec, features, {m, index, reducer->For(index)});
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(model).value() : nullptr;
}

// The block of every parameter of `full` that `device` holds.
TensorTree Shards(const Model& device, const TensorTree& full) {
  TensorTree shards;
  for (const ParamSpec& p : device.params()) {
    auto block = full.at(p.name).Slice(device.LocalBlock(p));
    EXPECT_TRUE(block.ok()) << block.status();
    if (block.ok()) shards[p.name] = *std::move(block);
  }
  return shards;
}

constexpr int64_t kFeatures = 5;
constexpr int64_t kClasses = 3;

// {model-axis size, hidden sizes}: one hidden layer (a column-row pair), two (a pair and a
// replicated output layer), three (two pairs, the second with a row-parallel output layer).
using ParallelCase = std::pair<int64_t, std::vector<int64_t>>;

class TensorParallelTest : public ::testing::TestWithParam<ParallelCase> {
 protected:
  void SetUp() override {
    m_ = GetParam().first;
    spec_ = Mlp(GetParam().second, kClasses);
    single_ = Make(spec_, kFeatures);
    reducer_ = std::make_unique<FakeAllReduce>(m_);
    for (int64_t i = 0; i < m_; ++i) {
      devices_.push_back(MakeParallel(spec_, kFeatures, m_, i, reducer_.get()));
    }
  }

  // Runs LossAndGradients, then Evaluate, on m threads (device i with its shards of `full`), and
  // compares them with the single-device results on the same batch.
  void ExpectMatchesSingleDevice(const TensorTree& full, const Batch& batch) {
    auto want = single_->LossAndGradients(full, batch);
    auto want_eval = single_->Evaluate(full, batch);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(want_eval.ok()) << want_eval.status();
    std::vector<absl::StatusOr<LossAndGrads>> got(m_, absl::UnknownError("not run"));
    std::vector<absl::StatusOr<EvalResult>> got_eval(m_, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (int64_t i = 0; i < m_; ++i) {
      threads.emplace_back([&, i] {
        const TensorTree shards = Shards(*devices_[i], full);
        got[i] = devices_[i]->LossAndGradients(shards, batch);
        got_eval[i] = devices_[i]->Evaluate(shards, batch);
      });
    }
    for (std::thread& t : threads) t.join();

    const double loss_tol = 1e-6 * std::abs(want->loss);
    for (int64_t i = 0; i < m_; ++i) {
      SCOPED_TRACE(absl::StrCat("device ", i, " of ", m_));
      ASSERT_TRUE(got[i].ok()) << got[i].status();
      ASSERT_TRUE(got_eval[i].ok()) << got_eval[i].status();
      EXPECT_NEAR(got[i]->loss, want->loss, loss_tol);
      EXPECT_NEAR(got[i]->accuracy, want->accuracy, 1e-6 * want->accuracy);
      EXPECT_NEAR(got_eval[i]->loss_sum, want_eval->loss_sum, 1e-6 * want_eval->loss_sum);
      EXPECT_EQ(got_eval[i]->correct, want_eval->correct);
      EXPECT_EQ(got_eval[i]->count, want_eval->count);
      // The loss is the same on every device of the model axis, bit for bit.
      EXPECT_EQ(got[i]->loss, got[0]->loss);
      EXPECT_EQ(got_eval[i]->loss_sum, got_eval[0]->loss_sum);

      auto diff = CompareTrees(got[i]->grads, Shards(*devices_[i], want->grads));
      ASSERT_TRUE(diff.ok()) << diff.status();
      // Normwise: the shards sum in another order than one device does, so an element that
      // cancels can differ by more, relative to itself, than the tensor does.
      EXPECT_LT(diff->max_normwise, 1e-5) << diff->normwise_where;
      EXPECT_LT(diff->max_relative, 1e-4) << diff->where;
      for (const ParamSpec& p : devices_[i]->params()) {
        if (p.partition.dims().empty()) {
          EXPECT_EQ(got[i]->grads.at(p.name), got[0]->grads.at(p.name)) << p.name;
        }
      }
    }
  }

  int64_t m_ = 1;
  v1::ModelSpec spec_;
  std::unique_ptr<Model> single_;
  std::unique_ptr<FakeAllReduce> reducer_;
  std::vector<std::unique_ptr<Model>> devices_;
};

TEST_P(TensorParallelTest, MatchesOneDeviceFromTheSameInit) {
  Rng rng(7);
  ExpectMatchesSingleDevice(single_->Init(11), RandomBatch(*single_, 7, kFeatures, kClasses, rng));
}

// Non-zero biases too, so that a bias added on every device (or not at all) shows.
TEST_P(TensorParallelTest, MatchesOneDeviceForRandomParameters) {
  Rng rng(8);
  const TensorTree full = RandomParams(*single_, rng, 1.0f);
  ExpectMatchesSingleDevice(full, RandomBatch(*single_, 7, kFeatures, kClasses, rng));
}

TEST_P(TensorParallelTest, InitShardsAreSlicesOfTheSingleDeviceInit) {
  const TensorTree full = single_->Init(5);
  for (int64_t i = 0; i < m_; ++i) {
    const TensorTree shards = devices_[i]->Init(5);
    EXPECT_EQ(shards, Shards(*devices_[i], full)) << "device " << i;
    for (const ParamSpec& p : devices_[i]->params()) {
      EXPECT_EQ(shards.at(p.name).shape(), devices_[i]->LocalShape(p)) << p.name;
    }
  }
  // The split is real: the first layer's kernel holds out/m columns, the second's in/m rows;
  // the row-parallel bias is whole.
  const int64_t h = GetParam().second[0];
  const std::vector<ParamSpec>& p = devices_[0]->params();
  EXPECT_EQ(devices_[0]->LocalShape(p[0]), (std::vector<int64_t>{kFeatures, h / m_}));
  EXPECT_EQ(devices_[0]->LocalShape(p[1]), (std::vector<int64_t>{h / m_}));
  EXPECT_EQ(devices_[0]->LocalShape(p[2]), (std::vector<int64_t>{h / m_, p[2].shape[1]}));
  EXPECT_EQ(devices_[0]->LocalShape(p[3]), p[3].shape);
}

INSTANTIATE_TEST_SUITE_P(
    AxisSizesAndDepths, TensorParallelTest,
    ::testing::Values(ParallelCase{2, {8}}, ParallelCase{2, {8, 6}}, ParallelCase{2, {8, 6, 12}},
                      ParallelCase{4, {8}}, ParallelCase{4, {8, 6}},
                      ParallelCase{4, {8, 6, 12}}),
    [](const auto& info) {
      return absl::StrCat("m", info.param.first, "_", info.param.second.size(), "hidden");
    });

TEST(TensorParallelErrorTest, CreateRejectsBadParallelism) {
  auto ok = [](absl::Span<float>) { return absl::OkStatus(); };
  auto softmax = Model::Create(SoftmaxRegression(4), 5, {2, 0, ok});
  EXPECT_EQ(softmax.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(softmax.status().message(), HasSubstr("MODEL_TYPE_SOFTMAX_REGRESSION"));
  for (int64_t index : {-1, 2}) {
    auto out_of_range = Model::Create(Mlp({8}, 3), 5, {2, index, ok});
    EXPECT_EQ(out_of_range.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(out_of_range.status().message(),
                HasSubstr(absl::StrCat("index ", index, " is outside the model axis [0, 2)")));
  }
  auto no_callback = Model::Create(Mlp({8}, 3), 5, {2, 0, nullptr});
  EXPECT_EQ(no_callback.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_callback.status().message(), HasSubstr("all_reduce_sum"));
  auto no_axis = Model::Create(Mlp({8}, 3), 5, {0, 0, ok});
  EXPECT_EQ(no_axis.status().code(), absl::StatusCode::kInvalidArgument);
  auto indivisible = Model::Create(Mlp({6}, 3), 5, {4, 0, ok});
  EXPECT_EQ(indivisible.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(indivisible.status().message(), HasSubstr("spec.model.hidden_sizes[0]"));
}

TEST(TensorParallelErrorTest, WrongLocalShapeNamesTheShard) {
  int calls = 0;
  auto model = Model::Create(Mlp({8}, 3), 5, {2, 1, [&calls](absl::Span<float>) {
                                                ++calls;
                                                return absl::OkStatus();
                                              }});
  ASSERT_TRUE(model.ok()) << model.status();
  Rng rng(9);
  const Batch batch = RandomBatch(**model, 3, 5, 3, rng);
  TensorTree params = (*model)->Init(0);
  params["dense_0/kernel"] = Tensor({5, 8});  // the global shape
  const std::string want =
      "'dense_0/kernel' has shape (5, 8), expected (5, 4): the local shard (model-axis index 1 "
      "of 2) of the global (5, 8)";
  auto train = (*model)->LossAndGradients(params, batch);
  EXPECT_EQ(train.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(train.status().message(), HasSubstr(want));
  auto eval = (*model)->Evaluate(params, batch);
  EXPECT_EQ(eval.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(eval.status().message(), HasSubstr(want));
  EXPECT_EQ(calls, 0) << "the shapes are checked before any all-reduce";
}

TEST(TensorParallelErrorTest, AllReduceErrorsPassThrough) {
  auto model = Model::Create(Mlp({8}, 3), 5, {2, 0, [](absl::Span<float>) {
                                                return absl::UnavailableError("peer w-1 died");
                                              }});
  ASSERT_TRUE(model.ok()) << model.status();
  Rng rng(10);
  const Batch batch = RandomBatch(**model, 3, 5, 3, rng);
  const TensorTree params = (*model)->Init(0);
  auto train = (*model)->LossAndGradients(params, batch);
  EXPECT_EQ(train.status(), absl::UnavailableError("peer w-1 died"));
  auto eval = (*model)->Evaluate(params, batch);
  EXPECT_EQ(eval.status(), absl::UnavailableError("peer w-1 died"));
}

}  // namespace
}  // namespace substrax
