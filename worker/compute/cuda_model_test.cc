// The GPU backend against the CPU reference (worker/compute) on the same seed and batch.
// Skips without a usable GPU, and in the default build (no --config=cuda).
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/optimizers.h"
#include "core/optimizers_testing.h"
#include "gtest/gtest.h"
#include "substrax/v1/job.pb.h"
#include "worker/compute/model.h"
#include "worker/compute/optimizer.h"
#include "worker/compute/cuda_model.h"
#include "worker/gpu/cuda_device.h"
#include "worker/tensor/tensor.h"

#ifdef SUBSTRAX_CUDA
#include <cuda_runtime.h>
#endif

namespace substrax {
namespace {

// Skips the test unless this build has CUDA and the machine a usable device.
#define SKIP_WITHOUT_GPU()                                                                      \
  do {                                                                                          \
    if (!CudaBuilt()) GTEST_SKIP() << "built without --config=cuda";                            \
    absl::StatusOr<int> count = CudaDeviceCount();                                              \
    if (!count.ok()) GTEST_SKIP() << "no CUDA device: " << count.status().message();            \
  } while (false)

constexpr int64_t kFeatures = 20;

v1::ModelSpec Spec(v1::ModelType type) {
  v1::ModelSpec spec;
  spec.set_type(type);
  if (type == v1::MODEL_TYPE_MLP) {
    spec.add_hidden_sizes(32);
    spec.add_hidden_sizes(16);
  }
  if (type == v1::MODEL_TYPE_LINEAR) {
    spec.set_output_size(3);
  } else {
    spec.set_num_classes(10);
  }
  return spec;
}

// A deterministic batch: inputs in [-1, 1), labels in [0, 10) or regression targets.
Batch MakeBatch(int64_t n, bool classification, uint32_t seed) {
  uint32_t state = seed * 2654435761u + 1;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1 << 24);
  };
  std::vector<float> x(n * kFeatures);
  for (float& v : x) v = 2 * next() - 1;
  Batch batch;
  batch.inputs = Tensor({n, kFeatures}, x);
  if (classification) {
    std::vector<float> t(n);
    for (float& v : t) v = std::floor(next() * 10);
    batch.targets = Tensor({n}, t);
  } else {
    std::vector<float> t(n * 3);
    for (float& v : t) v = 2 * next() - 1;
    batch.targets = Tensor({n, 3}, t);
  }
  return batch;
}

// A batch uploaded to the device, with its view.
struct UploadedBatch {
  DeviceTensor inputs, targets;
  DeviceBatchView view;
};

UploadedBatch Upload(const CudaDevice& device, const Batch& batch) {
  UploadedBatch out;
  out.inputs = *device.Upload(batch.inputs);
  out.targets = *device.Upload(batch.targets);
  out.view = {out.inputs.data(), out.targets.data(), batch.size(), batch.inputs.dim(1),
              batch.targets.rank() == 1 ? 1 : batch.targets.dim(1)};
  return out;
}

class CudaModelTest : public ::testing::TestWithParam<v1::ModelType> {};

TEST_P(CudaModelTest, LossGradientsAndEvaluateMatchCpu) {
  SKIP_WITHOUT_GPU();
  const v1::ModelSpec spec = Spec(GetParam());
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  auto cpu = Model::Create(spec, kFeatures);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = CudaModel::Create(spec, kFeatures, device->get());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto metrics = CudaMetrics::Create(**device);
  ASSERT_TRUE(metrics.ok()) << metrics.status();

  const TensorTree cpu_params = (*cpu)->Init(7);
  auto gpu_params = (*gpu)->Init(7);
  ASSERT_TRUE(gpu_params.ok()) << gpu_params.status();
  // Initialised on the host with init.h: equal bit for bit.
  auto downloaded = (*device)->Download(*gpu_params);
  ASSERT_TRUE(downloaded.ok()) << downloaded.status();
  EXPECT_EQ(*downloaded, cpu_params);

  const Batch batch = MakeBatch(67, (*cpu)->is_classification(), 3);
  auto want = (*cpu)->LossAndGradients(cpu_params, batch);
  ASSERT_TRUE(want.ok()) << want.status();
  UploadedBatch device_batch = Upload(**device, batch);
  DeviceTree grads;
  ASSERT_TRUE((*gpu)->LossAndGradients(*gpu_params, device_batch.view, &grads, metrics->get()).ok());
  auto sums = (*metrics)->Read();
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_EQ(sums->count, 67);
  const double loss = sums->loss_sum / 67;
  EXPECT_NEAR(loss, want->loss, 1e-5 * std::abs(want->loss));
  if ((*cpu)->is_classification()) {
    EXPECT_EQ(static_cast<double>(sums->correct) / 67, want->accuracy);
  }
  auto got_grads = (*device)->Download(grads);
  ASSERT_TRUE(got_grads.ok()) << got_grads.status();
  auto diff = CompareTrees(*got_grads, want->grads);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_LE(diff->max_normwise, 1e-4) << diff->normwise_where;

  // Evaluate adds the same sums.
  auto eval = (*cpu)->Evaluate(cpu_params, batch);
  ASSERT_TRUE(eval.ok());
  ASSERT_TRUE((*metrics)->Reset().ok());
  ASSERT_TRUE((*gpu)->Evaluate(*gpu_params, device_batch.view, metrics->get()).ok());
  sums = (*metrics)->Read();
  ASSERT_TRUE(sums.ok()) << sums.status();
  EXPECT_NEAR(sums->loss_sum, eval->loss_sum, 1e-5 * std::abs(eval->loss_sum));
  EXPECT_EQ(sums->correct, eval->correct);
  EXPECT_EQ(sums->count, eval->count);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModelTest,
                         ::testing::Values(v1::MODEL_TYPE_LINEAR, v1::MODEL_TYPE_SOFTMAX_REGRESSION,
                                           v1::MODEL_TYPE_MLP));

// One model of `spec` built with `options`, and what its LossAndGradients gives on batches.
struct Run {
  TensorTree grads;
  double loss_sum = 0;
};

class OptionsRunner {
 public:
  OptionsRunner(const CudaDevice& device, const v1::ModelSpec& spec, CudaModelOptions options)
      : device_(device) {
    auto model = CudaModel::Create(spec, kFeatures, &device, {}, options);
    EXPECT_TRUE(model.ok()) << model.status();
    if (model.ok()) model_ = std::move(*model);
    auto metrics = CudaMetrics::Create(device);
    EXPECT_TRUE(metrics.ok()) << metrics.status();
    if (metrics.ok()) metrics_ = std::move(*metrics);
  }
  bool ok() const { return model_ != nullptr && metrics_ != nullptr; }
  CudaModel& model() { return *model_; }

  absl::StatusOr<Run> Step(const DeviceTree& params, const DeviceBatchView& batch) {
    if (absl::Status s = metrics_->Reset(); !s.ok()) return s;
    if (absl::Status s = model_->LossAndGradients(params, batch, &grads_, metrics_.get());
        !s.ok()) {
      return s;
    }
    absl::StatusOr<EvalResult> sums = metrics_->Read();
    if (!sums.ok()) return sums.status();
    absl::StatusOr<TensorTree> grads = device_.Download(grads_);
    if (!grads.ok()) return grads.status();
    return Run{std::move(*grads), sums->loss_sum};
  }

 private:
  const CudaDevice& device_;
  std::unique_ptr<CudaModel> model_;
  std::unique_ptr<CudaMetrics> metrics_;
  DeviceTree grads_;
};

// The fused epilogues do the unfused kernels' float operations in the same order: the same
// results (expected bit for bit; compared within float rounding).
TEST_P(CudaModelTest, FusedAndUnfusedEpiloguesAgree) {
  SKIP_WITHOUT_GPU();
  const v1::ModelSpec spec = Spec(GetParam());
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  CudaModelOptions fused, unfused;
  unfused.fused_epilogues = false;
  OptionsRunner a(**device, spec, fused), b(**device, spec, unfused);
  ASSERT_TRUE(a.ok() && b.ok());
  auto params = a.model().Init(5);
  ASSERT_TRUE(params.ok()) << params.status();
  UploadedBatch batch =
      Upload(**device, MakeBatch(67, spec.type() != v1::MODEL_TYPE_LINEAR, 11));
  auto got = a.Step(*params, batch.view);
  auto want = b.Step(*params, batch.view);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_NEAR(got->loss_sum, want->loss_sum, 1e-6 * std::abs(want->loss_sum));
  auto diff = CompareTrees(got->grads, want->grads);
  ASSERT_TRUE(diff.ok()) << diff.status();
  EXPECT_LE(diff->max_normwise, 1e-6) << diff->normwise_where;
}

// A replayed graph computes what eager launches compute; a batch of another size runs eagerly
// and says why.
TEST_P(CudaModelTest, GraphReplayMatchesEagerLaunches) {
  SKIP_WITHOUT_GPU();
  const v1::ModelSpec spec = Spec(GetParam());
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  CudaModelOptions graphs, eager;
  graphs.cuda_graphs = true;
  OptionsRunner a(**device, spec, graphs), b(**device, spec, eager);
  ASSERT_TRUE(a.ok() && b.ok());
  auto params = a.model().Init(9);
  ASSERT_TRUE(params.ok()) << params.status();
  const bool classification = spec.type() != v1::MODEL_TYPE_LINEAR;
  for (uint32_t seed = 1; seed <= 3; ++seed) {
    UploadedBatch batch = Upload(**device, MakeBatch(64, classification, seed));
    auto got = a.Step(*params, batch.view);
    auto want = b.Step(*params, batch.view);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_DOUBLE_EQ(got->loss_sum, want->loss_sum) << "batch " << seed;
    EXPECT_EQ(got->grads, want->grads) << "batch " << seed;
  }
  // Capture may be refused (the reason then says so); when it worked, every full batch after
  // the first (a warm-up, eager) replayed the graph.
  if (a.model().graph_replays() == 0) {
    GTEST_SKIP() << "no graph was captured: " << a.model().graph_fallback();
  }
  EXPECT_EQ(a.model().graph_replays(), 2);
  UploadedBatch short_batch = Upload(**device, MakeBatch(17, classification, 4));
  auto got = a.Step(*params, short_batch.view);
  auto want = b.Step(*params, short_batch.view);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(got->grads, want->grads);
  EXPECT_EQ(a.model().graph_replays(), 2);
  EXPECT_NE(a.model().graph_fallback().find("17 examples"), std::string::npos)
      << a.model().graph_fallback();
}

// tf32 and bf16 products stay close to fp32 (10 and 8 mantissa bits in, float32 accumulation).
TEST_P(CudaModelTest, ReducedPrecisionStaysCloseToFp32) {
  SKIP_WITHOUT_GPU();
  const v1::ModelSpec spec = Spec(GetParam());
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  CudaModelOptions fp32;
  OptionsRunner reference(**device, spec, fp32);
  ASSERT_TRUE(reference.ok());
  auto params = reference.model().Init(3);
  ASSERT_TRUE(params.ok()) << params.status();
  UploadedBatch batch =
      Upload(**device, MakeBatch(64, spec.type() != v1::MODEL_TYPE_LINEAR, 21));
  auto want = reference.Step(*params, batch.view);
  ASSERT_TRUE(want.ok()) << want.status();
  for (const auto& [precision, tolerance] :
       {std::pair{v1::PRECISION_TF32, 1e-2}, std::pair{v1::PRECISION_BF16, 5e-2}}) {
    CudaModelOptions options;
    options.precision = precision;
    OptionsRunner reduced(**device, spec, options);
    ASSERT_TRUE(reduced.ok());
    auto got = reduced.Step(*params, batch.view);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_NEAR(got->loss_sum, want->loss_sum, tolerance * std::abs(want->loss_sum))
        << v1::Precision_Name(precision);
    auto diff = CompareTrees(got->grads, want->grads);
    ASSERT_TRUE(diff.ok()) << diff.status();
    EXPECT_LE(diff->max_normwise, tolerance)
        << v1::Precision_Name(precision) << ": " << diff->normwise_where;
  }
}

v1::OptimizerSpec OptimizerSpec(const std::string& type) {
  v1::OptimizerSpec spec;
  spec.set_type(type);
  spec.set_learning_rate(0.01);
  if (type == "momentum") (*spec.mutable_hyperparameters())["nesterov"] = 1;
  return spec;
}

class CudaOptimizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaOptimizerTest, StepsMatchCpuFromTheSameGradients) {
  SKIP_WITHOUT_GPU();
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok()) << device.status();
  const v1::ModelSpec spec = Spec(v1::MODEL_TYPE_MLP);
  auto cpu_model = Model::Create(spec, kFeatures);
  ASSERT_TRUE(cpu_model.ok());
  // Eager launches, and a replayed graph (the gradients are uploaded into the same buffers every
  // step, so one capture serves every step after the first, a warm-up).
  for (const bool graphs : {false, true}) {
    SCOPED_TRACE(graphs ? "cuda graph" : "eager");
    auto cpu_opt = Optimizer::Create(OptimizerSpec(GetParam()));
    ASSERT_TRUE(cpu_opt.ok());
    auto gpu_opt = CudaOptimizer::Create(OptimizerSpec(GetParam()), device->get());
    if (gpu_opt.status().code() == absl::StatusCode::kUnimplemented) {
      GTEST_SKIP() << gpu_opt.status().message();  // a row of the core table without a CUDA kernel
    }
    ASSERT_TRUE(gpu_opt.ok()) << gpu_opt.status();
    if (graphs) (*gpu_opt)->EnableCudaGraphs();
    TensorTree cpu_params = (*cpu_model)->Init(1);
    auto gpu_params = (*device)->Upload(cpu_params);
    ASSERT_TRUE(gpu_params.ok());
    DeviceTree gpu_grads;
    for (int step = 0; step < 3; ++step) {
      auto grads = (*cpu_model)->LossAndGradients(cpu_params, MakeBatch(32, true, step));
      ASSERT_TRUE(grads.ok());
      if (step == 0) {
        auto uploaded = (*device)->Upload(grads->grads);
        ASSERT_TRUE(uploaded.ok());
        gpu_grads = std::move(*uploaded);
      } else {
#ifdef SUBSTRAX_CUDA  // SKIP_WITHOUT_GPU returned otherwise
        for (auto& [name, g] : gpu_grads) {
          const Tensor& host = grads->grads.at(name);
          // On the device's stream, after the previous update that read these gradients (a
          // plain cudaMemcpy runs on the legacy stream, which a non-blocking stream does not
          // wait for), and synchronized: `host` changes with the next step.
          ASSERT_EQ(cudaMemcpyAsync(g.data(), host.data(), host.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, (*device)->stream()),
                    cudaSuccess);
          ASSERT_TRUE((*device)->Synchronize().ok());
        }
#endif
      }
      ASSERT_TRUE((*cpu_opt)->Update(grads->grads, &cpu_params).ok());
      ASSERT_TRUE((*gpu_opt)->Update(gpu_grads, &*gpu_params).ok());
    }
    EXPECT_EQ((*gpu_opt)->steps(), 3);
    if (graphs) {  // step 1 warms up (eager), steps 2 and 3 replay
      EXPECT_EQ((*gpu_opt)->graph_replays(), 2) << (*gpu_opt)->graph_fallback();
    }
    auto got = (*device)->Download(*gpu_params);
    ASSERT_TRUE(got.ok()) << got.status();
    auto diff = CompareTrees(*got, cpu_params);
    ASSERT_TRUE(diff.ok());
    // The kernels avoid fused multiply-adds: equal up to the last bit in practice.
    EXPECT_LE(diff->max_normwise, 1e-6) << diff->normwise_where;
  }
}

// Every optimizer of the core table that has a CUDA kernel (the others skip, saying so).
std::vector<std::string> TableOptimizers() {
  std::vector<std::string> names;
  for (const OptimizerInfo& info : OptimizerTable()) names.push_back(info.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CudaOptimizerTest, ::testing::ValuesIn(TableOptimizers()));

// An optimizer the core table knows but the cuda backend has no kernel for is refused by name
// (in a build without CUDA, as not built), never run as another. Needs no device.
TEST(CudaOptimizerErrorsTest, OptimizerWithoutCudaKernelIsUnimplemented) {
  const OptimizerConfig config = UnimplementedOptimizerConfig();
  auto opt = CudaOptimizer::Create(config, nullptr);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kUnimplemented);
  if (CudaBuilt()) {
    EXPECT_EQ(opt.status().message(), "optimizer 'lion' is not implemented on the cuda backend");
  }
}

// A bad spec is INVALID_ARGUMENT in both builds, before any device is needed.
TEST(CudaOptimizerErrorsTest, BadSpecIsInvalidArgument) {
  auto opt = CudaOptimizer::Create(OptimizerSpec("lamb"), nullptr);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(opt.status().message().find("spec.optimizer.type"), absl::string_view::npos);
}

TEST(CudaModelErrorsTest, BadShapesAndLabels) {
  SKIP_WITHOUT_GPU();
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok());
  auto gpu = CudaModel::Create(Spec(v1::MODEL_TYPE_MLP), kFeatures, device->get());
  ASSERT_TRUE(gpu.ok());
  auto metrics = CudaMetrics::Create(**device);
  ASSERT_TRUE(metrics.ok());
  auto params = (*gpu)->Init(0);
  ASSERT_TRUE(params.ok());
  Batch batch = MakeBatch(8, true, 0);
  batch.targets.data()[3] = 10;  // not a class id
  UploadedBatch device_batch = Upload(**device, batch);
  DeviceTree grads;
  ASSERT_TRUE((*gpu)->LossAndGradients(*params, device_batch.view, &grads, metrics->get()).ok());
  absl::StatusOr<EvalResult> sums = (*metrics)->Read();
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kInvalidArgument) << sums.status();

  DeviceBatchView wrong = device_batch.view;
  wrong.num_features = kFeatures + 1;
  EXPECT_EQ((*gpu)->LossAndGradients(*params, wrong, &grads, metrics->get()).code(),
            absl::StatusCode::kInvalidArgument);
  params->erase("dense_1/bias");
  absl::Status missing = (*gpu)->LossAndGradients(*params, device_batch.view, &grads, metrics->get());
  EXPECT_EQ(missing.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("dense_1/bias"), std::string::npos) << missing;
  EXPECT_EQ(CudaDevice::Create(1 << 20).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CudaTensorParallelismTest, NeedsAnAllReduce) {
  SKIP_WITHOUT_GPU();
  auto device = CudaDevice::Create(0);
  ASSERT_TRUE(device.ok());
  CudaTensorParallelism tp;
  tp.axis_size = 2;
  EXPECT_EQ(CudaModel::Create(Spec(v1::MODEL_TYPE_MLP), kFeatures, device->get(), tp).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CudaBuildTest, FactoriesSayHowToBuild) {
  if (CudaBuilt()) GTEST_SKIP() << "built with --config=cuda";
  absl::StatusOr<std::unique_ptr<CudaDevice>> device = CudaDevice::Create(0);
  EXPECT_EQ(device.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(device.status().message().find("--config=cuda"), std::string::npos);
  GTEST_SKIP() << "built without --config=cuda";
}

}  // namespace
}  // namespace substrax
