// The built-in models on the CPU: forward pass, loss, and analytic gradients.
//
// Every model is a stack of dense layers (core/model_catalog.h gives the names and shapes:
// "dense_i/kernel" [in, out], "dense_i/bias" [out]; a layer computes x·W + b):
//   - linear: one layer; loss = mean over batch × outputs of (y - t)^2; targets [B, outputs].
//   - softmax_regression: one layer; softmax cross-entropy, mean over the batch; targets [B]
//     holding class ids as floats.
//   - mlp: dense → ReLU → … → dense (logits); softmax cross-entropy as above.
// The loss is a mean over the batch, so the mean of the gradients of equal-sized shards equals
// the gradient of the whole batch: data parallelism averages per-device gradients.
//
// Math in float32 through Eigen; losses are accumulated in double.
//
// Tensor parallelism (an mlp over a "model" mesh axis of size m > 1, Megatron-LM style, with the
// layouts of core/model_catalog.h): each device holds its shards of the split parameters and
// whole copies of the replicated ones. Layer pairs (0, 1), (2, 3), ...: the first is
// column-parallel (this device computes its out/m output columns; ReLU stays local), the second
// row-parallel (its partial outputs are summed over the model axis, then the replicated bias is
// added); a last unpaired layer is replicated. One all-reduce per pair forward, one backward (the
// column layer's partial input gradient), none backward for the first pair, whose input needs no
// gradient. The logits are therefore complete and identical on every device of the model axis,
// and so are the loss, accuracy and EvalResult. All devices of the model axis must pass the same
// batch and make the same calls in the same order; the all-reduce is a callback, so that this
// layer does not know worker/collectives.
//
// A Model is immutable after Create. Without tensor parallelism its const methods may be called
// from several threads at once; with it, one device's calls must not overlap (their all-reduces
// would interleave).
#ifndef SUBSTRAX_WORKER_COMPUTE_MODEL_H_
#define SUBSTRAX_WORKER_COMPUTE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/model_catalog.h"
#include "substrax/v1/job.pb.h"
#include "worker/tensor/tensor.h"

namespace substrax {

// How this device takes part in tensor parallelism.
struct TensorParallelism {
  // Devices on the model axis (1: no tensor parallelism).
  int64_t axis_size = 1;
  // This device's coordinate on it, in [0, axis_size).
  int64_t index = 0;
  // Sums `values` in place over the devices of the model axis (all of them call it in the same
  // order, with the same sizes). Required when axis_size > 1. Its errors pass through unchanged;
  // it must not hang forever when a peer never calls (the collective layer's timeout).
  std::function<absl::Status(absl::Span<float>)> all_reduce_sum;
};

class Model {
 public:
  // The model `spec` describes, for inputs of `num_features` values, on a device that takes part
  // in tensor parallelism as `tp` says.
  // Errors: INVALID_ARGUMENT (unknown type, bad sizes, a hidden width that does not divide by
  // tp.axis_size: from ModelParams, naming the field; tp.axis_size < 1, or > 1 for a model other
  // than an mlp; tp.index outside [0, tp.axis_size); no tp.all_reduce_sum when axis_size > 1).
  static absl::StatusOr<std::unique_ptr<Model>> Create(const v1::ModelSpec& spec,
                                                       int64_t num_features,
                                                       TensorParallelism tp = {});

  virtual ~Model() = default;

  // softmax_regression and mlp predict classes; linear predicts values.
  bool is_classification() const { return classification_; }
  // The parameters, as core ModelParams(spec, num_features, tp.axis_size) gives them (global
  // shapes and partition specs), in layer order.
  const std::vector<ParamSpec>& params() const { return params_; }
  const TensorParallelism& tensor_parallelism() const { return tp_; }
  // The block of parameter `p` (one of params()) this device holds: [start, limit) per
  // dimension; block tp.index along a dimension split over the model axis, whole elsewhere.
  std::vector<std::pair<int64_t, int64_t>> LocalBlock(const ParamSpec& p) const;
  // The shape of that block (the global shape without tensor parallelism).
  std::vector<int64_t> LocalShape(const ParamSpec& p) const;
  // Fresh parameters, this device's shards: InitParamSlice(seed, p, LocalBlock(p)) for every p,
  // so each equals the same block of the single-device initialisation.
  TensorTree Init(uint64_t seed) const;

  // Mean loss of `batch`, the fraction classified correctly, and the gradient of the loss with
  // respect to every parameter. `params` and the gradients are this device's shards (shapes
  // LocalShape); a replicated parameter's gradient is the whole gradient, the same on every
  // device of the model axis.
  // Errors: INVALID_ARGUMENT naming the parameter (missing, unexpected, wrong local shape) or
  // batch field (batch.inputs, batch.targets) that has the wrong shape, a label outside
  // [0, num_classes), or an empty batch; any error of tp.all_reduce_sum. A device that fails
  // before an all-reduce leaves its peers waiting in theirs, until the collective times out.
  absl::StatusOr<LossAndGrads> LossAndGradients(const TensorTree& params,
                                                const Batch& batch) const;

  // Where a backward pass puts each parameter's gradient, and whom it tells.
  struct GradientSink {
    // The buffer for the gradient of params()[i]: LocalShape of it, row-major. Buffers should
    // start on kKernelAlignment (aligned_floats.h) for results that repeat bit for bit.
    std::function<float*(size_t i)> buffer;
    // Called as soon as the gradient of params()[i] is complete (layer by layer, the last layer
    // first), while the pass goes on: the step loop starts reducing it then. May be null.
    std::function<void(size_t i)> done;
  };
  // As LossAndGradients, but every gradient goes into `sink` (the result's grads stay empty).
  virtual absl::StatusOr<LossAndGrads> LossAndGradientsInto(const TensorTree& params,
                                                            const Batch& batch,
                                                            const GradientSink& sink) const = 0;

  // Per-example losses and correct predictions of `batch`, summed; an empty batch gives zeros.
  // Errors: as LossAndGradients, except that an empty batch is fine.
  virtual absl::StatusOr<EvalResult> Evaluate(const TensorTree& params,
                                              const Batch& batch) const = 0;

 protected:
  Model(std::vector<ParamSpec> params, bool classification, TensorParallelism tp)
      : params_(std::move(params)), classification_(classification), tp_(std::move(tp)) {}

 private:
  std::vector<ParamSpec> params_;
  bool classification_;
  TensorParallelism tp_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMPUTE_MODEL_H_
