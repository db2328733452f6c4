// A small convolutional network for 28x28 grey images (Fashion-MNIST): the program's own model,
// not one built into substrax. Forward and backward are written by hand with Eigen
// (im2col + matrix products).
//
//   input [28, 28, 1], standardized: (x - input_mean) / input_std
//   conv1 5x5 valid, 1 -> c1 channels, ReLU, 2x2 max-pool   -> [12, 12, c1]
//   conv2 5x5 valid, c1 -> c2 channels, ReLU, 2x2 max-pool  -> [4, 4, c2]
//   dense1 4*4*c2 -> hidden_units, ReLU
//   dense2 hidden_units -> num_classes, softmax cross-entropy
//
// Parameters (a substrax::TensorTree; kernels in HWIO order as flax's nnx.Conv keeps them):
//   conv1/kernel [5, 5, 1, c1]    conv1/bias [c1]
//   conv2/kernel [5, 5, c1, c2]   conv2/bias [c2]
//   dense1/kernel [16*c2, units]  dense1/bias [units]
//   dense2/kernel [units, classes] dense2/bias [classes]
// Activations are laid out height, width, channel (channel fastest).
//
// Batches (substrax::Batch): inputs [batch, 784] pixels in [0, 1], row-major 28x28; targets
// [batch] class ids as floats.
//
// Thread-safety: pure functions; call them from any number of threads at once.
#ifndef SUBSTRAX_EXAMPLES_SDK_CNN_H_
#define SUBSTRAX_EXAMPLES_SDK_CNN_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "substrax/tensor.h"

namespace cnn_example {

struct CnnConfig {
  int conv1_channels = 16;
  int conv2_channels = 32;
  int hidden_units = 128;
  int num_classes = 10;
  // The network standardizes its input pixels first: (x - input_mean) / input_std. The defaults
  // are the mean and standard deviation of the Fashion-MNIST training pixels scaled to [0, 1].
  double input_mean = 0.2860;
  double input_std = 0.3530;
};

inline constexpr int kImageSide = 28;
inline constexpr int kImagePixels = kImageSide * kImageSide;

// Parameters for `config`, drawn from `seed` the same way on every machine (a counter-based
// generator, not std::*_distribution, whose results differ between standard libraries): conv
// kernels and dense1 He-uniform, dense2 Glorot-uniform, biases zero.
// Errors: INVALID_ARGUMENT for a channel or class count < 1.
absl::StatusOr<substrax::TensorTree> InitCnnParams(const CnnConfig& config, uint64_t seed);

// The mean softmax cross-entropy over `batch`, its gradients (same names and shapes as
// `params`) and the batch's accuracy: the program's LossAndGradsFn.
// Errors: INVALID_ARGUMENT naming what does not fit (a missing parameter or a wrong shape, an
// input that is not [batch, 784], a label outside [0, num_classes)).
absl::StatusOr<substrax::LossAndGrads> CnnLossAndGrads(const CnnConfig& config,
                                                       const substrax::TensorTree& params,
                                                       const substrax::Batch& batch);

// Loss and accuracy sums of `batch` (forward only). Errors: as CnnLossAndGrads.
absl::StatusOr<substrax::EvalResult> CnnEvaluate(const CnnConfig& config,
                                                 const substrax::TensorTree& params,
                                                 const substrax::Batch& batch);

// The same computation in double precision on plain vectors (parameters by the names above,
// row-major), for cnn_gradient_check: returns the mean loss and fills `grads`.
// Errors: as CnnLossAndGrads.
using ParamsF64 = std::map<std::string, std::vector<double>>;
absl::StatusOr<double> CnnLossAndGradsF64(const CnnConfig& config, const ParamsF64& params,
                                          const substrax::Batch& batch, ParamsF64* grads);

}  // namespace cnn_example

#endif  // SUBSTRAX_EXAMPLES_SDK_CNN_H_
