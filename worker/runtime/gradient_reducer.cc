#include "worker/runtime/gradient_reducer.h"

#include <utility>

#include "core/status.h"
#include "worker/runtime/device_backend.h"
#include "worker/runtime/overlapped_reduction.h"

namespace substrax {

absl::Status GradientReducer::Apply(DeviceBackend& backend, int64_t step) {
  (void)step;
  return backend.ApplyGradients();
}

namespace {

// "flat" and "explicit": after the backward pass, each plan in turn (the shardings' one plan over
// every axis, or one plan per axis name), every bucket of an axis as one group.
class PlannedReducer final : public GradientReducer {
 public:
  PlannedReducer(const char* kind, const char* what, MeshCommunicators& comms,
                 std::vector<GradientPlan> plans, float* grads, int64_t bucket_bytes,
                 ExecutionContext context)
      : kind_(kind),
        what_(what),
        comms_(comms),
        plans_(std::move(plans)),
        grads_(grads),
        bucket_bytes_(bucket_bytes),
        context_(context) {}

  const char* kind() const override { return kind_; }
  const char* what() const override { return what_; }
  absl::Status Reduce(std::vector<CollectiveEvent>* in_flight) override {
    for (const GradientPlan& plan : plans_) {
      SUBSTRAX_RETURN_IF_ERROR(ReduceFlat(comms_, plan, grads_, ReduceOp::kMean, bucket_bytes_,
                                          context_, what_, &stats_, in_flight));
    }
    return absl::OkStatus();
  }
  int64_t collectives() const override { return stats_.collectives; }

 private:
  const char* const kind_;
  const char* const what_;
  MeshCommunicators& comms_;
  const std::vector<GradientPlan> plans_;
  float* const grads_;
  const int64_t bucket_bytes_;
  const ExecutionContext context_;
  BucketStats stats_;
};

// "overlapped": the backend announces each gradient as the backward pass completes it; buckets
// start on the reduction's thread meanwhile, and Reduce waits for what is left.
class OverlappedReducer final : public GradientReducer {
 public:
  OverlappedReducer(DeviceBackend& backend, std::unique_ptr<OverlappedReduction> reduction)
      : backend_(backend), reduction_(std::move(reduction)) {
    backend_.SetGradientsReady([r = reduction_.get()](int64_t offset, int64_t size) {
      r->Ready(offset, size);
    });
  }
  // The backend must not call into the reduction after it is gone.
  ~OverlappedReducer() override { backend_.SetGradientsReady(nullptr); }

  const char* kind() const override { return "overlapped"; }
  void BeginStep() override { reduction_->Begin(); }
  absl::Status Reduce(std::vector<CollectiveEvent>*) override { return reduction_->Finish(); }
  int64_t collectives() const override { return reduction_->collectives(); }

 private:
  DeviceBackend& backend_;
  const std::unique_ptr<OverlappedReduction> reduction_;
};

}  // namespace

std::unique_ptr<GradientReducer> MakeFlatReducer(MeshCommunicators& comms, GradientPlan plan,
                                                 float* grads, int64_t bucket_bytes,
                                                 ExecutionContext context) {
  std::vector<GradientPlan> plans;
  plans.push_back(std::move(plan));
  return std::make_unique<PlannedReducer>("flat", "gradient reduction", comms, std::move(plans),
                                          grads, bucket_bytes, context);
}

std::unique_ptr<GradientReducer> MakeExplicitReducer(MeshCommunicators& comms,
                                                     std::vector<GradientPlan> plans,
                                                     float* grads, int64_t bucket_bytes,
                                                     ExecutionContext context) {
  return std::make_unique<PlannedReducer>("explicit", "reduce_mean_collective", comms,
                                          std::move(plans), grads, bucket_bytes, context);
}

absl::StatusOr<std::unique_ptr<GradientReducer>> MakeOverlappedReducer(
    DeviceBackend& backend, MeshCommunicators& comms, const GradientPlan& plan, float* grads,
    int64_t bucket_bytes) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<OverlappedReduction> reduction,
                            OverlappedReduction::Create(comms, plan, grads, ReduceOp::kMean,
                                                        bucket_bytes, "gradient reduction"));
  return std::unique_ptr<GradientReducer>(
      std::make_unique<OverlappedReducer>(backend, std::move(reduction)));
}

}  // namespace substrax
