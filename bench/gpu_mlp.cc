// Training-step throughput of our real CUDA step on one GPU: the DeviceBackend the step loop drives
// (CreateCudaBackend: cuBLAS model, device optimizer, CudaPrefetcher, the flat gradient buffer),
// called as RunStepLoop calls it on a one-device mesh (NextBatch, ComputeGradients,
// ApplyGradients; no collective, there is no peer). bench/torch_mlp.py is its PyTorch twin: the
// same mlp (784 inputs, --hidden widths, 10 classes, ReLU), softmax cross-entropy, adam(1e-3),
// batch 128, float32 without TF32, batches taken from host memory every step as ours are.
// Verifies what it measures in the same run: the mean loss over the timed steps must be finite and
// lower than the first step's.
//
//   bazel build -c opt --config=cuda //bench:gpu_mlp
//   bazel-bin/bench/gpu_mlp --steps 2000                       # 784-512-256-10
//   bazel-bin/bench/gpu_mlp --steps 200 --hidden 8192,8192     # the wide one
//   bazel-bin/bench/gpu_mlp --graphs off                        # every launch eager
//   bazel-bin/bench/gpu_mlp --force-collectives on              # the step with its collectives
// --force-collectives on runs the step as the step loop does on a data-parallel mesh: the
// gradients reduced in buckets (MakeFlatReducer) by a 1-rank NCCL group on the communicator's
// stream, ordered by events, the handles collected every 8 steps, then the update; one GPU has
// no peer, so the size-1 data axis is reduced anyway (GradientPlan::reduce_single_replica_axes).
// It prints `collectives_per_step=`.
// Prints `samples_per_second=<n>`, `ms_per_step=`, `graph_replays=` (how many steps replayed a
// captured CUDA graph; 0 with --graphs off) and the device-time fractions per phase.
// Exit status 2, with "no CUDA device" or the build's UNIMPLEMENTED, when there is no GPU to
// measure; 1 when the step fails or the verification does.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/job_spec.h"
#include "core/status.h"
#include "substrax/v1/job.pb.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/mesh.h"
#include "worker/collectives/mesh_communicators.h"
#include "worker/collectives/nccl_communicator.h"
#include "worker/collectives/store.h"
#include "worker/gpu/cuda_device.h"
#include "worker/runtime/cuda_backend.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/gradient_buckets.h"
#include "worker/runtime/gradient_reducer.h"
#include "worker/tensor/tensor.h"

namespace substrax {
namespace {

constexpr int64_t kFeatures = 784, kBatch = 128, kDistinctBatches = 16, kWarmup = 50;

Batch MakeBatch(uint32_t seed) {
  uint32_t s = seed * 2654435761u + 12345;
  auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(s >> 8) / static_cast<float>(1 << 24);
  };
  std::vector<float> x(kBatch * kFeatures), t(kBatch);
  for (float& v : x) v = next();
  // Learnable labels: the class is the first feature's tenth (as in torch_mlp.py).
  for (int64_t i = 0; i < kBatch; ++i) t[i] = std::floor(x[i * kFeatures] * 10);
  Batch b;
  b.inputs = Tensor({kBatch, kFeatures}, x);
  b.targets = Tensor({kBatch}, t);
  return b;
}

// The job the backend is built from; the data section only satisfies validation (the batches
// come from the producer below).
absl::StatusOr<v1::JobSpec> BenchSpec(const std::vector<int64_t>& hidden) {
  const std::string yaml = absl::StrCat(R"(
apiVersion: substrax/v1
kind: TrainJob
metadata: {name: gpu-mlp-bench}
spec:
  model: {type: mlp, hidden_sizes: [)", absl::StrJoin(hidden, ", "), R"(], num_classes: 10}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 2048, num_features: 784}
    prefetch_size: 2
  optimizer: {type: adam, learning_rate: 0.001}
  mesh: {data_parallel_size: 1}
  batch: {global_batch_size: 128}
  steps: 1
  seed: 0
  backend: cuda
)");
  return ParseJobSpecYaml(yaml, "gpu_mlp.yaml");
}

// One step as RunStepLoop drives it on a one-device mesh.
absl::Status Step(DeviceBackend& backend) {
  backend.MarkPhase(Phase::kData);
  SUBSTRAX_ASSIGN_OR_RETURN(bool more, backend.NextBatch());
  if (!more) return absl::OutOfRangeError("the producer ran out of batches");
  backend.MarkPhase(Phase::kCompute);
  SUBSTRAX_RETURN_IF_ERROR(backend.ComputeGradients());
  return backend.ApplyGradients();
}

// The collectives of --force-collectives: a 1x1 mesh (data, model) of this GPU, its communicators
// on NCCL, and the flat reducer the step loop would use over the data axis.
struct ForcedCollectives {
  std::optional<Mesh> mesh;
  InMemoryStore store;
  std::unique_ptr<NcclGroupConnector> connector;
  std::unique_ptr<MeshCommunicators> comms;
  std::unique_ptr<GradientReducer> reducer;
  std::vector<CollectiveEvent> in_flight;

  // Awaits the handles once more than `keep` are outstanding (all with keep 0).
  absl::Status Collect(size_t keep) {
    if (in_flight.size() <= keep) return absl::OkStatus();
    for (CollectiveEvent& e : in_flight) SUBSTRAX_RETURN_IF_ERROR(e.Await());
    in_flight.clear();
    return absl::OkStatus();
  }
};

absl::StatusOr<std::unique_ptr<ForcedCollectives>> ForceCollectives(DeviceBackend& backend,
                                                                    float* grads,
                                                                    const FlatLayout& layout) {
  auto forced = std::make_unique<ForcedCollectives>();
  std::vector<Device> devices = MakeUniformCluster(1, 1);
  devices[0].kind = DeviceKind::kCuda;
  SUBSTRAX_ASSIGN_OR_RETURN(Mesh mesh, DeviceMeshManager::CreateHybridMesh(devices, 1, 1));
  forced->mesh.emplace(std::move(mesh));
  forced->connector =
      std::make_unique<NcclGroupConnector>(NcclCommunicatorOptions(), &forced->store);
  SUBSTRAX_ASSIGN_OR_RETURN(forced->comms,
                            MeshCommunicators::Create(*forced->mesh, forced->mesh->devices()[0].id,
                                                      *forced->connector));
  GradientPlan plan = PlanOverAxis(kDataAxis, layout);
  plan.reduce_single_replica_axes = true;
  forced->reducer = MakeFlatReducer(*forced->comms, std::move(plan), grads, int64_t{1} << 20,
                                    backend.execution_context());
  return forced;
}

// One step as RunStepLoop drives it on a data-parallel mesh: the gradients reduced before the
// update, the reductions' handles kept in flight.
absl::Status StepWithCollectives(DeviceBackend& backend, ForcedCollectives& forced, int64_t step) {
  backend.MarkPhase(Phase::kData);
  SUBSTRAX_ASSIGN_OR_RETURN(bool more, backend.NextBatch());
  if (!more) return absl::OutOfRangeError("the producer ran out of batches");
  backend.MarkPhase(Phase::kCompute);
  forced.reducer->BeginStep();
  SUBSTRAX_RETURN_IF_ERROR(backend.ComputeGradients());
  SUBSTRAX_RETURN_IF_ERROR(forced.reducer->Reduce(&forced.in_flight));
  SUBSTRAX_RETURN_IF_ERROR(forced.reducer->Apply(backend, step));
  return forced.Collect(static_cast<size_t>(backend.max_steps_in_flight()));
}

absl::Status Run(int steps, const std::vector<int64_t>& hidden, bool graphs,
                 bool force_collectives) {
  SUBSTRAX_ASSIGN_OR_RETURN(const v1::JobSpec spec, BenchSpec(hidden));
  std::vector<Batch> host;
  for (int i = 0; i < kDistinctBatches; ++i) host.push_back(MakeBatch(i));
  int produced = 0;
  const int total = 1 + kWarmup + steps;
  BackendSetup setup;
  setup.spec = &spec;
  setup.num_features = kFeatures;
  setup.local_index = 0;
  setup.cuda_graphs = graphs;
  setup.batches = [&]() -> absl::StatusOr<std::optional<Batch>> {
    if (produced == total) return std::optional<Batch>();
    return std::optional<Batch>(host[produced++ % kDistinctBatches]);
  };
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBackend> backend,
                            CreateCudaBackend(std::move(setup)));
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  int64_t num_params = 0;
  for (const ParamSpec& p : backend->params()) {
    shapes.emplace_back(p.name, backend->LocalShape(p));
    int64_t n = 1;
    for (int64_t d : shapes.back().second) n *= d;
    num_params += n;
  }
  const FlatLayout layout = MakeFlatLayout(shapes);
  SUBSTRAX_ASSIGN_OR_RETURN(float* grads, backend->BindGradients(layout));
  std::unique_ptr<ForcedCollectives> forced;
  if (force_collectives) {
    SUBSTRAX_ASSIGN_OR_RETURN(forced, ForceCollectives(*backend, grads, layout));
  }
  int64_t step_number = 0;
  auto one_step = [&]() -> absl::Status {
    ++step_number;
    return forced != nullptr ? StepWithCollectives(*backend, *forced, step_number)
                             : Step(*backend);
  };

  // The first loss, then warm-up (cuBLAS heuristics, allocations, prefetch slots).
  SUBSTRAX_RETURN_IF_ERROR(one_step());
  SUBSTRAX_ASSIGN_OR_RETURN(EvalResult first, backend->TakeMetrics());
  for (int i = 0; i < kWarmup; ++i) SUBSTRAX_RETURN_IF_ERROR(one_step());
  SUBSTRAX_RETURN_IF_ERROR(backend->TakeMetrics().status());  // waits for the device
  SUBSTRAX_RETURN_IF_ERROR(backend->TakePhaseSeconds().status());

  const absl::Time start = absl::Now();
  for (int i = 0; i < steps; ++i) SUBSTRAX_RETURN_IF_ERROR(one_step());
  if (forced != nullptr) SUBSTRAX_RETURN_IF_ERROR(forced->Collect(0));
  SUBSTRAX_ASSIGN_OR_RETURN(EvalResult last, backend->TakeMetrics());  // waits for the device
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  SUBSTRAX_ASSIGN_OR_RETURN(PhaseSeconds phases, backend->TakePhaseSeconds());

  const double first_loss = first.loss_sum / first.count;
  const double last_loss = last.loss_sum / last.count;
  std::printf("model=mlp 784-%s-10 params=%lld steps=%d batch=%lld\n",
              absl::StrJoin(hidden, "-").c_str(), static_cast<long long>(num_params), steps,
              static_cast<long long>(kBatch));
  std::printf("first_loss=%.4f mean_loss_timed=%.4f\n", first_loss, last_loss);
  if (!std::isfinite(last_loss) || !(last_loss < first_loss) || last.count != steps * kBatch) {
    return absl::InternalError(absl::StrCat(
        "verification failed: the loss did not decrease, or not every example was counted (",
        last.count, " of ", steps * kBatch, ")"));
  }
  const double phase_total = phases[0] + phases[1] + phases[2];
  std::printf("samples_per_second=%.0f\n", steps * kBatch / seconds);
  std::printf("ms_per_step=%.4f\n", 1e3 * seconds / steps);
  std::printf("graph_replays=%lld\n", static_cast<long long>(backend->graph_replays()));
  if (forced != nullptr) {
    std::printf("collectives_per_step=%.2f\n",
                static_cast<double>(forced->reducer->collectives()) / step_number);
    if (forced->reducer->collectives() < step_number) {
      return absl::InternalError("--force-collectives: the steps issued no gradient collectives");
    }
  }
  if (graphs && backend->graph_replays() < steps) {
    return absl::InternalError(absl::StrCat("CUDA graphs are on but only ",
                                            backend->graph_replays(), " replays in ",
                                            1 + kWarmup + steps, " steps"));
  }
  if (phase_total > 0) {
    std::printf("device_fraction_data=%.3f device_fraction_compute=%.3f\n",
                phases[0] / phase_total, phases[1] / phase_total);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  int steps = 1000;
  std::vector<int64_t> hidden = {512, 256};
  bool graphs = true;
  bool force_collectives = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) {
      steps = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--hidden") == 0) {
      hidden.clear();
      for (absl::string_view w : absl::StrSplit(argv[i + 1], ',')) {
        int64_t v = 0;
        if (!absl::SimpleAtoi(w, &v)) {
          std::fprintf(stderr, "gpu_mlp: --hidden takes widths like 512,256\n");
          return 1;
        }
        hidden.push_back(v);
      }
    } else if (std::strcmp(argv[i], "--graphs") == 0 &&
               (std::strcmp(argv[i + 1], "on") == 0 || std::strcmp(argv[i + 1], "off") == 0)) {
      graphs = std::strcmp(argv[i + 1], "on") == 0;
    } else if (std::strcmp(argv[i], "--force-collectives") == 0 &&
               (std::strcmp(argv[i + 1], "on") == 0 || std::strcmp(argv[i + 1], "off") == 0)) {
      force_collectives = std::strcmp(argv[i + 1], "on") == 0;
    } else {
      std::fprintf(stderr,
                   "gpu_mlp: unknown flag %s (--steps N, --hidden W1,W2,..., --graphs on|off, "
                   "--force-collectives on|off)\n",
                   argv[i]);
      return 1;
    }
  }
  if (!substrax::CudaBuilt()) {
    std::fprintf(stderr, "gpu_mlp: %s\n", substrax::CudaNotBuilt().ToString().c_str());
    return 2;
  }
  if (absl::StatusOr<int> n = substrax::CudaDeviceCount(); !n.ok() || *n == 0) {
    std::fprintf(stderr, "gpu_mlp: no CUDA device: %s\n",
                 n.ok() ? "none found" : n.status().ToString().c_str());
    return 2;
  }
  absl::Status status = substrax::Run(steps, hidden, graphs, force_collectives);
  if (!status.ok()) {
    std::fprintf(stderr, "gpu_mlp: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
