// Training-step throughput of the CUDA backend (CudaModel + CudaOptimizer) on one GPU, for the
// model, batch and optimizer bench/torch_mlp.py runs in PyTorch: an mlp 784-512-256-10, softmax
// cross-entropy, adam(1e-3), batch 128, float32 (no TF32). Three loops over the same synthetic
// batches: batches already on the device (pure compute), a synchronous upload before every step
// (no prefetch), and CudaPrefetcher (size 2). Verifies what it measures in the same run: the mean
// loss read back at the end must be finite and lower than the first step's.
//
//   bazel build -c opt --config=cuda //bench:gpu_mlp && bazel-bin/bench/gpu_mlp --steps 1000
// Prints `samples_per_second=<n>` (device-resident loop) and `ms_per_step_*` lines.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "substrax/v1/job.pb.h"
#include "worker/compute/cuda_model.h"
#include "worker/data/cuda_prefetch.h"
#include "worker/gpu/cuda_device.h"

namespace substrax {
namespace {

constexpr int64_t kFeatures = 784, kBatch = 128, kDistinctBatches = 16;

Batch MakeBatch(uint32_t seed) {
  uint32_t s = seed * 2654435761u + 12345;
  auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / static_cast<float>(1 << 24);
  };
  std::vector<float> x(kBatch * kFeatures), t(kBatch);
  for (float& v : x) v = next();
  // Learnable labels: the class is the first feature's tenth.
  for (int64_t i = 0; i < kBatch; ++i) t[i] = std::floor(x[i * kFeatures] * 10);
  Batch b;
  b.inputs = Tensor({kBatch, kFeatures}, x);
  b.targets = Tensor({kBatch}, t);
  return b;
}

absl::Status Run(int steps) {
  SUBSTRAX_ASSIGN_OR_RETURN(auto device, CudaDevice::Create(0));
  v1::ModelSpec spec;
  spec.set_type(v1::MODEL_TYPE_MLP);
  spec.add_hidden_sizes(512);
  spec.add_hidden_sizes(256);
  spec.set_num_classes(10);
  v1::OptimizerSpec opt_spec;
  opt_spec.set_type("adam");
  opt_spec.set_learning_rate(1e-3);
  SUBSTRAX_ASSIGN_OR_RETURN(auto model, CudaModel::Create(spec, kFeatures, device.get()));
  SUBSTRAX_ASSIGN_OR_RETURN(auto optimizer, CudaOptimizer::Create(opt_spec, device.get()));
  SUBSTRAX_ASSIGN_OR_RETURN(auto metrics, CudaMetrics::Create(*device));
  SUBSTRAX_ASSIGN_OR_RETURN(DeviceTree params, model->Init(0));
  std::vector<Batch> host;
  std::vector<DeviceTensor> inputs, targets;
  for (int i = 0; i < kDistinctBatches; ++i) {
    host.push_back(MakeBatch(i));
    SUBSTRAX_ASSIGN_OR_RETURN(DeviceTensor x, device->Upload(host.back().inputs));
    SUBSTRAX_ASSIGN_OR_RETURN(DeviceTensor t, device->Upload(host.back().targets));
    inputs.push_back(std::move(x));
    targets.push_back(std::move(t));
  }
  DeviceTree grads;
  auto step = [&](const DeviceBatchView& view) -> absl::Status {
    SUBSTRAX_RETURN_IF_ERROR(model->LossAndGradients(params, view, &grads, metrics.get()));
    return optimizer->Update(grads, &params);
  };
  auto resident = [&](int i) {
    const int k = i % kDistinctBatches;
    return DeviceBatchView{inputs[k].data(), targets[k].data(), kBatch, kFeatures, 1};
  };
  // First loss, then warm-up (cuBLAS heuristics, allocations).
  SUBSTRAX_RETURN_IF_ERROR(step(resident(0)));
  SUBSTRAX_ASSIGN_OR_RETURN(EvalResult first, metrics->Read());
  for (int i = 1; i < 50; ++i) SUBSTRAX_RETURN_IF_ERROR(step(resident(i)));
  SUBSTRAX_RETURN_IF_ERROR(metrics->Reset());

  // 1. Device-resident batches.
  absl::Time start = absl::Now();
  for (int i = 0; i < steps; ++i) SUBSTRAX_RETURN_IF_ERROR(step(resident(i)));
  SUBSTRAX_ASSIGN_OR_RETURN(EvalResult last, metrics->Read());  // synchronises
  const double resident_s = absl::ToDoubleSeconds(absl::Now() - start);

  // 2. No prefetch: upload each batch from pageable host memory, then step.
  start = absl::Now();
  for (int i = 0; i < steps; ++i) {
    const Batch& b = host[i % kDistinctBatches];
    SUBSTRAX_ASSIGN_OR_RETURN(DeviceTensor x, device->Upload(b.inputs));
    SUBSTRAX_ASSIGN_OR_RETURN(DeviceTensor t, device->Upload(b.targets));
    SUBSTRAX_RETURN_IF_ERROR(step({x.data(), t.data(), kBatch, kFeatures, 1}));
    SUBSTRAX_RETURN_IF_ERROR(device->Synchronize());  // x and t are freed at the end of the step
  }
  const double no_prefetch_s = absl::ToDoubleSeconds(absl::Now() - start);

  // 3. CudaPrefetcher, size 2.
  int produced = 0;
  Producer<Batch> producer = [&]() -> absl::StatusOr<std::optional<Batch>> {
    if (produced == steps) return std::optional<Batch>();
    return std::optional<Batch>(host[produced++ % kDistinctBatches]);
  };
  start = absl::Now();
  {
    SUBSTRAX_ASSIGN_OR_RETURN(auto batches, CudaPrefetcher::Create(device.get(), producer, 2));
    while (true) {
      SUBSTRAX_ASSIGN_OR_RETURN(std::optional<DeviceBatchView> b, batches->Next());
      if (!b) break;
      SUBSTRAX_RETURN_IF_ERROR(step(*b));
    }
    SUBSTRAX_RETURN_IF_ERROR(device->Synchronize());
  }
  const double prefetch_s = absl::ToDoubleSeconds(absl::Now() - start);

  const double first_loss = first.loss_sum / first.count;
  const double last_loss = last.loss_sum / last.count;
  std::printf("device=%s steps=%d batch=%lld\n", device->name().c_str(), steps,
              static_cast<long long>(kBatch));
  std::printf("first_loss=%.4f mean_loss_timed=%.4f\n", first_loss, last_loss);
  if (!std::isfinite(last_loss) || !(last_loss < first_loss)) {
    return absl::InternalError("verification failed: the loss did not decrease");
  }
  std::printf("samples_per_second=%.0f\n", steps * kBatch / resident_s);
  std::printf("ms_per_step_resident=%.4f\n", 1e3 * resident_s / steps);
  std::printf("ms_per_step_no_prefetch=%.4f\n", 1e3 * no_prefetch_s / steps);
  std::printf("ms_per_step_prefetch=%.4f\n", 1e3 * prefetch_s / steps);
  return absl::OkStatus();
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  int steps = 1000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
  }
  absl::Status status = substrax::Run(steps);
  if (!status.ok()) {
    std::fprintf(stderr, "gpu_mlp: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
