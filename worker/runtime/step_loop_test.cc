// The one step loop driven with a fake backend: gradients reduced as the shardings imply and on
// the explicit-collective (pmap) path, in buckets of the requested size, metrics reduced as the
// spec declares, evaluation and parameter gathering. On CPU over real Gloo (a (data=2, model=2)
// mesh of 4 device threads); the CUDA variant keeps the fake's buffers in GPU memory and
// connects with NCCL (a single-rank mesh: NCCL refuses two ranks on one GPU), and skips itself
// without a GPU or without --config=cuda.
#include "worker/runtime/step_loop.h"

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "core/device_mesh_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/collectives/nccl_communicator.h"
#include "worker/collectives/store.h"
#include "worker/runtime/preemption.h"
#include "worker/runtime/sharded_update.h"
#include "worker/runtime/test_mesh.h"

#ifdef SUBSTRAX_CUDA
#include <cuda_runtime.h>
#endif

namespace substrax {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Where the fake keeps its gradient buffer: host memory, or GPU memory.
struct Memory {
  std::function<float*(int64_t)> allocate;
  std::function<void(float*)> release;
  std::function<void(float* dst, const float* src, int64_t n)> to_buffer;
  std::function<void(float* dst, const float* src, int64_t n)> from_buffer;
};

Memory HostMemory() {
  auto copy = [](float* dst, const float* src, int64_t n) {
    std::memcpy(dst, src, n * sizeof(float));
  };
  return {[](int64_t n) { return new float[n > 0 ? n : 1]; }, [](float* p) { delete[] p; }, copy,
          copy};
}

// Three parameters: two replicated ("a" [3], "c" [2]) and one split over "model" ("b" [4]).
std::vector<ParamSpec> FakeParams() {
  return {{"a", {3}, PartitionSpec(), 3, 3},
          {"b", {4}, PartitionSpec::Of({"model"}), 4, 4},
          {"c", {2}, PartitionSpec(), 2, 2}};
}

// The gradient value device `id` computes for element i of `name` at step `step`.
float GradValue(int id, int64_t step, const std::string& name, int64_t i) {
  return static_cast<float>((id + 1) * (i + 1) + 10 * step + (name == "b" ? 100 : 0));
}

// Gradient all-reduces (float32) awaited so far on this thread: each device runs its loop on
// its own thread, so this counts that device's awaits.
thread_local int64_t gradient_awaits = 0;

class FakeBackend final : public DeviceBackend, public BlockUpdate {
 public:
  FakeBackend(int id, int64_t model_size, int64_t model_index, Memory memory)
      : id_(id),
        model_size_(model_size),
        model_index_(model_index),
        memory_(std::move(memory)),
        params_(FakeParams()) {
    // Without a model axis nothing is split.
    if (model_size_ == 1) {
      for (ParamSpec& p : params_) p.partition = PartitionSpec();
    }
  }
  ~FakeBackend() override {
    if (flat_ != nullptr) memory_.release(flat_);
  }

  const std::vector<ParamSpec>& params() const override { return params_; }
  std::vector<int64_t> LocalShape(const ParamSpec& p) const override {
    if (p.partition == PartitionSpec()) return p.shape;
    return {p.shape[0] / model_size_};
  }
  bool is_classification() const override { return true; }
  ExecutionContext execution_context() const override { return ExecutionContext(); }
  int max_steps_in_flight() const override { return in_flight; }

  absl::StatusOr<float*> BindGradients(const FlatLayout& layout) override {
    layout_ = layout;
    flat_ = memory_.allocate(layout.total);
    return flat_;
  }
  absl::StatusOr<bool> NextBatch() override { return step_ < 1000; }
  void SetGradientsReady(GradientsReady ready) override { ready_ = std::move(ready); }
  absl::Status ComputeGradients() override {
    if (ready_ && !overlap_peers.empty()) return ComputeAnnouncing();
    std::vector<float> host(layout_.total);
    for (const FlatSlot& slot : layout_.slots) {
      for (int64_t i = 0; i < slot.size; ++i) {
        host[slot.offset + i] = GradValue(id_, step_, slot.name, i);
      }
    }
    memory_.to_buffer(flat_, host.data(), layout_.total);
    sums_.loss_sum += 2.0 * (id_ + 1);  // loss (id + 1) on 2 examples
    sums_.correct += id_ % 2;           // accuracy 0 or 0.5
    sums_.count += 2;
    return absl::OkStatus();
  }
  absl::Status ApplyGradients() override {
    std::vector<float> host(layout_.total);
    memory_.from_buffer(host.data(), flat_, layout_.total);
    std::map<std::string, std::vector<float>> step;
    for (const FlatSlot& slot : layout_.slots) {
      step[slot.name].assign(host.begin() + slot.offset, host.begin() + slot.offset + slot.size);
    }
    applied.push_back(std::move(step));
    awaits_at_apply.push_back(gradient_awaits);
    ++step_;
    return absl::OkStatus();
  }
  int id() const { return id_; }
  // The sharded update: the loop runs it as the fake's own reducer.
  absl::StatusOr<std::unique_ptr<GradientReducer>> OwnGradientReducer(
      const GradientReducerSetup& setup) override {
    if (!shard) return nullptr;
    return CreateShardedUpdate(setup, *this, *this);
  }
  absl::Status ApplyGradientBlock(int64_t begin, int64_t end, int64_t step) override {
    if (step == fail_block_at_step) return absl::InternalError("injected update failure");
    std::vector<float> host(layout_.total);
    memory_.from_buffer(host.data(), flat_, layout_.total);
    blocks.push_back({begin, end});
    block_values.emplace_back(host.begin() + begin, host.begin() + end);
    ++step_;
    return absl::OkStatus();
  }
  absl::Status FetchPeerBlocks(int64_t block, int rank, int size) override {
    fetches.push_back({block, rank, size});
    return absl::OkStatus();
  }
  absl::StatusOr<EvalResult> TakeMetrics() override { return std::exchange(sums_, EvalResult()); }
  void MarkPhase(Phase phase) override { clock_.Mark(phase); }
  absl::StatusOr<PhaseSeconds> TakePhaseSeconds() override { return clock_.Take(); }
  absl::StatusOr<EvalResult> Evaluate(const Dataset&, int64_t begin, int64_t end) override {
    evaluated_rows = {begin, end};
    return EvalResult{static_cast<double>(id_ + 1), 1, 1};
  }
  absl::StatusOr<TensorTree> Parameters() override {
    TensorTree tree;
    for (const ParamSpec& p : params_) {
      const std::vector<int64_t> shape = LocalShape(p);
      std::vector<float> values;
      // Each block of "b" holds its global indices, so gathering must rebuild 0..3.
      const int64_t base = p.name == "b" ? model_index_ * shape[0] : 0;
      for (int64_t i = 0; i < shape[0]; ++i) values.push_back(static_cast<float>(base + i));
      tree[p.name] = Tensor(shape, values);
    }
    return tree;
  }

  // Set: ComputeGradients writes the slots last first (as a backward pass does), announces each,
  // and after the first waits until its last value is the mean over these devices' ids (its
  // bucket is complete then): it can only get there while the pass is still running if the loop
  // reduces during it.
  std::vector<int> overlap_peers;
  // What ApplyGradients saw, per step: the reduced gradients by name.
  std::vector<std::map<std::string, std::vector<float>>> applied;
  std::pair<int64_t, int64_t> evaluated_rows;
  // What max_steps_in_flight says (an asynchronous backend when > 0), and gradient_awaits at
  // each ApplyGradients.
  int in_flight = 0;
  std::vector<int64_t> awaits_at_apply;
  // The sharded update: whether the fake shards, the step (1-based) whose ApplyGradientBlock
  // fails, and what ApplyGradientBlock and FetchPeerBlocks were given, per step.
  bool shard = false;
  int64_t fail_block_at_step = -1;
  std::vector<std::pair<int64_t, int64_t>> blocks;
  std::vector<std::vector<float>> block_values;
  std::vector<std::tuple<int64_t, int, int>> fetches;

 private:
  const int id_;
  const int64_t model_size_;
  const int64_t model_index_;
  const Memory memory_;
  std::vector<ParamSpec> params_;
  absl::Status ComputeAnnouncing() {
    for (auto slot = layout_.slots.rbegin(); slot != layout_.slots.rend(); ++slot) {
      for (int64_t i = 0; i < slot->size; ++i) {
        flat_[slot->offset + i] = GradValue(id_, step_, slot->name, i);
      }
      ready_(slot->offset, slot->size);
      if (slot != layout_.slots.rbegin()) continue;
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      for (;;) {
        const int64_t last = slot->size - 1;
        float mean = 0;
        for (int peer : overlap_peers) mean += GradValue(peer, step_, slot->name, last);
        mean /= static_cast<float>(overlap_peers.size());
        if (reinterpret_cast<volatile float*>(flat_)[slot->offset + last] == mean) break;
        if (absl::Now() > deadline) {
          return absl::DeadlineExceededError(absl::StrCat(
              "slot ", slot->name, " was not reduced during the pass (step ", step_, ")"));
        }
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    sums_.count += 2;
    return absl::OkStatus();
  }

  GradientsReady ready_;
  FlatLayout layout_;
  float* flat_ = nullptr;
  int64_t step_ = 0;
  EvalResult sums_;
  HostPhaseClock clock_;
};

// Counts the Awaits of a gradient all-reduce in gradient_awaits.
class AwaitCounting final : public CollectiveEvent::Pending {
 public:
  explicit AwaitCounting(CollectiveEvent inner) : inner_(std::move(inner)) {}
  bool IsReady() override { return inner_.IsReady(); }
  absl::Status Await() override {
    ++gradient_awaits;
    return inner_.Await();
  }

 private:
  const CollectiveEvent inner_;
};

// Counts the float32 all-reduces (the gradient buckets) of every communicator it connects, and
// their Awaits.
class CountingCommunicator final : public Communicator {
 public:
  CountingCommunicator(std::unique_ptr<Communicator> inner, std::atomic<int64_t>* count)
      : inner_(std::move(inner)), count_(count) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const std::string& name() const override { return inner_->name(); }

 protected:
  CollectiveEvent DoAllReduce(void* data, DataType type, size_t count, ReduceOp op,
                              ExecutionContext context) override {
    CollectiveEvent event = inner_->AllReduceAsync(data, type, count, op, context);
    if (type != DataType::kFloat32) return event;
    ++*count_;
    return CollectiveEvent(std::make_shared<AwaitCounting>(std::move(event)));
  }
  CollectiveEvent DoAllGather(const void* input, void* output, DataType type, size_t count,
                              ExecutionContext context) override {
    return inner_->AllGatherAsync(input, output, type, count, context);
  }
  CollectiveEvent DoBroadcast(void* data, DataType type, size_t count, int root,
                              ExecutionContext context) override {
    return inner_->BroadcastAsync(data, type, count, root, context);
  }
  CollectiveEvent DoReduceScatter(const void* input, void* output, DataType type, size_t count,
                                  ReduceOp op, ExecutionContext context) override {
    return inner_->ReduceScatterAsync(input, output, type, count, op, context);
  }
  CollectiveEvent DoBarrier(ExecutionContext context) override {
    return inner_->BarrierAsync(context);
  }

 private:
  std::unique_ptr<Communicator> inner_;
  std::atomic<int64_t>* count_;
};

class CountingConnector final : public GroupConnector {
 public:
  CountingConnector(std::unique_ptr<GroupConnector> inner, std::atomic<int64_t>* count)
      : inner_(std::move(inner)), count_(count) {}
  absl::StatusOr<std::unique_ptr<Communicator>> ConnectWorld(
      const CommunicatorGroup& world) override {
    return Wrap(inner_->ConnectWorld(world));
  }
  absl::StatusOr<std::unique_ptr<Communicator>> ConnectAxis(
      Communicator& world, const CommunicatorGroup& group) override {
    return Wrap(inner_->ConnectAxis(world, group));
  }

 private:
  absl::StatusOr<std::unique_ptr<Communicator>> Wrap(
      absl::StatusOr<std::unique_ptr<Communicator>> comm) {
    if (!comm.ok()) return comm;
    return std::unique_ptr<Communicator>(
        std::make_unique<CountingCommunicator>(std::move(*comm), count_));
  }
  std::unique_ptr<GroupConnector> inner_;
  std::atomic<int64_t>* count_;
};

v1::JobSpec Spec() {
  v1::JobSpec spec;
  spec.set_report_every_steps(2);
  spec.mutable_batch()->set_global_batch_size(4);
  (*spec.mutable_metrics())["loss"] = v1::REDUCTION_MEAN;
  (*spec.mutable_metrics())["accuracy"] = v1::REDUCTION_MAX;
  (*spec.mutable_metrics())["step"] = v1::REDUCTION_MIN;
  return spec;
}

struct LoopCase {
  bool explicit_collectives;
  int64_t bucket_bytes;
  // Float32 all-reduces per step on every device: buckets over "data" plus over "model".
  int64_t collectives_per_step;
  // The fake's max_steps_in_flight: 0 awaits every step's reduction before ApplyGradients; more
  // leaves them in flight until the report.
  int in_flight = 0;
};

// The options every device's loop in these tests starts from: the device's place in `mesh`,
// its communicators, the job's length and the evaluation data.
StepLoopOptions LoopOptions(const DeviceContext& ctx, const v1::JobSpec& spec, const Mesh& mesh,
                            int64_t total_steps, const Dataset* eval) {
  StepLoopOptions options;
  options.spec = &spec;
  options.mesh = &mesh;
  options.device_id = ctx.device.id;
  options.comms = ctx.comms;
  options.total_steps = total_steps;
  options.eval = eval;
  return options;
}

class StepLoopTest : public ::testing::TestWithParam<LoopCase> {};

TEST_P(StepLoopTest, ReducesGradientsAndMetricsOnAHybridMesh) {
  const LoopCase c = GetParam();
  const Mesh mesh = *DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(2, 2), 2, 2);
  const v1::JobSpec spec = Spec();
  constexpr int64_t kSteps = 3;
  Dataset eval;  // the fake evaluates rows only
  absl::Mutex mu;
  std::vector<ProgressReport> reports;
  std::map<int, std::unique_ptr<FakeBackend>> backends;
  std::map<int, absl::StatusOr<TrainResult>> results;
  std::map<int, StepLoopStats> stats;
  std::atomic<int64_t> collectives{0};
  RunOnDevices(
      mesh,
      [&](DeviceContext& ctx) {
        const int id = ctx.device.id;
        auto backend = std::make_unique<FakeBackend>(id, 2, ctx.coords[1], HostMemory());
        backend->in_flight = c.in_flight;
        gradient_awaits = 0;
        StepLoopOptions options = LoopOptions(ctx, spec, mesh, kSteps, &eval);
        options.steps_per_epoch = 2;
        options.explicit_collectives = c.explicit_collectives;
        options.gradients.bucket_bytes = c.bucket_bytes;
        options.on_progress = [&](const ProgressReport& r) {
          absl::MutexLock lock(&mu);
          reports.push_back(r);
        };
        StepLoopStats s;
        absl::StatusOr<TrainResult> r = RunStepLoop(options, *backend, &s);
        absl::MutexLock lock(&mu);
        results.emplace(id, std::move(r));
        stats[id] = s;
        backends[id] = std::move(backend);
      },
      [&](std::unique_ptr<GroupConnector> inner) -> std::unique_ptr<GroupConnector> {
        return std::make_unique<CountingConnector>(std::move(inner), &collectives);
      });

  ASSERT_EQ(results.size(), 4u);
  for (const auto& [id, r] : results) ASSERT_TRUE(r.ok()) << "device " << id << ": " << r.status();

  // Gradients: replicated parameters averaged over all 4 devices, "b" over the data axis only
  // (the devices with the same model coordinate), at every step, on every device.
  for (const auto& [id, backend] : backends) {
    const std::vector<int64_t> mine = *mesh.CoordinatesOf(id);
    ASSERT_EQ(backend->applied.size(), static_cast<size_t>(kSteps));
    for (int64_t step = 0; step < kSteps; ++step) {
      for (const std::string name : {"a", "b", "c"}) {
        const std::vector<float>& got = backend->applied[step].at(name);
        std::vector<float> want(got.size(), 0.0f);
        int replicas = 0;
        for (const Device& d : mesh.devices()) {
          const std::vector<int64_t> theirs = *mesh.CoordinatesOf(d.id);
          if (name == "b" && theirs[1] != mine[1]) continue;
          ++replicas;
          for (size_t i = 0; i < want.size(); ++i) want[i] += GradValue(d.id, step, name, i);
        }
        for (float& w : want) w /= static_cast<float>(replicas);
        EXPECT_THAT(got, ElementsAreArray(want)) << "device " << id << " step " << step << " "
                                                 << name;
      }
    }
    // Buckets: as many float32 all-reduces as the bucket size implies, and no more.
    EXPECT_EQ(stats[id].gradient_collectives, kSteps * c.collectives_per_step);
    // Awaits: before each update on a synchronous backend; on an asynchronous one only at the
    // report after step 2 (max_steps_in_flight 2 is never exceeded between reports).
    const std::vector<int64_t> awaits =
        c.in_flight == 0
            ? std::vector<int64_t>{c.collectives_per_step, 2 * c.collectives_per_step,
                                   3 * c.collectives_per_step}
            : std::vector<int64_t>{0, 0, 2 * c.collectives_per_step};
    EXPECT_THAT(backend->awaits_at_apply, ElementsAreArray(awaits)) << "device " << id;
  }
  EXPECT_EQ(collectives.load(), 4 * kSteps * c.collectives_per_step);

  // Metrics, reduced as declared: loss mean of 1..4, accuracy max of {0, 0.5}, step min.
  ASSERT_EQ(reports.size(), 2u);  // after step 2 and after the last
  EXPECT_EQ(reports[0].step, 2);
  EXPECT_EQ(reports[1].step, 3);
  EXPECT_EQ(reports[1].epoch, 2);
  EXPECT_EQ(reports[1].total_epochs, 2);
  EXPECT_THAT(reports[1].metrics.at("loss"), DoubleEq(2.5));
  EXPECT_THAT(reports[1].metrics.at("accuracy"), DoubleEq(0.5));
  EXPECT_THAT(reports[1].metrics.at("step"), DoubleEq(3));
  EXPECT_GT(reports[1].samples_per_second, 0);

  for (const auto& [id, r] : results) {
    // Evaluation sums over the data axis: the two devices with this model coordinate.
    const std::vector<int64_t> mine = *mesh.CoordinatesOf(id);
    double loss = 0;
    for (const Device& d : mesh.devices()) {
      if ((*mesh.CoordinatesOf(d.id))[1] == mine[1]) loss += d.id + 1;
    }
    EXPECT_THAT(r->evaluation.at("test_loss"), DoubleEq(loss / 2)) << "device " << id;
    EXPECT_THAT(r->evaluation.at("test_accuracy"), DoubleEq(1.0));
    // Parameters gathered to their full shapes: "b" rebuilt from its two blocks.
    EXPECT_THAT(r->params.at("b").span(), ElementsAreArray({0.0f, 1.0f, 2.0f, 3.0f}));
    EXPECT_EQ(r->params.at("a").size(), 3);
    EXPECT_EQ(r->steps, kSteps);
  }
}

// Flat layout: a[3] c[2] (replicated) then b[2] (this device's block). Over "data": all 7 values;
// over "model": the 5 replicated ones. Buckets of 2 values: 4 + 3; of 25 MiB: 1 + 1.
INSTANTIATE_TEST_SUITE_P(
    Paths, StepLoopTest,
    ::testing::Values(LoopCase{false, 8, 7}, LoopCase{false, int64_t{25} << 20, 2},
                      LoopCase{true, 8, 7}, LoopCase{true, int64_t{25} << 20, 2},
                      LoopCase{false, 8, 7, 2}, LoopCase{true, int64_t{25} << 20, 2, 2}),
    [](const ::testing::TestParamInfo<LoopCase>& info) {
      return std::string(info.param.explicit_collectives ? "Explicit" : "Sharding") +
             (info.param.bucket_bytes == 8 ? "SmallBuckets" : "LargeBuckets") +
             (info.param.in_flight > 0 ? "InFlight" : "");
    });

// What the loops of a data-parallel mesh of fakes left: each device's backend, result and stats.
struct DataParallelRun {
  std::map<int, std::unique_ptr<FakeBackend>> backends;
  std::map<int, absl::StatusOr<TrainResult>> results;
  std::map<int, StepLoopStats> stats;
};

// Runs `steps` steps on each of `devices` fakes of a data-parallel mesh, each backend and its
// options set up by `setup` first.
DataParallelRun RunDataParallel(
    int devices, int64_t steps,
    const std::function<void(FakeBackend&, StepLoopOptions&)>& setup) {
  const Mesh mesh = *DeviceMeshManager::CreateDataParallelMesh(MakeUniformCluster(1, devices));
  const v1::JobSpec spec = Spec();
  Dataset eval;
  absl::Mutex mu;
  DataParallelRun run;
  RunOnDevices(mesh, [&](DeviceContext& ctx) {
    const int id = ctx.device.id;
    auto backend = std::make_unique<FakeBackend>(id, 1, 0, HostMemory());
    StepLoopOptions options = LoopOptions(ctx, spec, mesh, steps, &eval);
    setup(*backend, options);
    StepLoopStats s;
    absl::StatusOr<TrainResult> r = RunStepLoop(options, *backend, &s);
    absl::MutexLock lock(&mu);
    run.results.emplace(id, std::move(r));
    run.stats[id] = s;
    run.backends[id] = std::move(backend);
  });
  return run;
}

// Overlap: on a data-parallel mesh each bucket is reduced as soon as the pass announces it. The
// fake waits inside its pass for the first announced slot to be averaged (it fails after 30 s
// otherwise), and the results equal the reduction after the pass.
// One device: no collective, unless forced (what bench/gpu_mlp and the GPU check use to run a
// step's collectives on one GPU); forced, the mean over one replica leaves the gradients as
// they are.
TEST(StepLoopForcedCollectivesTest, OneDeviceReducesOnlyWhenForced) {
  const Mesh mesh = *DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(1, 1), 1, 1);
  const v1::JobSpec spec = Spec();
  Dataset eval;
  for (bool force : {false, true}) {
    std::atomic<int64_t> collectives{0};
    std::unique_ptr<FakeBackend> backend;
    absl::StatusOr<TrainResult> result = absl::UnknownError("not run");
    StepLoopStats stats;
    RunOnDevices(
        mesh,
        [&](DeviceContext& ctx) {
          backend = std::make_unique<FakeBackend>(ctx.device.id, 1, 0, HostMemory());
          StepLoopOptions options = LoopOptions(ctx, spec, mesh, 3, &eval);
          options.force_single_replica_collectives = force;
          result = RunStepLoop(options, *backend, &stats);
        },
        [&](std::unique_ptr<GroupConnector> inner) -> std::unique_ptr<GroupConnector> {
          return std::make_unique<CountingConnector>(std::move(inner), &collectives);
        });
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(stats.gradient_collectives > 0, force) << stats.gradient_collectives;
    ASSERT_EQ(backend->applied.size(), 3u);
    EXPECT_THAT(backend->applied[2].at("a"),
                ElementsAreArray({GradValue(mesh.devices()[0].id, 2, "a", 0),
                                  GradValue(mesh.devices()[0].id, 2, "a", 1),
                                  GradValue(mesh.devices()[0].id, 2, "a", 2)}));
  }
}

TEST(StepLoopOverlapTest, BucketsAreReducedWhileTheBackwardPassRuns) {
  constexpr int64_t kSteps = 3;
  DataParallelRun run = RunDataParallel(2, kSteps, [](FakeBackend& b, StepLoopOptions& o) {
    b.overlap_peers = {0, 1};
    o.gradients.bucket_bytes = 8;
    o.overlap_gradients = true;
  });
  auto& [backends, results, stats] = run;
  ASSERT_EQ(results.size(), 2u);
  for (const auto& [id, r] : results) ASSERT_TRUE(r.ok()) << "device " << id << ": " << r.status();
  for (const auto& [id, backend] : backends) {
    EXPECT_EQ(stats[id].gradient_reducer, "overlapped");
    // Layout a[3] b[4] c[2]: over "data" one range of 9 values, in buckets of 2 values: 5 per
    // step.
    EXPECT_EQ(stats[id].gradient_collectives, kSteps * 5);
    for (int64_t step = 0; step < kSteps; ++step) {
      for (const std::string name : {"a", "b", "c"}) {
        const std::vector<float>& got = backend->applied[step].at(name);
        std::vector<float> want(got.size());
        for (size_t i = 0; i < want.size(); ++i) {
          want[i] = (GradValue(0, step, name, i) + GradValue(1, step, name, i)) / 2;
        }
        EXPECT_THAT(got, ElementsAreArray(want)) << "device " << id << " step " << step << " "
                                                 << name;
      }
    }
  }
}

// The sharded update on a data-parallel mesh of 3 devices: one reduce-scatter per step, each
// device updates its block of the padded layout (blocks of whole cache lines: the 9 values all
// fall in block 0 of 16, blocks 1 and 2 are empty) with the mean over the devices, then fetches
// the others'.
TEST(StepLoopShardedTest, EachDeviceUpdatesItsBlockWithTheMean) {
  constexpr int64_t kSteps = 3;
  DataParallelRun run = RunDataParallel(3, kSteps, [](FakeBackend& b, StepLoopOptions& o) {
    b.shard = true;
    o.overlap_gradients = true;  // not taken with the sharded update
  });
  auto& [backends, results, stats] = run;
  ASSERT_EQ(results.size(), 3u);
  for (const auto& [id, r] : results) ASSERT_TRUE(r.ok()) << "device " << id << ": " << r.status();
  for (const auto& [id, backend] : backends) {
    SCOPED_TRACE(absl::StrCat("device ", id));
    EXPECT_EQ(stats[id].gradient_reducer, "sharded update");  // not overlapped
    EXPECT_EQ(stats[id].gradient_collectives, kSteps);
    ASSERT_EQ(backend->blocks.size(), static_cast<size_t>(kSteps));
    EXPECT_TRUE(backend->applied.empty());  // never ApplyGradients
    for (int64_t step = 0; step < kSteps; ++step) {
      EXPECT_EQ(backend->fetches[step], std::make_tuple(int64_t{16}, id, 3));
      if (id > 0) {
        EXPECT_EQ(backend->blocks[step], std::make_pair(int64_t{9}, int64_t{9}));
        continue;
      }
      EXPECT_EQ(backend->blocks[step], std::make_pair(int64_t{0}, int64_t{9}));
      // Without a model axis every parameter is replicated: the layout is a[3] b[4] c[2].
      std::vector<float> want;
      for (const std::string name : {"a", "b", "c"}) {
        const int64_t n = name == "a" ? 3 : name == "b" ? 4 : 2;
        for (int64_t i = 0; i < n; ++i) {
          want.push_back((GradValue(0, step, name, i) + GradValue(1, step, name, i) +
                          GradValue(2, step, name, i)) /
                         3);
        }
      }
      EXPECT_THAT(backend->block_values[step], ElementsAreArray(want)) << "step " << step;
    }
  }
}

// A device whose update fails stops its loop; the others do not wait for it forever: their
// barrier or next collective fails, and every loop returns.
TEST(StepLoopShardedTest, AFailedBlockUpdateStopsEveryDevice) {
  DataParallelRun run = RunDataParallel(2, 4, [](FakeBackend& b, StepLoopOptions&) {
    b.shard = true;
    if (b.id() == 1) b.fail_block_at_step = 2;
  });
  const auto& results = run.results;
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results.at(1).status().code(), absl::StatusCode::kInternal) << results.at(1).status();
  EXPECT_THAT(results.at(1).status().message(), HasSubstr("step 2"));
  EXPECT_FALSE(results.at(0).ok());
}

// Checkpoints: every device saves at the same steps, after that step's update: every N steps and
// at the end; by time at reports (a 1 ns interval: due at every report); a resumed loop runs
// only the steps after its first.
TEST(StepLoopSaveTest, EveryDeviceSavesAtTheStepsTheSpecAsksFor) {
  const Mesh mesh = *DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(2, 2), 2, 2);
  v1::JobSpec spec = Spec();
  spec.set_report_every_steps(5);
  struct SaveCase {
    int64_t first_step, every_steps;
    absl::Duration every;
    bool at_end;
    std::vector<int64_t> saved;
  };
  for (const SaveCase& c : {SaveCase{0, 7, absl::ZeroDuration(), true, {7, 14, 20}},
                            SaveCase{5, 0, absl::Nanoseconds(1), false, {10, 15, 20}},
                            SaveCase{0, 4, absl::ZeroDuration(), false, {4, 8, 12, 16, 20}}}) {
    SCOPED_TRACE(absl::StrCat("first ", c.first_step, " every ", c.every_steps));
    absl::Mutex mu;
    std::map<int, std::vector<int64_t>> saved;
    std::map<int, size_t> applied_at_save;
    std::map<int, absl::Status> results;
    Dataset eval;
    RunOnDevices(mesh, [&](DeviceContext& ctx) {
      const int id = ctx.device.id;
      FakeBackend backend(id, 2, ctx.coords[1], HostMemory());
      StepLoopOptions options = LoopOptions(ctx, spec, mesh, 20, &eval);
      options.first_step = c.first_step;
      options.save_every_steps = c.every_steps;
      options.save_every = c.every;
      options.save_at_end = c.at_end;
      options.save = [&, id](int64_t steps_done, DeviceBackend& b) -> absl::Status {
        absl::MutexLock lock(&mu);
        saved[id].push_back(steps_done);
        applied_at_save[id] = static_cast<FakeBackend&>(b).applied.size();
        return absl::OkStatus();
      };
      absl::StatusOr<TrainResult> r = RunStepLoop(options, backend);
      absl::MutexLock lock(&mu);
      results[id] = r.status();
      if (r.ok()) {
        EXPECT_EQ(r->resumed_from_step, c.first_step);
      }
      EXPECT_EQ(backend.applied.size(), static_cast<size_t>(20 - c.first_step));
    });
    ASSERT_EQ(results.size(), 4u);
    for (const auto& [id, status] : results) ASSERT_TRUE(status.ok()) << id << ": " << status;
    for (int id = 0; id < 4; ++id) {
      EXPECT_THAT(saved[id], ElementsAreArray(c.saved)) << "device " << id;
      // The last save came after the last update.
      EXPECT_EQ(applied_at_save[id], static_cast<size_t>(20 - c.first_step)) << "device " << id;
    }
  }
}

// A save that fails stops the loop with the error, naming the step.
TEST(StepLoopSaveTest, AFailedSaveStopsTheLoop) {
  const Mesh mesh = *DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(1, 1), 1, 1);
  const v1::JobSpec spec = Spec();
  Dataset eval;
  absl::Status status;
  RunOnDevices(mesh, [&](DeviceContext& ctx) {
    FakeBackend backend(ctx.device.id, 1, 0, HostMemory());
    StepLoopOptions options = LoopOptions(ctx, spec, mesh, 10, &eval);
    options.save_every_steps = 3;
    options.save = [](int64_t, DeviceBackend&) {
      return absl::UnavailableError("cannot write /ckpt/x: No space left on device");
    };
    status = RunStepLoop(options, backend).status();
    EXPECT_EQ(backend.applied.size(), 3u);
  });
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.message()), HasSubstr("checkpoint after step 3"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("No space left on device"));
}

// A stop asked of one device (SIGTERM in its process) between reports: at the next report every
// device agrees on it, saves that step and ends with StoppedBySigterm; without checkpoints the
// message says so.
TEST(StepLoopStopTest, OneDevicesStopEndsEveryDeviceAtTheSameStepAfterACheckpoint) {
  const Mesh mesh = *DeviceMeshManager::CreateHybridMesh(MakeUniformCluster(2, 2), 2, 2);
  v1::JobSpec spec = Spec();
  spec.set_report_every_steps(5);
  for (const bool checkpoints : {true, false}) {
    SCOPED_TRACE(checkpoints ? "with checkpoints" : "without");
    absl::Mutex mu;
    std::map<int, std::vector<int64_t>> saved;
    std::map<int, absl::Status> results;
    std::map<int, size_t> applied;
    Dataset eval;
    RunOnDevices(mesh, [&](DeviceContext& ctx) {
      const int id = ctx.device.id;
      FakeBackend backend(id, 2, ctx.coords[1], HostMemory());
      StepLoopOptions options = LoopOptions(ctx, spec, mesh, 20, &eval);
      if (checkpoints) {
        options.save_every_steps = 20;
        options.save = [&, id](int64_t steps_done, DeviceBackend&) -> absl::Status {
          absl::MutexLock lock(&mu);
          saved[id].push_back(steps_done);
          return absl::OkStatus();
        };
      }
      // Device 3 alone is asked, after its 7th step: the next report is after step 10.
      options.stop_requested = [&backend, id] { return id == 3 && backend.applied.size() >= 7; };
      absl::StatusOr<TrainResult> r = RunStepLoop(options, backend);
      absl::MutexLock lock(&mu);
      results[id] = r.status();
      applied[id] = backend.applied.size();
    });
    ASSERT_EQ(results.size(), 4u);
    for (int id = 0; id < 4; ++id) {
      EXPECT_TRUE(IsStoppedBySigterm(results[id])) << id << ": " << results[id];
      EXPECT_EQ(results[id].message(),
                checkpoints
                    ? "stopped after step 10 by SIGTERM (preempted); checkpoint of step 10 written"
                    : "stopped after step 10 by SIGTERM (preempted); no checkpoint: the spec has "
                      "none");
      EXPECT_EQ(applied[id], 10u) << "device " << id;
      if (checkpoints) {
        EXPECT_THAT(saved[id], ElementsAre(10)) << "device " << id;
      }
    }
  }
}

// The CUDA variant: the fake's gradient buffer in GPU memory, NCCL communicators (one rank), the
// loop's collectives on the device. Needs a GPU; part of the GPU check.
TEST(StepLoopCudaTest, RunsOnGpuMemoryWithNccl) {
#ifndef SUBSTRAX_CUDA
  GTEST_SKIP() << "built without --config=cuda: no CUDA backend to test";
#else
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    GTEST_SKIP() << "no CUDA device on this machine";
  }
  Memory gpu;
  gpu.allocate = [](int64_t n) {
    void* p = nullptr;
    return cudaMalloc(&p, (n > 0 ? n : 1) * sizeof(float)) == cudaSuccess
               ? static_cast<float*>(p)
               : nullptr;
  };
  gpu.release = [](float* p) { cudaFree(p); };
  // The collectives run on non-blocking streams, which the legacy stream of a plain cudaMemcpy
  // does not wait for: every copy first waits for the whole device.
  gpu.to_buffer = [](float* dst, const float* src, int64_t n) {
    cudaDeviceSynchronize();
    cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyHostToDevice);
  };
  gpu.from_buffer = [](float* dst, const float* src, int64_t n) {
    cudaDeviceSynchronize();
    cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost);
  };
  std::vector<Device> devices = MakeUniformCluster(1, 1);
  devices[0].kind = DeviceKind::kCuda;
  const Mesh mesh = *DeviceMeshManager::CreateHybridMesh(devices, 1, 1);
  InMemoryStore store;
  NcclGroupConnector connector(NcclCommunicatorOptions(), &store);
  auto comms = MeshCommunicators::Create(mesh, mesh.devices()[0].id, connector);
  ASSERT_TRUE(comms.ok()) << comms.status();
  FakeBackend backend(mesh.devices()[0].id, 1, 0, gpu);
  const v1::JobSpec spec = Spec();
  Dataset eval;
  StepLoopOptions options;
  options.spec = &spec;
  options.mesh = &mesh;
  options.device_id = mesh.devices()[0].id;
  options.comms = comms->get();
  options.total_steps = 3;
  options.eval = &eval;
  options.gradients.bucket_bytes = 8;
  std::vector<ProgressReport> reports;
  options.on_progress = [&](const ProgressReport& r) { reports.push_back(r); };
  absl::StatusOr<TrainResult> result = RunStepLoop(options, backend);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(backend.applied.size(), 3u);
  EXPECT_THAT(backend.applied[2].at("a"),
              ElementsAreArray({GradValue(options.device_id, 2, "a", 0),
                                GradValue(options.device_id, 2, "a", 1),
                                GradValue(options.device_id, 2, "a", 2)}));
  ASSERT_EQ(reports.size(), 2u);
  EXPECT_THAT(reports[1].metrics.at("loss"), DoubleEq(options.device_id + 1));
  EXPECT_THAT(result->params.at("b").span(), ElementsAreArray({0.0f, 1.0f, 2.0f, 3.0f}));
#endif
}

}  // namespace
}  // namespace substrax
