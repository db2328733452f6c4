// fashion_mnist_cnn: a convolutional network for Fashion-MNIST (cnn.h), trained data-parallel
// with the substrax SDK. The model is this program's own; substrax places the batches, averages
// the gradients over the mesh's data axis, updates the parameters with Adam and reports metrics.
//
//   ./fashion_mnist_cnn --devices 2                 # standalone, 2 local CPU devices
//   substraxctl submit fashion_mnist_cnn.yaml       # as a program job (README.md)
//
// Flags (a job's spec wins over the flags for what it sets: batch, epochs or steps, seed):
//   --data-dir DIR         the four Fashion-MNIST IDX .gz files
//                          (default /usr/share/datasets/fashion-mnist)
//   --devices N            standalone: local CPU devices (default 1; SUBSTRAX_DEVICES overrides)
//   --epochs N             epochs when the job sets neither epochs nor steps (default 1)
//   --steps N              steps instead of epochs when the job sets neither
//   --learning-rate X      Adam's learning rate (default 0.001)
//
// Every process reads the whole dataset and draws the same parameters and the same order of
// examples from the job's seed, so the devices agree without exchanging anything but gradients
// and metrics.
//
// Checkpoints: when the job has a checkpoint section (or resume_from), the program saves its
// parameters and Adam's state every checkpoint.every_steps steps and after the last one, and a
// restarted attempt (or a job with resume_from) goes on from the newest checkpoint, on any mesh:
// the order of the examples is a function of the seed and the step. On SIGTERM (a preemption,
// a cancel: substrax::StopRequested) every device stops at the next report's step, after a
// checkpoint of it when the job has them (docs/sdk.md, "Preemption").
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cnn.h"
#include "fashion_mnist_data.h"
#include "substrax/substrax.h"

namespace {

using cnn_example::CnnConfig;
using cnn_example::ImageDataset;

constexpr int64_t kDefaultGlobalBatch = 64;
// Test examples per forward pass (the per-thread scratch of cnn.cc grows with it: ~20 MB).
constexpr int64_t kEvalChunk = 100;

struct Flags {
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int devices = 1;
  int64_t epochs = 0;
  int64_t steps = 0;
  double learning_rate = 1e-3;
};

constexpr char kUsage[] =
    "usage: fashion_mnist_cnn [--data-dir DIR] [--devices N] [--epochs N | --steps N]\n"
    "                         [--learning-rate X]\n";

// "--name value" or "--name=value".
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    std::string value;
    if (name == "--help" || name == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::InvalidArgumentError(absl::StrCat(name, ": needs a value\n", kUsage));
    }
    bool ok = true;
    if (name == "--data-dir") {
      flags.data_dir = value;
    } else if (name == "--devices") {
      ok = absl::SimpleAtoi(value, &flags.devices) && flags.devices >= 1;
    } else if (name == "--epochs") {
      ok = absl::SimpleAtoi(value, &flags.epochs) && flags.epochs >= 1;
    } else if (name == "--steps") {
      ok = absl::SimpleAtoi(value, &flags.steps) && flags.steps >= 1;
    } else if (name == "--learning-rate") {
      ok = absl::SimpleAtod(value, &flags.learning_rate) && flags.learning_rate > 0;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag '", name, "'\n", kUsage));
    }
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": '", value, "' is not a valid value (positive number)"));
    }
  }
  if (flags.epochs > 0 && flags.steps > 0) {
    return absl::InvalidArgumentError("give --epochs or --steps, not both");
  }
  return flags;
}

// The order of the training examples in every epoch: the same in every process, drawn from the
// seed (std::mt19937_64 is specified exactly by the standard; its raw output is used, not a
// std::*_distribution, whose results differ between standard libraries).
class EpochOrder {
 public:
  EpochOrder(int64_t count, uint64_t seed) : order_(count), rng_(seed) {
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
  // Shuffles for the next epoch (Fisher-Yates).
  void Shuffle() {
    for (int64_t i = static_cast<int64_t>(order_.size()) - 1; i > 0; --i) {
      std::swap(order_[i], order_[rng_() % static_cast<uint64_t>(i + 1)]);
    }
  }
  absl::Span<const int64_t> Slice(int64_t start, int64_t count) const {
    return absl::MakeConstSpan(order_).subspan(start, count);
  }

 private:
  std::vector<int64_t> order_;
  std::mt19937_64 rng_;
};

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Everything a device thread needs, shared read-only by the threads of this process.
struct Job {
  substrax::Program* program = nullptr;
  const ImageDataset* train = nullptr;
  const ImageDataset* test = nullptr;
  const substrax::NamedSharding* sharding = nullptr;
  const substrax::TensorTree* initial_params = nullptr;
  CnnConfig config;
  double learning_rate = 1e-3;
  int64_t global_batch = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  uint64_t seed = 0;
  int64_t report_every = 50;
  // Checkpoints: configured (the spec has a checkpoint section or resume_from), every how many
  // steps, and after the last step.
  bool checkpoints = false;
  int64_t checkpoint_every = 0;
  bool checkpoint_at_end = false;
};

// The test set, each device of the data axis a share, summed over the data axis.
absl::StatusOr<substrax::Metrics> Evaluate(const Job& job, substrax::DeviceContext& ctx,
                                           const substrax::TensorTree& params) {
  const int64_t count = job.test->count;
  const int64_t begin = count * ctx.data_index() / ctx.data_size();
  const int64_t end = count * (ctx.data_index() + 1) / ctx.data_size();
  std::vector<int64_t> indices(end - begin);
  std::iota(indices.begin(), indices.end(), begin);
  substrax::EvalResult sums;
  for (int64_t start = 0; start < static_cast<int64_t>(indices.size()); start += kEvalChunk) {
    const int64_t n = std::min<int64_t>(kEvalChunk, static_cast<int64_t>(indices.size()) - start);
    substrax::Batch batch =
        cnn_example::MakeBatch(*job.test, absl::MakeConstSpan(indices).subspan(start, n));
    absl::StatusOr<substrax::EvalResult> result =
        cnn_example::CnnEvaluate(job.config, params, batch);
    if (!result.ok()) return result.status();
    sums.loss_sum += result->loss_sum;
    sums.correct += result->correct;
    sums.count += result->count;
  }
  // Sums over the data axis only: devices along another axis (a model axis) hold the same share.
  return substrax::ReduceSumCollective(ctx,
                                       {{"loss_sum", sums.loss_sum},
                                        {"correct", static_cast<double>(sums.correct)},
                                        {"count", static_cast<double>(sums.count)}},
                                       substrax::kDataAxis);
}

// The step loop of one device.
absl::Status TrainOnDevice(const Job& job, substrax::DeviceContext& ctx) {
  // Parameters replicated on every device (the same values in every process, from the seed).
  substrax::TensorTree params = *job.initial_params;
  absl::StatusOr<std::unique_ptr<substrax::Optimizer>> optimizer =
      substrax::Optimizer::Create("adam", job.learning_rate);
  if (!optimizer.ok()) return optimizer.status();
  // The steps a checkpoint has done already (0: from the beginning).
  int64_t first_step = 0;
  if (job.checkpoints) {
    absl::StatusOr<int64_t> restored = job.program->RestoreCheckpoint(ctx, &params, **optimizer);
    if (!restored.ok()) return restored.status();
    first_step = std::min(*restored, job.total_steps);
  }

  // This device's batches, assembled ahead of the step on a background thread: the global batch
  // of each step in the epoch's order, then this device's shard of it. A resumed run replays the
  // shuffles of the epochs begun before its first step.
  EpochOrder order(job.train->count, job.seed);
  for (int64_t e = 0; e < (first_step + job.steps_per_epoch - 1) / job.steps_per_epoch; ++e) {
    order.Shuffle();
  }
  int64_t next_step = first_step;
  substrax::Producer<substrax::Batch> producer =
      [&]() -> absl::StatusOr<std::optional<substrax::Batch>> {
    if (next_step == job.total_steps) return std::optional<substrax::Batch>();
    const int64_t in_epoch = next_step % job.steps_per_epoch;
    if (in_epoch == 0) order.Shuffle();
    ++next_step;
    substrax::Batch global = cnn_example::MakeBatch(
        *job.train, order.Slice(in_epoch * job.global_batch, job.global_batch));
    absl::StatusOr<substrax::Batch> local =
        substrax::PlaceBatchOnShards(global, *job.sharding, ctx.device.id);
    if (!local.ok()) return local.status();
    return std::optional<substrax::Batch>(*std::move(local));
  };
  absl::StatusOr<std::unique_ptr<substrax::Prefetcher<substrax::Batch>>> batches =
      substrax::PrefetchToDevice(std::move(producer), /*size=*/2);
  if (!batches.ok()) return batches.status();

  const substrax::LossAndGradsFn loss_and_grads =
      [&job](const substrax::TensorTree& p, const substrax::Batch& batch) {
        return cnn_example::CnnLossAndGrads(job.config, p, batch);
      };

  // Sums since the last report.
  double loss_sum = 0, accuracy_sum = 0;
  int64_t steps = 0, samples = 0;
  substrax::ReportTiming timing;
  auto window_start = std::chrono::steady_clock::now();
  for (int64_t step = first_step + 1; step <= job.total_steps; ++step) {
    const auto wait_start = std::chrono::steady_clock::now();
    absl::StatusOr<std::optional<substrax::Batch>> batch = (*batches)->Next();
    if (!batch.ok()) return batch.status();
    if (!batch->has_value()) {
      return absl::InternalError(absl::StrCat("the batches ended before step ", step));
    }
    timing.data_wait_seconds += SecondsSince(wait_start);

    absl::StatusOr<substrax::StepResult> result =
        substrax::SpmdTrainStep(ctx, loss_and_grads, **optimizer, &params, **batch);
    if (!result.ok()) return result.status();
    loss_sum += result->loss;
    accuracy_sum += result->accuracy;
    timing.compute_seconds += result->compute_seconds;
    timing.collective_seconds += result->collective_seconds;
    ++steps;
    samples += (*batch)->size();

    if (step % job.report_every == 0 || step == job.total_steps) {
      timing.samples_per_second = static_cast<double>(samples) / SecondsSince(window_start);
      const substrax::Metrics metrics = {{"loss", loss_sum / static_cast<double>(steps)},
                                         {"accuracy", accuracy_sum / static_cast<double>(steps)}};
      if (absl::Status s = job.program->ReportMetrics(ctx, step, metrics, timing); !s.ok()) {
        return s;
      }
      loss_sum = accuracy_sum = 0;
      steps = samples = 0;
      timing = {};
      window_start = std::chrono::steady_clock::now();
    }
    // SIGTERM (a preemption, a cancel): every device agrees at a report, saves and stops.
    bool stop = false;
    if (step % job.report_every == 0 && step < job.total_steps) {
      absl::StatusOr<substrax::Metrics> asked = substrax::ReduceCustom(
          ctx, {{"stop", substrax::StopRequested() ? 1.0 : 0.0}}, {{"stop", "max"}});
      if (!asked.ok()) return asked.status();
      stop = asked->at("stop") > 0;
    }
    const bool save = (job.checkpoint_every > 0 && step % job.checkpoint_every == 0) ||
                      (job.checkpoint_at_end && step == job.total_steps) || stop;
    if (job.checkpoints && save) {
      if (absl::Status s = job.program->SaveCheckpoint(ctx, step, params, **optimizer); !s.ok()) {
        return s;
      }
    }
    if (stop) {
      return absl::AbortedError(absl::StrCat(
          "stopped after step ", step, " by SIGTERM (preempted); ",
          job.checkpoints ? absl::StrCat("checkpoint of step ", step, " written")
                          : std::string("no checkpoint: the spec has none")));
    }
  }

  absl::StatusOr<substrax::Metrics> sums = Evaluate(job, ctx, params);
  if (!sums.ok()) return sums.status();
  const double count = sums->at("count");
  const double test_accuracy = sums->at("correct") / count;
  const double test_loss = sums->at("loss_sum") / count;
  if (ctx.device.id == ctx.mesh->devices().front().id) {
    job.program->SetFinalMetrics({{"test_accuracy", test_accuracy}, {"test_loss", test_loss}});
    std::printf("test_accuracy=%.4f test_loss=%.4f (%.0f test examples)\n", test_accuracy,
                test_loss, count);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

// Everything after Init: the data, the plan of the run, and the training on every local device.
absl::Status Run(substrax::Program& program, const Flags& flags) {
  const substrax::JobSettings& settings = program.settings();
  Job job;
  job.program = &program;
  job.learning_rate = flags.learning_rate;
  job.seed = settings.seed;
  job.report_every = settings.report_every_steps > 0 ? settings.report_every_steps : 50;
  job.global_batch =
      settings.global_batch_size > 0 ? settings.global_batch_size : kDefaultGlobalBatch;

  const substrax::Mesh& mesh = program.mesh();
  if (!mesh.HasAxis(substrax::kDataAxis)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fashion_mnist_cnn trains data-parallel and needs a mesh with a 'data' axis, got ",
        mesh.ShapeString()));
  }
  absl::StatusOr<substrax::NamedSharding> sharding = substrax::CreateDataParallelSharding(mesh);
  if (!sharding.ok()) return sharding.status();
  const int64_t data_size = *mesh.AxisSize(substrax::kDataAxis);
  if (job.global_batch % data_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("the global batch of ", job.global_batch,
                                                   " does not divide over the ", data_size,
                                                   " devices of the data axis"));
  }

  const std::string dir = flags.data_dir + "/";
  absl::StatusOr<ImageDataset> train = cnn_example::LoadIdxDataset(
      dir + "train-images-idx3-ubyte.gz", dir + "train-labels-idx1-ubyte.gz");
  if (!train.ok()) return train.status();
  absl::StatusOr<ImageDataset> test = cnn_example::LoadIdxDataset(
      dir + "t10k-images-idx3-ubyte.gz", dir + "t10k-labels-idx1-ubyte.gz");
  if (!test.ok()) return test.status();
  job.train = &*train;
  job.test = &*test;
  job.sharding = &*sharding;

  // Steps of full batches per epoch (the last partial batch of an epoch is dropped).
  job.steps_per_epoch = train->count / job.global_batch;
  if (job.steps_per_epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("the global batch of ", job.global_batch,
                                                   " is larger than the ", train->count,
                                                   " training examples"));
  }
  // The job's length: the spec's steps or epochs; the flags when it sets neither.
  if (settings.steps > 0) {
    job.total_steps = settings.steps;
  } else if (settings.epochs > 0) {
    job.total_steps = settings.epochs * job.steps_per_epoch;
  } else if (flags.steps > 0) {
    job.total_steps = flags.steps;
  } else {
    job.total_steps = (flags.epochs > 0 ? flags.epochs : 1) * job.steps_per_epoch;
  }
  program.SetTotalSteps(job.total_steps);

  absl::StatusOr<substrax::TensorTree> params = cnn_example::InitCnnParams(job.config, job.seed);
  if (!params.ok()) return params.status();
  job.initial_params = &*params;

  // Checkpoints when the job asks for them: every parameter is replicated (data-parallel).
  if (!settings.checkpoint_directory.empty() || !settings.resume_from.empty()) {
    substrax::CheckpointOptions checkpoints;
    for (const auto& [name, tensor] : *params) checkpoints.shapes[name] = tensor.shape();
    if (absl::Status s = program.ConfigureCheckpoints(checkpoints); !s.ok()) return s;
    job.checkpoints = true;
    job.checkpoint_every = settings.checkpoint_every_steps;
    job.checkpoint_at_end = !settings.checkpoint_directory.empty() && settings.checkpoint_at_end;
  }

  if (program.process_index() == 0) {
    std::printf("fashion_mnist_cnn: mesh %s, %d process(es), global batch %lld, %lld steps "
                "(%lld per epoch), adam lr %g\n",
                mesh.ShapeString().c_str(), program.num_processes(),
                static_cast<long long>(job.global_batch), static_cast<long long>(job.total_steps),
                static_cast<long long>(job.steps_per_epoch), job.learning_rate);
    std::fflush(stdout);
  }
  return program.RunOnDevices(
      [&job](substrax::DeviceContext& ctx) { return TrainOnDevice(job, ctx); });
}

}  // namespace

int main(int argc, char** argv) {
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) return substrax::ExitWithError(flags.status());

  substrax::InitOptions options;
  options.standalone_devices = flags->devices;
  options.standalone_settings.global_batch_size = kDefaultGlobalBatch;
  options.standalone_settings.steps = flags->steps;
  options.standalone_settings.epochs = flags->steps > 0 ? 0 : std::max<int64_t>(flags->epochs, 1);
  absl::StatusOr<std::unique_ptr<substrax::Program>> program = substrax::Init(options);
  if (!program.ok()) return substrax::ExitWithError(program.status());

  return (*program)->Finish(Run(**program, *flags));
}
