// The same synthetic job trained on one CPU device and on one CUDA device from the same seed, through
// the one entry point every runner uses (Train, worker/runtime/trainer.h): the losses reported
// every few steps, the evaluation and the final parameters must agree within the tolerances below.
// Part of the GPU check (tests/gpu/run.sh); needs a --config=cuda build and a GPU.
//
//   bazel build -c opt --config=cuda //tests/gpu:cpu_gpu_equivalence
//   bazel-bin/tests/gpu/cpu_gpu_equivalence [--force-collectives] [--precision fp32|tf32|bf16]
//
// --precision: the GPU run's spec.precision (the CPU run is fp32 always), with the tolerances
// of that precision (TolerancesFor).
// --force-collectives: both runs reduce their gradients over the 1-device data axis anyway (a
// 1-rank Gloo group on the CPU, a 1-rank NCCL group on the GPU, as the step loop's flat reducer
// does on a data-parallel mesh): the GPU run then takes the whole fast step, collectives
// included, and must still agree.
//
// Exit status: 0 when they agree; 1 when they do not (or training failed); 2 when there is nothing
// to compare on this machine: no CUDA device ("no CUDA device: ..."), or a build without
// --config=cuda (the CUDA run fails with UNIMPLEMENTED, printed as such).
//
// Why these tolerances: both sides compute in float32 (cuBLAS without TF32, Eigen on the CPU) from
// parameters initialised bit for bit alike, so they differ only in summation order (about 1e-7
// relative per operation). Adam divides by the gradient's running magnitude, so where a gradient
// element nearly cancels over the batch its rounding shows in the update at up to the learning
// rate; over 40 steps that stays far under 1e-3 of a tensor's largest value. A wrong kernel, a
// missed batch or a mis-ordered update gives differences of order 1. The first GPU run prints the
// measured differences: tighten these from them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "worker/collectives/store.h"
#include "worker/gpu/cuda_device.h"
#include "worker/runtime/trainer.h"
#include "worker/tensor/tensor.h"

namespace substrax {
namespace {

// Normwise relative difference of each parameter tensor (max|cpu - gpu| / max|cpu|), and the
// relative difference of every reported loss and of the evaluation's loss, per GPU precision
// against the CPU's fp32 (--precision). tf32 and bf16 round every product's operands to 10 and
// 7 bits of mantissa: their bounds are cuda_model_test's single-pass bounds (1e-2, 5e-2) widened
// for 40 steps of Adam; the first GPU run prints the measured differences: tighten from them.
struct Tolerances {
  double param;
  double loss;
};
Tolerances TolerancesFor(v1::Precision precision) {
  switch (precision) {
    case v1::PRECISION_TF32:
      return {5e-2, 2e-2};
    case v1::PRECISION_BF16:
      return {1.5e-1, 5e-2};
    default:
      return {1e-3, 1e-4};
  }
}
// The tolerances in force (TolerancesFor the precision asked for).
double g_param_tolerance = 1e-3;
double g_loss_tolerance = 1e-4;

constexpr char kSpec[] = R"(
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: cpu-gpu-equivalence}
spec:
  model: {type: mlp, hidden_sizes: [256, 128], num_classes: 10}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 8192, num_test_examples: 1024,
                num_features: 64, noise: 0.5}
  optimizer: {type: adam, learning_rate: 0.001}
  mesh: {data_parallel_size: 1}
  batch: {global_batch_size: 128}
  steps: 40
  seed: 7
  report_every_steps: 5
)";

struct Run {
  TrainResult result;
  std::vector<double> losses;  // the "loss" of every progress report
};

absl::StatusOr<Run> TrainOn(const v1::JobSpec& spec, DeviceKind kind, bool force_collectives) {
  std::vector<Device> devices = MakeUniformCluster(1, 1, kind);
  absl::StatusOr<Mesh> mesh = CreateMeshForJob(spec.mesh(), devices);
  if (!mesh.ok()) return mesh.status();
  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = spec;
  options.process_of_position.assign(mesh->size(), 0);
  options.store = &store;
  options.force_single_replica_collectives = force_collectives;
  Run run;
  options.on_progress = [&run](const ProgressReport& r) {
    auto it = r.metrics.find("loss");
    run.losses.push_back(it == r.metrics.end() ? std::nan("") : it->second);
  };
  absl::StatusOr<TrainResult> result = Train(options);
  if (!result.ok()) return result.status();
  run.result = *std::move(result);
  return run;
}

double Relative(double a, double b) { return std::fabs(a - b) / std::max(std::fabs(b), 1e-12); }

int Main(bool force_collectives, v1::Precision precision) {
  if (force_collectives) std::printf("forcing the gradient collectives over the 1-device axis\n");
  const Tolerances tolerances = TolerancesFor(precision);
  g_param_tolerance = tolerances.param;
  g_loss_tolerance = tolerances.loss;
  std::printf("gpu precision %s\n", v1::Precision_Name(precision).c_str());
  // A build without CUDA still trains on the CPU, then reports the GPU run's UNIMPLEMENTED.
  if (CudaBuilt()) {
    absl::StatusOr<int> n = CudaDeviceCount();
    if (!n.ok() || *n == 0) {
      std::printf("SKIPPED: no CUDA device: %s\n",
                  n.ok() ? "CudaDeviceCount returned 0" : n.status().ToString().c_str());
      return 2;
    }
  }
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(kSpec, "cpu_gpu_equivalence.yaml");
  if (!spec.ok()) {
    std::printf("FAIL: the spec: %s\n", spec.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<Run> cpu = TrainOn(*spec, DeviceKind::kCpu, force_collectives);
  if (!cpu.ok()) {
    std::printf("FAIL: training on the CPU: %s\n", cpu.status().ToString().c_str());
    return 1;
  }
  std::printf("cpu: %lld steps, last reported loss %.7f\n",
              static_cast<long long>(cpu->result.steps),
              cpu->losses.empty() ? std::nan("") : cpu->losses.back());
  v1::JobSpec gpu_spec = *spec;
  gpu_spec.set_precision(precision);
  absl::StatusOr<Run> gpu = TrainOn(gpu_spec, DeviceKind::kCuda, force_collectives);
  if (!gpu.ok()) {
    if (absl::IsUnimplemented(gpu.status())) {
      std::printf("SKIPPED: training on the GPU is UNIMPLEMENTED in this build: %s\n",
                  gpu.status().ToString().c_str());
      return 2;
    }
    std::printf("FAIL: training on the GPU: %s\n", gpu.status().ToString().c_str());
    return 1;
  }
  bool ok = true;
  std::printf("steps cpu=%lld gpu=%lld\n", static_cast<long long>(cpu->result.steps),
              static_cast<long long>(gpu->result.steps));
  if (cpu->losses.size() != gpu->losses.size() || cpu->losses.empty()) {
    std::printf("FAIL: %zu loss reports on the CPU, %zu on the GPU\n", cpu->losses.size(),
                gpu->losses.size());
    ok = false;
  }
  double worst_loss = 0;
  for (size_t i = 0; i < std::min(cpu->losses.size(), gpu->losses.size()); ++i) {
    const double d = Relative(gpu->losses[i], cpu->losses[i]);
    std::printf("report %zu loss cpu=%.7f gpu=%.7f rel=%.2e\n", i, cpu->losses[i],
                gpu->losses[i], d);
    if (!(d <= g_loss_tolerance)) ok = false;  // NaN fails too
    worst_loss = std::max(worst_loss, std::isnan(d) ? INFINITY : d);
  }
  for (const auto& [name, value] : cpu->result.evaluation) {
    auto it = gpu->result.evaluation.find(name);
    if (it == gpu->result.evaluation.end()) {
      std::printf("FAIL: the GPU run has no %s\n", name.c_str());
      ok = false;
      continue;
    }
    // Accuracy counts examples: an example on the decision boundary may flip, moving it by
    // 1/1024 (absolute); losses compare relatively.
    const bool accuracy = name.find("accuracy") != std::string::npos;
    const double d = accuracy ? std::fabs(it->second - value) : Relative(it->second, value);
    std::printf("%s cpu=%.7f gpu=%.7f %s=%.2e\n", name.c_str(), value, it->second,
                accuracy ? "abs" : "rel", d);
    if (!(d <= (accuracy ? 2.0 / 1024 : g_loss_tolerance))) ok = false;
  }
  absl::StatusOr<TreeDifference> diff = CompareTrees(gpu->result.params, cpu->result.params);
  if (!diff.ok()) {
    std::printf("FAIL: parameters: %s\n", diff.status().ToString().c_str());
    return 1;
  }
  std::printf("params max_normwise=%.2e (%s) max_relative=%.2e (%s)\n", diff->max_normwise,
              diff->normwise_where.c_str(), diff->max_relative, diff->where.c_str());
  if (!(diff->max_normwise <= g_param_tolerance)) ok = false;
  std::printf("worst_loss_rel=%.2e loss_tolerance=%.0e param_tolerance=%.0e\n", worst_loss,
              g_loss_tolerance, g_param_tolerance);
  std::printf(ok ? "PASS: CPU and GPU agree\n" : "FAIL: CPU and GPU differ beyond tolerance\n");
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  bool force = false;
  substrax::v1::Precision precision = substrax::v1::PRECISION_FP32;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--force-collectives") {
      force = true;
    } else if (arg == "--precision" && i + 1 < argc) {
      const std::string p = argv[++i];
      if (p == "fp32") {
        precision = substrax::v1::PRECISION_FP32;
      } else if (p == "tf32") {
        precision = substrax::v1::PRECISION_TF32;
      } else if (p == "bf16") {
        precision = substrax::v1::PRECISION_BF16;
      } else {
        std::printf("FAIL: --precision takes fp32, tf32 or bf16, not %s\n", p.c_str());
        return 1;
      }
    } else {
      std::printf("FAIL: unknown argument %s (--force-collectives, --precision P)\n", argv[i]);
      return 1;
    }
  }
  return substrax::Main(force, precision);
}
