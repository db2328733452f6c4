// cnn_gradient_check: checks the hand-written backward pass of the example CNN (cnn.h).
//  1. In double precision, every analytic gradient against a central difference of the loss.
//  2. The float computation the program trains with (CnnLossAndGrads) against the double one.
// Small network, a few random images; exits 1 on a mismatch, naming the parameter and element.
//
//   ./cnn_gradient_check
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cnn.h"
#include "substrax/tensor.h"

namespace {

using cnn_example::CnnConfig;
using cnn_example::ParamsF64;

// A deterministic generator for the test's inputs (values in [0, 1)).
class Uniform {
 public:
  explicit Uniform(uint64_t seed) : state_(seed) {}
  double Next() {
    uint64_t x = (state_ += 0x9e3779b97f4a7c15ULL);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return static_cast<double>((x ^ (x >> 31)) >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t state_;
};

absl::Status Check() {
  CnnConfig config;
  config.conv1_channels = 3;
  config.conv2_channels = 4;
  config.hidden_units = 6;
  config.num_classes = 5;
  constexpr int64_t kBatch = 4;

  Uniform uniform(7);
  substrax::Batch batch;
  batch.inputs = substrax::Tensor({kBatch, cnn_example::kImagePixels});
  batch.targets = substrax::Tensor({kBatch});
  for (int64_t i = 0; i < batch.inputs.size(); ++i) {
    batch.inputs.data()[i] = static_cast<float>(uniform.Next());
  }
  for (int64_t i = 0; i < kBatch; ++i) batch.targets.data()[i] = static_cast<float>(i % 5);

  absl::StatusOr<substrax::TensorTree> params = cnn_example::InitCnnParams(config, 3);
  if (!params.ok()) return params.status();
  // Non-zero biases, so that their paths are exercised too.
  for (auto& [name, tensor] : *params) {
    if (name.find("/bias") == std::string::npos) continue;
    for (int64_t i = 0; i < tensor.size(); ++i) {
      tensor.data()[i] = static_cast<float>(0.2 * uniform.Next() - 0.1);
    }
  }
  ParamsF64 params64;
  for (const auto& [name, tensor] : *params) {
    params64[name].assign(tensor.data(), tensor.data() + tensor.size());
  }

  // 1. Analytic against numeric, in double.
  ParamsF64 grads64;
  absl::StatusOr<double> loss = cnn_example::CnnLossAndGradsF64(config, params64, batch, &grads64);
  if (!loss.ok()) return loss.status();
  constexpr double kStep = 1e-6;
  double worst = 0;
  int checked = 0;
  for (auto& [name, values] : params64) {
    for (size_t i = 0; i < values.size(); ++i) {
      const double saved = values[i];
      ParamsF64 unused;
      values[i] = saved + kStep;
      absl::StatusOr<double> plus = cnn_example::CnnLossAndGradsF64(config, params64, batch, &unused);
      values[i] = saved - kStep;
      absl::StatusOr<double> minus =
          cnn_example::CnnLossAndGradsF64(config, params64, batch, &unused);
      values[i] = saved;
      if (!plus.ok()) return plus.status();
      if (!minus.ok()) return minus.status();
      const double numeric = (*plus - *minus) / (2 * kStep);
      const double analytic = grads64.at(name)[i];
      const double error = std::abs(numeric - analytic) /
                           std::max({std::abs(numeric), std::abs(analytic), 1e-4});
      worst = std::max(worst, error);
      ++checked;
      if (error > 1e-4) {
        return absl::InternalError(absl::StrCat("gradient of ", name, "[", i, "]: analytic ",
                                                analytic, ", numeric ", numeric,
                                                " (relative error ", error, ")"));
      }
    }
  }
  std::printf("double: %d gradients match central differences (worst relative error %.2e), "
              "loss %.6f\n",
              checked, worst, *loss);

  // 2. The float path against the double one.
  absl::StatusOr<substrax::LossAndGrads> result =
      cnn_example::CnnLossAndGrads(config, *params, batch);
  if (!result.ok()) return result.status();
  if (std::abs(result->loss - *loss) > 1e-5 * std::max(1.0, std::abs(*loss))) {
    return absl::InternalError(
        absl::StrCat("float loss ", result->loss, " differs from double loss ", *loss));
  }
  double worst_float = 0;
  for (const auto& [name, tensor] : result->grads) {
    const std::vector<double>& reference = grads64.at(name);
    double scale = 0;
    for (double v : reference) scale = std::max(scale, std::abs(v));
    for (int64_t i = 0; i < tensor.size(); ++i) {
      const double error = std::abs(tensor.data()[i] - reference[i]) / std::max(scale, 1e-6);
      worst_float = std::max(worst_float, error);
      if (error > 1e-4) {
        return absl::InternalError(absl::StrCat("float gradient of ", name, "[", i, "] is ",
                                                tensor.data()[i], ", double gives ",
                                                reference[i]));
      }
    }
  }
  std::printf("float: gradients match double (worst normwise error %.2e)\n", worst_float);
  return absl::OkStatus();
}

}  // namespace

int main() {
  const absl::Status status = Check();
  if (!status.ok()) {
    std::fprintf(stderr, "cnn_gradient_check: FAILED: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("cnn_gradient_check: OK\n");
  return 0;
}
