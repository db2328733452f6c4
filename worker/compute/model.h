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
// A Model is immutable after Create: its const methods may be called from several threads at
// once.
#ifndef SUBSTRAX_WORKER_COMPUTE_MODEL_H_
#define SUBSTRAX_WORKER_COMPUTE_MODEL_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model_catalog.h"
#include "substrax/v1/job.pb.h"
#include "worker/tensor/tensor.h"

namespace substrax {

struct LossAndGrads {
  // Mean over the batch.
  double loss = 0;
  // Fraction of the batch classified correctly (classification); 0 for regression.
  double accuracy = 0;
  // Same names and shapes as the parameters.
  TensorTree grads;
};

// Sums, so results of several shards add up.
struct EvalResult {
  double loss_sum = 0;  // sum over examples of the per-example loss
  int64_t correct = 0;  // classification only
  int64_t count = 0;
};

class Model {
 public:
  // The model `spec` describes, for inputs of `num_features` values.
  // Errors: INVALID_ARGUMENT (unknown type, bad sizes; from ModelParams, naming the field).
  static absl::StatusOr<std::unique_ptr<Model>> Create(const v1::ModelSpec& spec,
                                                       int64_t num_features);

  virtual ~Model() = default;

  // softmax_regression and mlp predict classes; linear predicts values.
  bool is_classification() const { return classification_; }
  // The parameters, as core ModelParams gives them, in layer order.
  const std::vector<ParamSpec>& params() const { return params_; }
  // Fresh parameters: InitParams(seed, params()).
  TensorTree Init(uint64_t seed) const;

  // Mean loss of `batch`, the fraction classified correctly, and the gradient of the loss with
  // respect to every parameter.
  // Errors: INVALID_ARGUMENT naming the parameter (missing, unexpected, wrong shape) or batch
  // field (batch.inputs, batch.targets) that has the wrong shape, a label outside
  // [0, num_classes), or an empty batch.
  virtual absl::StatusOr<LossAndGrads> LossAndGradients(const TensorTree& params,
                                                        const Batch& batch) const = 0;

  // Per-example losses and correct predictions of `batch`, summed; an empty batch gives zeros.
  // Errors: as LossAndGradients, except that an empty batch is fine.
  virtual absl::StatusOr<EvalResult> Evaluate(const TensorTree& params,
                                              const Batch& batch) const = 0;

 protected:
  Model(std::vector<ParamSpec> params, bool classification)
      : params_(std::move(params)), classification_(classification) {}

 private:
  std::vector<ParamSpec> params_;
  bool classification_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COMPUTE_MODEL_H_
