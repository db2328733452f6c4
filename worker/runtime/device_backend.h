// DeviceBackend: what the step loop needs from one device, whatever its kind. The loop
// (step_loop.h) owns the order of a step, the collectives, the metrics and the reports; a backend
// owns the device's model, optimizer, parameters, input pipeline, metric sums and clock.
// Implementations: CPU (cpu_backend.h: Eigen models, PrefetchToDevice) and CUDA
// (cuda_backend.h: cuBLAS models, CudaPrefetcher, NCCL on its stream); tests add fakes.
//
// A step, as the loop drives it:
//   MarkPhase(kData); NextBatch();
//   MarkPhase(kCompute); ComputeGradients();        -> the flat gradient buffer
//   MarkPhase(kCollective); <the step's GradientReducer: all-reduce buckets of the buffer on
//                            execution_context(), see gradient_reducer.h>
//   MarkPhase(kCompute); ApplyGradients();       (or the backend's own reducer's update)
// A backend may queue its work and return (CUDA); everything it queues is ordered on its
// execution context, which is where the loop's collectives go too. Such a backend says so with
// max_steps_in_flight() > 0: the loop then does not wait for the gradient reduction before
// ApplyGradients (the device orders the update after it) and collects the reductions' outcomes
// later, at each report or once more steps than that are in flight.
//
// Used by one device thread.
#ifndef SUBSTRAX_WORKER_RUNTIME_DEVICE_BACKEND_H_
#define SUBSTRAX_WORKER_RUNTIME_DEVICE_BACKEND_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/model_catalog.h"
#include "worker/collectives/communicator.h"
#include "substrax/v1/job.pb.h"
#include "worker/data/dataset.h"
#include "worker/data/prefetch.h"
#include "worker/runtime/gradient_buckets.h"
#include "worker/runtime/gradient_reducer.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// Where a device's time goes.
enum class Phase { kData = 0, kCompute = 1, kCollective = 2 };
inline constexpr int kNumPhases = 3;
using PhaseSeconds = std::array<double, kNumPhases>;

// What a backend is built from, whatever its kind (CreateCpuBackend, CreateCudaBackend).
struct BackendSetup {
  // A defaulted, validated spec: model, optimizer, seed, data.prefetch_size.
  const v1::JobSpec* spec = nullptr;
  int64_t num_features = 0;
  // The device: its index among its host's devices of its kind (the CUDA ordinal).
  int local_index = 0;
  // Tensor parallelism: the communicator of the model axis (null without one) and this
  // device's coordinate on it.
  Communicator* model_axis = nullptr;
  int64_t model_index = 0;
  // This device's training batches, in order.
  Producer<Batch> batches;
  // CUDA: replay the pass and the update as CUDA graphs (off: every launch eager, for
  // comparison in bench/gpu_mlp).
  bool cuda_graphs = true;
};

class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;

  // The model's parameters (global shapes, partition specs) in layer order, the shape of this
  // device's block of each, and whether the model classifies.
  virtual const std::vector<ParamSpec>& params() const = 0;
  virtual std::vector<int64_t> LocalShape(const ParamSpec& p) const = 0;
  virtual bool is_classification() const = 0;

  // Where this device's work and its collectives are ordered (a CUDA stream, or the thread).
  virtual ExecutionContext execution_context() const = 0;
  // How many steps' gradient reductions the loop may leave un-awaited. 0 (the default): the loop
  // awaits each reduction before ApplyGradients, as a backend whose work is done when its calls
  // return needs. A backend whose execution context orders ApplyGradients' work after the
  // collectives on the device (a CUDA stream) returns more.
  virtual int max_steps_in_flight() const { return 0; }
  // How many times a captured CUDA graph was replayed instead of launching the work one kernel
  // at a time (the pass's and the update's together); 0 for a backend without graphs.
  virtual int64_t graph_replays() const { return 0; }

  // From now on ComputeGradients writes every gradient into one flat buffer laid out as
  // `layout` (this device's memory), and ApplyGradients reads it from there. Returns the buffer.
  virtual absl::StatusOr<float*> BindGradients(const FlatLayout& layout) = 0;

  // Whom ComputeGradients tells that [offset, offset + size) of the gradient buffer holds its
  // final values, as soon as it does, while the backward pass goes on: the step loop starts
  // reducing the buckets that range completes (overlap). A backend that never calls it is still
  // right: the loop reduces what was not announced after ComputeGradients returns.
  using GradientsReady = std::function<void(int64_t offset, int64_t size)>;
  virtual void SetGradientsReady(GradientsReady ready) { (void)ready; }

  // Takes the next training batch: false after the last one. Errors: the input pipeline's.
  virtual absl::StatusOr<bool> NextBatch() = 0;
  // Loss and gradients of the current batch into the gradient buffer; the batch's loss sum,
  // correct predictions and size are added to the metric sums.
  virtual absl::Status ComputeGradients() = 0;
  // One optimizer update of the parameters from the gradient buffer.
  virtual absl::Status ApplyGradients() = 0;

  // A backend that reduces and applies the gradients its own way (gradient_reducer.h) returns
  // its reducer here, having bound the gradient buffer itself; null (the default): the loop
  // chooses its own and binds the buffer as setup.layout. The CPU backend brings its sharded
  // update (sharded_update.h) when given a ShardedUpdateGroup. Errors: the reducer's (the loop
  // stops before the first step).
  virtual absl::StatusOr<std::unique_ptr<GradientReducer>> OwnGradientReducer(
      const GradientReducerSetup& setup) {
    (void)setup;
    return nullptr;
  }

  // The metric sums since the last call (waiting for the device), then zero.
  virtual absl::StatusOr<EvalResult> TakeMetrics() = 0;

  // Starts `phase` in the device's order (it ends the previous one). TakePhaseSeconds returns
  // the seconds spent in each phase since its last call (waiting for the device) and restarts.
  virtual void MarkPhase(Phase phase) = 0;
  virtual absl::StatusOr<PhaseSeconds> TakePhaseSeconds() = 0;

  // Loss sum, correct predictions and count over rows [begin, end) of `data` with the current
  // parameters.
  virtual absl::StatusOr<EvalResult> Evaluate(const Dataset& data, int64_t begin,
                                              int64_t end) = 0;
  // The parameters (this device's blocks) in host memory.
  virtual absl::StatusOr<TensorTree> Parameters() = 0;

  // The device's training state copied to host memory, for a checkpoint: its block of each
  // parameter as "params/<name>" and of each optimizer slot as "optimizer/<name>/<slot>", in
  // the parameter's local shape. Errors: UNIMPLEMENTED on a backend that cannot save its state.
  virtual absl::StatusOr<TensorTree> SaveState() {
    return absl::UnimplementedError(kNoCheckpoints);
  }
  // Replaces the training state with `state` (named and shaped as SaveState returns it) as it
  // was after `step` steps. Errors: INVALID_ARGUMENT naming an array that is missing, unknown or
  // of another shape (nothing changes then); UNIMPLEMENTED as SaveState.
  virtual absl::Status RestoreState(const TensorTree& state, int64_t step) {
    (void)state;
    (void)step;
    return absl::UnimplementedError(kNoCheckpoints);
  }

 private:
  static constexpr const char* kNoCheckpoints =
      "spec.checkpoint: this backend cannot save or restore its state yet (checkpoints run on "
      "CPU devices); remove the checkpoint section or run the job on CPU workers";
};

// How SaveState names the arrays of a device's state.
inline constexpr absl::string_view kParamsPrefix = "params/";
inline constexpr absl::string_view kOptimizerPrefix = "optimizer/";

// Phase timing on the host clock, for backends whose work is done when their calls return.
class HostPhaseClock {
 public:
  void Mark(Phase phase) {
    const absl::Time now = absl::Now();
    seconds_[static_cast<int>(current_)] += absl::ToDoubleSeconds(now - since_);
    current_ = phase;
    since_ = now;
  }
  PhaseSeconds Take() {
    Mark(current_);
    PhaseSeconds out = seconds_;
    seconds_ = {};
    return out;
  }

 private:
  Phase current_ = Phase::kCompute;
  absl::Time since_ = absl::Now();
  PhaseSeconds seconds_ = {};
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_DEVICE_BACKEND_H_
