// GradientReducer: how the step loop turns a step's gradients (the flat buffer ComputeGradients
// wrote) into the optimizer update. The loop chooses one before its first step and calls it the
// same way on every step:
//   BeginStep(); <ComputeGradients>; Reduce(); Apply(step)
// The loop's own reducers (step_loop.cc chooses among them):
//   - "flat": the reduction the shardings imply, per mesh axis in buckets, after the backward
//     pass (ReduceFlat), on the backend's execution context;
//   - "explicit": the guide's pmap path, the collectives called per axis name;
//   - "overlapped": the buckets reduced during the backward pass (overlapped_reduction.h);
// and a backend may bring its own (DeviceBackend::OwnGradientReducer): the CPU backend's sharded
// update (sharded_update.h). Used by one device thread.
#ifndef SUBSTRAX_WORKER_RUNTIME_GRADIENT_REDUCER_H_
#define SUBSTRAX_WORKER_RUNTIME_GRADIENT_REDUCER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/mesh.h"
#include "worker/collectives/communicator.h"
#include "worker/collectives/mesh_communicators.h"
#include "substrax/spmd.h"
#include "worker/runtime/gradient_buckets.h"

namespace substrax {

class DeviceBackend;

class GradientReducer {
 public:
  virtual ~GradientReducer() = default;

  // Which reducer this is ("flat", "explicit", "overlapped", "sharded update"): for
  // StepLoopStats and logs.
  virtual const char* kind() const = 0;
  // What its collectives' errors are annotated with ("gradient reduction").
  virtual const char* what() const { return "gradient reduction"; }
  // Before the step's backward pass.
  virtual void BeginStep() {}
  // Reduces the step's gradients in the buffer. `in_flight` non-null (an asynchronous backend,
  // DeviceBackend::max_steps_in_flight() > 0): the reducer may leave its collectives' handles
  // there instead of waiting for them; the loop awaits them later. Errors: the collectives'.
  virtual absl::Status Reduce(std::vector<CollectiveEvent>* in_flight) = 0;
  // Step `step`'s update (1 for the first) from the reduced buffer. The default: the backend's
  // ApplyGradients. Errors: the backend's.
  virtual absl::Status Apply(DeviceBackend& backend, int64_t step);
  // The gradient collectives (all-reduces of buckets, reduce-scatters) issued so far.
  virtual int64_t collectives() const = 0;
};

// What a backend's own reducer is built from (DeviceBackend::OwnGradientReducer).
struct GradientReducerSetup {
  // The device's mesh and connected communicators.
  const Mesh* mesh = nullptr;
  MeshCommunicators* comms = nullptr;
  // The loop's layout of the gradient buffer; the backend's reducer binds the buffer itself
  // (DeviceBackend::BindGradients, which it may pad).
  FlatLayout layout;
  // The guide's pmap path was asked for (StepLoopOptions::explicit_collectives).
  bool explicit_collectives = false;
  // The buckets' size (StepLoopOptions::gradients).
  GradientReductionOptions gradients;
};

// The loop's reducers over a buffer bound to `grads`, in buckets of at most `bucket_bytes`.
// "flat": `plan` (the shardings' reduction) on `context`.
std::unique_ptr<GradientReducer> MakeFlatReducer(MeshCommunicators& comms, GradientPlan plan,
                                                 float* grads, int64_t bucket_bytes,
                                                 ExecutionContext context);
// "explicit": each axis's plan in turn, as the guide's ReduceMeanCollective per axis name.
std::unique_ptr<GradientReducer> MakeExplicitReducer(MeshCommunicators& comms,
                                                     std::vector<GradientPlan> plans,
                                                     float* grads, int64_t bucket_bytes,
                                                     ExecutionContext context);
// "overlapped": `plan` reduced as the backward pass announces each gradient (the backend's
// SetGradientsReady is bound until the reducer is destroyed). For backends whose collectives run
// on the calling thread. Errors: those of OverlappedReduction::Create.
absl::StatusOr<std::unique_ptr<GradientReducer>> MakeOverlappedReducer(
    DeviceBackend& backend, MeshCommunicators& comms, const GradientPlan& plan, float* grads,
    int64_t bucket_bytes);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_RUNTIME_GRADIENT_REDUCER_H_
