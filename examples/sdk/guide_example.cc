// guide_example: the distributed-training guide's "Example: Data-Parallel Training" on the
// substrax SDK, line by line: each block of C++ below has the guide's Python above it.
//
// MyNNXModel is this program's own model: a 2-layer MLP (tanh hidden layer, softmax
// cross-entropy) with forward and backward written by hand. load_data_batch() generates a
// classification batch from the job's seed and the step, the same in every process, so the run
// gives the same parameters on any number of devices (the gradient of the global batch is the
// mean of the gradients of its equal shards).
//
// Flags (in a job, the spec's steps, global batch and seed win when it sets them):
//   --steps N          training steps (default 20)
//   --devices N        standalone: local CPU devices (default 1; SUBSTRAX_DEVICES overrides)
//   --global-batch N   examples per step over all devices (default 32; divides by the devices)
//   --dump FILE        device 0 of process 0 writes the final parameters to FILE, one line per
//                      tensor: "name v0 v1 ..." (%.9g)
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "substrax/substrax.h"

namespace {

using substrax::Batch;
using substrax::LossAndGrads;
using substrax::Tensor;
using substrax::TensorTree;

constexpr int kFeatures = 16;
constexpr int kHidden = 32;
constexpr int kClasses = 4;

// splitmix64 of a counter: the same numbers on every machine and standard library.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
// A value in [-1, 1) for (seed, stream, index).
double Symmetric(uint64_t seed, uint64_t stream, uint64_t index) {
  const uint64_t bits = Mix(Mix(seed ^ Mix(stream)) + index);
  return 2.0 * (static_cast<double>(bits >> 11) * 0x1.0p-53) - 1.0;
}

// --- MyNNXModel: the program's own model ---------------------------------------------------
// Parameters: dense_0/kernel [16, 32], dense_0/bias [32], dense_1/kernel [32, 4],
// dense_1/bias [4]; Glorot-uniform kernels from the seed, zero biases.
TensorTree InitModel(uint64_t seed) {
  TensorTree params;
  const std::pair<const char*, std::pair<int, int>> kernels[] = {
      {"dense_0", {kFeatures, kHidden}}, {"dense_1", {kHidden, kClasses}}};
  uint64_t stream = 100;
  for (const auto& [layer, dims] : kernels) {
    const auto [fan_in, fan_out] = dims;
    Tensor kernel({fan_in, fan_out});
    const double limit = std::sqrt(6.0 / (fan_in + fan_out));
    for (int64_t i = 0; i < kernel.size(); ++i) {
      kernel.data()[i] = static_cast<float>(limit * Symmetric(seed, stream, i));
    }
    ++stream;
    params.emplace(absl::StrCat(layer, "/kernel"), std::move(kernel));
    params.emplace(absl::StrCat(layer, "/bias"), Tensor({fan_out}));
  }
  return params;
}

// logits = tanh(x W0 + b0) W1 + b1; the mean softmax cross-entropy over the batch, its
// gradients and the accuracy. Sums in double; the gradients are rounded to float once.
absl::StatusOr<LossAndGrads> ModelLossAndGrads(const TensorTree& params, const Batch& batch) {
  const int64_t n = batch.size();
  if (n < 1 || batch.inputs.rank() != 2 || batch.inputs.dim(1) != kFeatures) {
    return absl::InvalidArgumentError(absl::StrCat("inputs must be [batch >= 1, ", kFeatures,
                                                   "], got ", batch.inputs.ShapeString()));
  }
  for (const char* name : {"dense_0/kernel", "dense_0/bias", "dense_1/kernel", "dense_1/bias"}) {
    if (params.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", name, "' is missing"));
    }
  }
  const float* w0 = params.at("dense_0/kernel").data();
  const float* b0 = params.at("dense_0/bias").data();
  const float* w1 = params.at("dense_1/kernel").data();
  const float* b1 = params.at("dense_1/bias").data();
  std::vector<double> gw0(kFeatures * kHidden, 0), gb0(kHidden, 0);
  std::vector<double> gw1(kHidden * kClasses, 0), gb1(kClasses, 0);
  double loss_sum = 0;
  int64_t correct = 0;
  for (int64_t e = 0; e < n; ++e) {
    const float* x = batch.inputs.data() + e * kFeatures;
    const int label = static_cast<int>(batch.targets.data()[e]);
    if (label < 0 || label >= kClasses) {
      return absl::InvalidArgumentError(absl::StrCat("target ", e, " is ", label,
                                                     ", not a class in [0, ", kClasses, ")"));
    }
    // Forward.
    double h[kHidden];
    for (int j = 0; j < kHidden; ++j) {
      double z = b0[j];
      for (int i = 0; i < kFeatures; ++i) z += static_cast<double>(x[i]) * w0[i * kHidden + j];
      h[j] = std::tanh(z);
    }
    double logits[kClasses];
    int predicted = 0;
    for (int k = 0; k < kClasses; ++k) {
      double z = b1[k];
      for (int j = 0; j < kHidden; ++j) z += h[j] * w1[j * kClasses + k];
      logits[k] = z;
      if (z > logits[predicted]) predicted = k;
    }
    double sum = 0;
    for (int k = 0; k < kClasses; ++k) sum += std::exp(logits[k] - logits[predicted]);
    const double log_sum = logits[predicted] + std::log(sum);
    loss_sum += log_sum - logits[label];
    if (predicted == label) ++correct;
    // Backward, for the mean over the batch.
    double d_logits[kClasses];
    for (int k = 0; k < kClasses; ++k) {
      d_logits[k] = (std::exp(logits[k] - log_sum) - (k == label ? 1.0 : 0.0)) / n;
      gb1[k] += d_logits[k];
    }
    for (int j = 0; j < kHidden; ++j) {
      double d_h = 0;
      for (int k = 0; k < kClasses; ++k) {
        gw1[j * kClasses + k] += h[j] * d_logits[k];
        d_h += w1[j * kClasses + k] * d_logits[k];
      }
      const double d_z = d_h * (1.0 - h[j] * h[j]);
      gb0[j] += d_z;
      for (int i = 0; i < kFeatures; ++i) gw0[i * kHidden + j] += x[i] * d_z;
    }
  }
  LossAndGrads result;
  result.loss = loss_sum / n;
  result.accuracy = static_cast<double>(correct) / n;
  // Tensor::Create checks that the values fill the shape (INVALID_ARGUMENT naming the tensor).
  auto add_grad = [&result](const char* name, std::vector<int64_t> shape,
                            const std::vector<double>& values) {
    absl::StatusOr<Tensor> grad = Tensor::Create(
        std::move(shape), std::vector<float>(values.begin(), values.end()), name);
    if (grad.ok()) result.grads[name] = *std::move(grad);
    return grad.status();
  };
  for (const absl::Status& added :
       {add_grad("dense_0/kernel", {kFeatures, kHidden}, gw0),
        add_grad("dense_0/bias", {kHidden}, gb0),
        add_grad("dense_1/kernel", {kHidden, kClasses}, gw1),
        add_grad("dense_1/bias", {kClasses}, gb1)}) {
    if (!added.ok()) return added;
  }
  return result;
}

// load_data_batch(): the global batch of `step`, from the seed. The class of an example is the
// largest of 4 fixed random projections of its features (a "teacher" drawn from the seed).
Batch LoadDataBatch(uint64_t seed, int64_t step, int64_t global_batch) {
  Batch batch;
  batch.inputs = Tensor({global_batch, kFeatures});
  batch.targets = Tensor({global_batch});
  for (int64_t e = 0; e < global_batch; ++e) {
    float* x = batch.inputs.data() + e * kFeatures;
    const uint64_t example = static_cast<uint64_t>(step) * global_batch + e;
    for (int i = 0; i < kFeatures; ++i) {
      x[i] = static_cast<float>(Symmetric(seed, 1, example * kFeatures + i));
    }
    int label = 0;
    double best = -1e300;
    for (int k = 0; k < kClasses; ++k) {
      double score = 0;
      for (int i = 0; i < kFeatures; ++i) score += x[i] * Symmetric(seed, 2, k * kFeatures + i);
      if (score > best) {
        best = score;
        label = k;
      }
    }
    batch.targets.data()[e] = static_cast<float>(label);
  }
  return batch;
}

absl::Status DumpParams(const TensorTree& params, const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "w");
  if (file == nullptr) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write"));
  for (const auto& [name, tensor] : params) {
    std::fprintf(file, "%s", name.c_str());
    for (float v : tensor.span()) std::fprintf(file, " %.9g", v);
    std::fprintf(file, "\n");
  }
  if (std::fclose(file) != 0) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

struct Flags {
  int64_t steps = 20;
  int devices = 1;
  int64_t global_batch = 32;
  std::string dump;
};

absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string name = argv[i];
    if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(name, ": needs a value"));
    const std::string value = argv[++i];
    bool ok = true;
    if (name == "--steps") {
      ok = absl::SimpleAtoi(value, &flags.steps) && flags.steps >= 1;
    } else if (name == "--devices") {
      ok = absl::SimpleAtoi(value, &flags.devices) && flags.devices >= 1;
    } else if (name == "--global-batch") {
      ok = absl::SimpleAtoi(value, &flags.global_batch) && flags.global_batch >= 1;
    } else if (name == "--dump") {
      flags.dump = value;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown flag '", name,
          "'; usage: guide_example [--steps N] [--devices N] [--global-batch N] [--dump FILE]"));
    }
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": '", value, "' is not >= 1"));
    }
  }
  return flags;
}

absl::Status Train(substrax::Program& program, const Flags& flags) {
  const substrax::JobSettings& settings = program.settings();
  const int64_t num_steps = settings.steps > 0 ? settings.steps : flags.steps;
  const int64_t global_batch =
      settings.global_batch_size > 0 ? settings.global_batch_size : flags.global_batch;
  const uint64_t seed = settings.seed;

  // # Create the device mesh and data-parallel sharding
  // mesh = DeviceMeshManager.create_data_parallel_mesh()
  // (The job's mesh: the coordinator built it with DeviceMeshManager::CreateDataParallelMesh
  // over the job's devices; standalone, Init builds it over the local devices.)
  const substrax::Mesh& mesh = program.mesh();
  // sharding = create_data_parallel_sharding(mesh)
  absl::StatusOr<substrax::NamedSharding> sharding = substrax::CreateDataParallelSharding(mesh);
  if (!sharding.ok()) return sharding.status();
  const int64_t data_size = *mesh.AxisSize(substrax::kDataAxis);
  if (global_batch % data_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the global batch of ", global_batch,
                                                   " does not divide over the ", data_size,
                                                   " devices of the data axis"));
  }
  if (program.process_index() == 0) {
    std::printf("%s", substrax::DeviceMeshManager::GetMeshInfo(mesh).ToString().c_str());
    std::printf("\nglobal batch %lld, %lld steps\n", static_cast<long long>(global_batch),
                static_cast<long long>(num_steps));
  }

  // # Define model and optimizer
  // model = MyNNXModel()
  const TensorTree initial_params = InitModel(seed);

  // @nnx.jit
  // def train_step(model, optimizer, batch):
  //     def loss_fn(model):
  //         logits = model(batch["inputs"])
  //         return compute_loss(logits, batch["targets"])
  //     loss, grads = nnx.value_and_grad(loss_fn)(model)
  //     optimizer.update(model, grads)
  //     return loss
  // (SpmdTrainStep is the guide's spmd_train_step: it calls the model's loss-and-gradients
  // function below, averages the gradients over the data axis and updates the parameters.)
  const substrax::LossAndGradsFn loss_and_grads = ModelLossAndGrads;

  // # Train for multiple steps under the mesh context
  // with jax.set_mesh(mesh):
  return program.RunOnDevices([&](substrax::DeviceContext& ctx) -> absl::Status {
    // The model's replicated parameters on this device.
    TensorTree params = initial_params;
    // optimizer = nnx.Optimizer(model, optax.adam(learning_rate=1e-3), wrt=nnx.Param)
    absl::StatusOr<std::unique_ptr<substrax::Optimizer>> optimizer =
        substrax::Optimizer::Create("adam", 1e-3);
    if (!optimizer.ok()) return optimizer.status();

    //     for step in range(num_steps):
    for (int64_t step = 0; step < num_steps; ++step) {
      //         batch = load_data_batch()
      const Batch batch = LoadDataBatch(seed, step, global_batch);
      //         sharded_batch = place_batch_on_shards(batch, sharding)
      absl::StatusOr<Batch> sharded_batch =
          substrax::PlaceBatchOnShards(batch, *sharding, ctx.device.id);
      if (!sharded_batch.ok()) return sharded_batch.status();
      //         loss = train_step(model, optimizer, sharded_batch)
      absl::StatusOr<substrax::StepResult> result = substrax::SpmdTrainStep(
          ctx, loss_and_grads, **optimizer, &params, *sharded_batch);
      if (!result.ok()) return result.status();

      // metrics = {"loss": loss, "accuracy": accuracy}
      // reduced_metrics = reduce_mean(metrics)
      absl::StatusOr<substrax::Metrics> reduced_metrics = substrax::ReduceMean(
          ctx, {{"loss", result->loss}, {"accuracy", result->accuracy}});
      if (!reduced_metrics.ok()) return reduced_metrics.status();
      const int64_t done = step + 1;
      if (done % settings.report_every_steps == 0 || done == num_steps) {
        absl::Status reported = program.ReportMetrics(ctx, done, *reduced_metrics);
        if (!reported.ok()) return reported;
      }
    }

    // The final parameters, for comparing runs on different numbers of devices.
    if (!flags.dump.empty() && program.process_index() == 0 &&
        ctx.device.id == mesh.devices().front().id) {
      return DumpParams(params, flags.dump);
    }
    return absl::OkStatus();
  });
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return substrax::ExitWithError(flags.status());

  substrax::InitOptions options;
  options.standalone_devices = flags->devices;
  options.standalone_settings.steps = flags->steps;
  options.standalone_settings.global_batch_size = flags->global_batch;
  options.standalone_settings.report_every_steps = 5;
  absl::StatusOr<std::unique_ptr<substrax::Program>> program = substrax::Init(options);
  if (!program.ok()) return substrax::ExitWithError(program.status());

  return (*program)->Finish(Train(**program, *flags));
}
