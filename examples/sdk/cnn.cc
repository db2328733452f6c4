#include "cnn.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cnn_example {
namespace {

using substrax::Batch;
using substrax::EvalResult;
using substrax::LossAndGrads;
using substrax::Tensor;
using substrax::TensorTree;

constexpr int kKernel = 5;
constexpr int kConv1Side = kImageSide - kKernel + 1;  // 24
constexpr int kPool1Side = kConv1Side / 2;            // 12
constexpr int kConv2Side = kPool1Side - kKernel + 1;  // 8
constexpr int kPool2Side = kConv2Side / 2;            // 4
constexpr int kTaps = kKernel * kKernel;              // 25

template <typename T>
using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename T>
using ConstMap = Eigen::Map<const Mat<T>>;
template <typename T>
using MutMap = Eigen::Map<Mat<T>>;
template <typename T>
using ConstRowMap = Eigen::Map<const Eigen::Matrix<T, 1, Eigen::Dynamic>>;
template <typename T>
using RowMap = Eigen::Map<Eigen::Matrix<T, 1, Eigen::Dynamic>>;

// The parameters' names and shapes, in TensorTree (sorted) order.
std::vector<std::pair<std::string, std::vector<int64_t>>> ParamShapes(const CnnConfig& c) {
  return {
      {"conv1/bias", {c.conv1_channels}},
      {"conv1/kernel", {kKernel, kKernel, 1, c.conv1_channels}},
      {"conv2/bias", {c.conv2_channels}},
      {"conv2/kernel", {kKernel, kKernel, c.conv1_channels, c.conv2_channels}},
      {"dense1/bias", {c.hidden_units}},
      {"dense1/kernel", {kPool2Side * kPool2Side * c.conv2_channels, c.hidden_units}},
      {"dense2/bias", {c.num_classes}},
      {"dense2/kernel", {c.hidden_units, c.num_classes}},
  };
}

absl::Status CheckConfig(const CnnConfig& c) {
  if (!(c.input_std > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("cnn: input_std must be > 0, got ", c.input_std));
  }
  if (c.conv1_channels < 1 || c.conv2_channels < 1 || c.hidden_units < 1 || c.num_classes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cnn: channel, unit and class counts must be >= 1, got conv1_channels=",
        c.conv1_channels, " conv2_channels=", c.conv2_channels, " hidden_units=", c.hidden_units,
        " num_classes=", c.num_classes));
  }
  return absl::OkStatus();
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

constexpr int kNumParams = 8;

// Pointers to the parameter arrays (or their gradients), in ParamShapes order.
template <typename P>
struct Params {
  P conv1_b, conv1_w, conv2_b, conv2_w, dense1_b, dense1_w, dense2_b, dense2_w;
};
template <typename P>
Params<P> FromArray(P* ptrs) {
  return {ptrs[0], ptrs[1], ptrs[2], ptrs[3], ptrs[4], ptrs[5], ptrs[6], ptrs[7]};
}

absl::Status CheckBatch(const CnnConfig& c, const Batch& batch) {
  const Tensor& x = batch.inputs;
  const Tensor& y = batch.targets;
  if (x.rank() != 2 || x.dim(1) != kImagePixels) {
    return absl::InvalidArgumentError(absl::StrCat("cnn: inputs must be [batch, ", kImagePixels,
                                                   "], got ", x.ShapeString()));
  }
  if (y.rank() != 1 || y.dim(0) != x.dim(0)) {
    return absl::InvalidArgumentError(absl::StrCat("cnn: targets must be [", x.dim(0),
                                                   "] class ids, got ", y.ShapeString()));
  }
  if (x.dim(0) < 1) return absl::InvalidArgumentError("cnn: empty batch");
  for (int64_t i = 0; i < y.size(); ++i) {
    const float label = y.data()[i];
    if (!(label >= 0) || label >= c.num_classes || label != std::floor(label)) {
      return absl::InvalidArgumentError(absl::StrCat("cnn: target ", i, " is ", label,
                                                     ", not a class id in [0, ",
                                                     c.num_classes, ")"));
    }
  }
  return absl::OkStatus();
}

// Max-pools `act` ([n * side * side, channels], rows (b, y, x)) by 2x2 into `pooled`
// ([n * (side/2)^2, channels]); `argmax` gets, per pooled element, the row of `act` it came from.
template <typename T>
void MaxPool2x2(const Mat<T>& act, int64_t n, int side, Mat<T>* pooled,
                std::vector<int32_t>* argmax) {
  const int half = side / 2;
  const int64_t channels = act.cols();
  pooled->resize(n * half * half, channels);
  argmax->resize(static_cast<size_t>(n * half * half * channels));
  for (int64_t b = 0; b < n; ++b) {
    for (int py = 0; py < half; ++py) {
      for (int px = 0; px < half; ++px) {
        const int64_t out_row = (b * half + py) * half + px;
        const int64_t r00 = (b * side + 2 * py) * side + 2 * px;
        const int64_t rows[4] = {r00, r00 + 1, r00 + side, r00 + side + 1};
        for (int64_t ch = 0; ch < channels; ++ch) {
          int64_t best = rows[0];
          T best_value = act(rows[0], ch);
          for (int k = 1; k < 4; ++k) {
            if (act(rows[k], ch) > best_value) {
              best_value = act(rows[k], ch);
              best = rows[k];
            }
          }
          (*pooled)(out_row, ch) = best_value;
          (*argmax)[out_row * channels + ch] = static_cast<int32_t>(best);
        }
      }
    }
  }
}

// The gradient through ReLU then max-pool: d(pooled) routed to the winning element when it was
// positive (ReLU active), zero elsewhere.
template <typename T>
void MaxPoolReluBackward(const Mat<T>& pooled, const T* d_pooled,
                         const std::vector<int32_t>& argmax, Mat<T>* d_act) {
  d_act->setZero();
  const int64_t channels = pooled.cols();
  for (int64_t r = 0; r < pooled.rows(); ++r) {
    for (int64_t ch = 0; ch < channels; ++ch) {
      if (pooled(r, ch) > T(0)) {
        (*d_act)(argmax[r * channels + ch], ch) += d_pooled[r * channels + ch];
      }
    }
  }
}

// Scratch matrices of one computation, kept per thread between calls: a training step
// allocates nothing once the first step has sized them.
template <typename T>
struct Workspace {
  Mat<T> patches1, act1, pool1, patches2, act2, pool2, hidden, logits;
  Mat<T> d_hidden, d_flat, d_act2, d_patches2, d_pool1, d_act1;
  std::vector<int32_t> arg1, arg2;
};

// The sizes of one computation on `n` images.
struct Dims {
  Dims(const CnnConfig& c, int64_t n)
      : n(n),
        c1(c.conv1_channels),
        c2(c.conv2_channels),
        units(c.hidden_units),
        classes(c.num_classes),
        rows1(n * kConv1Side * kConv1Side),
        rows2(n * kConv2Side * kConv2Side),
        flat_size(int64_t{kPool2Side} * kPool2Side * c.conv2_channels) {}

  int64_t n;
  int c1, c2, units, classes;
  int64_t rows1;      // conv1 output positions
  int64_t rows2;      // conv2 output positions
  int64_t flat_size;  // dense1 inputs
};

// conv1's im2col: one row of kTaps standardized pixels per output position (b, y, x).
template <typename T>
void ImagePatches(const float* images, int64_t n, T mean, T inv_std, Mat<T>* patches) {
  patches->resize(n * kConv1Side * kConv1Side, kTaps);
  for (int64_t b = 0; b < n; ++b) {
    const float* image = images + b * kImagePixels;
    for (int oy = 0; oy < kConv1Side; ++oy) {
      for (int ox = 0; ox < kConv1Side; ++ox) {
        T* row = patches->row((b * kConv1Side + oy) * kConv1Side + ox).data();
        for (int ky = 0; ky < kKernel; ++ky) {
          const float* src = image + (oy + ky) * kImageSide + ox;
          for (int kx = 0; kx < kKernel; ++kx) {
            row[ky * kKernel + kx] = (static_cast<T>(src[kx]) - mean) * inv_std;
          }
        }
      }
    }
  }
}

// conv2's im2col: one row of kTaps * c1 pool1 values per output position (b, y, x).
template <typename T>
void PooledPatches(const Mat<T>& pool1, int64_t n, int c1, Mat<T>* patches) {
  patches->resize(n * kConv2Side * kConv2Side, kTaps * c1);
  for (int64_t b = 0; b < n; ++b) {
    for (int oy = 0; oy < kConv2Side; ++oy) {
      for (int ox = 0; ox < kConv2Side; ++ox) {
        T* row = patches->row((b * kConv2Side + oy) * kConv2Side + ox).data();
        for (int ky = 0; ky < kKernel; ++ky) {
          for (int kx = 0; kx < kKernel; ++kx) {
            const T* src = pool1.row((b * kPool1Side + oy + ky) * kPool1Side + ox + kx).data();
            std::copy(src, src + c1, row + (ky * kKernel + kx) * c1);
          }
        }
      }
    }
  }
}

// col2im, PooledPatches backward: every patch entry adds back to the pool1 element it was
// copied from.
template <typename T>
void PooledPatchesBackward(const Mat<T>& d_patches, int64_t n, int c1, Mat<T>* d_pool1) {
  d_pool1->setZero(n * kPool1Side * kPool1Side, c1);
  for (int64_t b = 0; b < n; ++b) {
    for (int oy = 0; oy < kConv2Side; ++oy) {
      for (int ox = 0; ox < kConv2Side; ++ox) {
        const T* row = d_patches.row((b * kConv2Side + oy) * kConv2Side + ox).data();
        for (int ky = 0; ky < kKernel; ++ky) {
          for (int kx = 0; kx < kKernel; ++kx) {
            T* dst = d_pool1->row((b * kPool1Side + oy + ky) * kPool1Side + ox + kx).data();
            const T* src = row + (ky * kKernel + kx) * c1;
            for (int ch = 0; ch < c1; ++ch) dst[ch] += src[ch];
          }
        }
      }
    }
  }
}

// The forward pass: conv1, pool1, conv2, pool2, dense1 (ReLU) and dense2 into ws->logits.
template <typename T>
void Forward(const CnnConfig& c, const Dims& d, const Params<const T*>& p, const float* images,
             Workspace<T>* ws) {
  // conv1: im2col [n*24*24, 25] x kernel [25, c1], on standardized pixels.
  ImagePatches(images, d.n, static_cast<T>(c.input_mean), static_cast<T>(1.0 / c.input_std),
               &ws->patches1);
  ws->act1.resize(d.rows1, d.c1);
  ws->act1.noalias() = ws->patches1 * ConstMap<T>(p.conv1_w, kTaps, d.c1);
  ws->act1.rowwise() += ConstRowMap<T>(p.conv1_b, d.c1);
  ws->act1 = ws->act1.cwiseMax(T(0));
  MaxPool2x2(ws->act1, d.n, kConv1Side, &ws->pool1, &ws->arg1);

  // conv2: im2col [n*8*8, 25*c1] x kernel [25*c1, c2].
  PooledPatches(ws->pool1, d.n, d.c1, &ws->patches2);
  ws->act2.resize(d.rows2, d.c2);
  ws->act2.noalias() = ws->patches2 * ConstMap<T>(p.conv2_w, kTaps * d.c1, d.c2);
  ws->act2.rowwise() += ConstRowMap<T>(p.conv2_b, d.c2);
  ws->act2 = ws->act2.cwiseMax(T(0));
  MaxPool2x2(ws->act2, d.n, kConv2Side, &ws->pool2, &ws->arg2);

  // dense1 (ReLU): [n, 16*c2] x [16*c2, units]. pool2's rows (b, y, x) with channels fastest are,
  // in memory, exactly the flattened [n, 16*c2] features.
  ConstMap<T> flat(ws->pool2.data(), d.n, d.flat_size);
  ws->hidden.resize(d.n, d.units);
  ws->hidden.noalias() = flat * ConstMap<T>(p.dense1_w, d.flat_size, d.units);
  ws->hidden.rowwise() += ConstRowMap<T>(p.dense1_b, d.units);
  ws->hidden = ws->hidden.cwiseMax(T(0));

  // dense2: [n, units] x [units, classes].
  ws->logits.resize(d.n, d.classes);
  ws->logits.noalias() = ws->hidden * ConstMap<T>(p.dense2_w, d.units, d.classes);
  ws->logits.rowwise() += ConstRowMap<T>(p.dense2_b, d.classes);
}

// Softmax cross-entropy of `logits` ([n, classes]): adds the loss sum and correct count; with
// `training`, `logits` becomes d(mean loss)/d(logits).
template <typename T>
void SoftmaxCrossEntropy(const float* labels, bool training, Mat<T>* logits, double* loss_sum,
                         int64_t* correct) {
  const int64_t n = logits->rows();
  const int classes = static_cast<int>(logits->cols());
  for (int64_t b = 0; b < n; ++b) {
    const int label = static_cast<int>(labels[b]);
    int predicted = 0;
    T top = (*logits)(b, 0);
    for (int k = 1; k < classes; ++k) {
      if ((*logits)(b, k) > top) {
        top = (*logits)(b, k);
        predicted = k;
      }
    }
    double sum = 0;
    for (int k = 0; k < classes; ++k) sum += std::exp(static_cast<double>((*logits)(b, k) - top));
    const double log_sum = std::log(sum);
    *loss_sum += log_sum - static_cast<double>((*logits)(b, label) - top);
    if (predicted == label) ++*correct;
    if (training) {
      for (int k = 0; k < classes; ++k) {
        const double prob = std::exp(static_cast<double>((*logits)(b, k) - top) - log_sum);
        (*logits)(b, k) =
            static_cast<T>((prob - (k == label ? 1.0 : 0.0)) / static_cast<double>(n));
      }
    }
  }
}

// The backward pass from d(mean loss)/d(logits) in ws->logits: writes every parameter's
// gradient.
template <typename T>
void Backward(const Dims& d, const Params<const T*>& p, Workspace<T>* ws, Params<T*>* grads) {
  const Mat<T>& d_logits = ws->logits;

  // dense2 backward.
  MutMap<T>(grads->dense2_w, d.units, d.classes).noalias() = ws->hidden.transpose() * d_logits;
  RowMap<T>(grads->dense2_b, d.classes) = d_logits.colwise().sum();
  Mat<T>& d_hidden = ws->d_hidden;
  d_hidden.resize(d.n, d.units);
  d_hidden.noalias() = d_logits * ConstMap<T>(p.dense2_w, d.units, d.classes).transpose();
  d_hidden = (ws->hidden.array() > T(0)).select(d_hidden, T(0));

  // dense1 backward.
  ConstMap<T> flat(ws->pool2.data(), d.n, d.flat_size);
  MutMap<T>(grads->dense1_w, d.flat_size, d.units).noalias() = flat.transpose() * d_hidden;
  RowMap<T>(grads->dense1_b, d.units) = d_hidden.colwise().sum();
  ws->d_flat.resize(d.n, d.flat_size);
  ws->d_flat.noalias() =
      d_hidden * ConstMap<T>(p.dense1_w, d.flat_size, d.units).transpose();

  // pool2 + ReLU + conv2 backward.
  ws->d_act2.resize(d.rows2, d.c2);
  MaxPoolReluBackward(ws->pool2, ws->d_flat.data(), ws->arg2, &ws->d_act2);
  MutMap<T>(grads->conv2_w, kTaps * d.c1, d.c2).noalias() =
      ws->patches2.transpose() * ws->d_act2;
  RowMap<T>(grads->conv2_b, d.c2) = ws->d_act2.colwise().sum();
  ws->d_patches2.resize(d.rows2, kTaps * d.c1);
  ws->d_patches2.noalias() =
      ws->d_act2 * ConstMap<T>(p.conv2_w, kTaps * d.c1, d.c2).transpose();
  PooledPatchesBackward(ws->d_patches2, d.n, d.c1, &ws->d_pool1);

  // pool1 + ReLU + conv1 backward (the input needs no gradient).
  ws->d_act1.resize(d.rows1, d.c1);
  MaxPoolReluBackward(ws->pool1, ws->d_pool1.data(), ws->arg1, &ws->d_act1);
  MutMap<T>(grads->conv1_w, kTaps, d.c1).noalias() = ws->patches1.transpose() * ws->d_act1;
  RowMap<T>(grads->conv1_b, d.c1) = ws->d_act1.colwise().sum();
}

// The network on `n` images: adds the loss sum and correct count, and with `grads` writes the
// gradients of the mean loss.
template <typename T>
void Run(const CnnConfig& c, const Params<const T*>& p, const float* images, const float* labels,
         int64_t n, double* loss_sum, int64_t* correct, Params<T*>* grads) {
  thread_local Workspace<T> ws;
  const Dims dims(c, n);
  Forward(c, dims, p, images, &ws);
  SoftmaxCrossEntropy(labels, grads != nullptr, &ws.logits, loss_sum, correct);
  if (grads != nullptr) Backward(dims, p, &ws, grads);
}

// The parameter pointers of `params` after checking every name and shape.
absl::StatusOr<Params<const float*>> FloatParams(const CnnConfig& c, const TensorTree& params) {
  if (absl::Status s = CheckConfig(c); !s.ok()) return s;
  const float* ptrs[kNumParams];
  int i = 0;
  for (const auto& [name, shape] : ParamShapes(c)) {
    auto it = params.find(name);
    if (it == params.end()) {
      return absl::InvalidArgumentError(absl::StrCat("cnn: parameter '", name, "' is missing"));
    }
    if (it->second.shape() != shape) {
      return absl::InvalidArgumentError(absl::StrCat("cnn: parameter '", name, "' has shape ",
                                                     it->second.ShapeString(), ", expected ",
                                                     ShapeText(shape)));
    }
    ptrs[i++] = it->second.data();
  }
  if (params.size() != kNumParams) {
    return absl::InvalidArgumentError(
        absl::StrCat("cnn: expected ", kNumParams, " parameters, got ", params.size()));
  }
  return FromArray(ptrs);
}

// splitmix64: a counter-based generator, identical on every platform.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

absl::StatusOr<TensorTree> InitCnnParams(const CnnConfig& config, uint64_t seed) {
  if (absl::Status s = CheckConfig(config); !s.ok()) return s;
  TensorTree params;
  uint64_t stream = 0;
  for (const auto& [name, shape] : ParamShapes(config)) {
    Tensor tensor(shape);
    ++stream;
    if (EndsWith(name, "/kernel")) {
      const int64_t fan_out = shape.back();
      const int64_t fan_in = NumElements(shape) / fan_out;
      // He-uniform before a ReLU, Glorot-uniform for the output layer.
      const double limit = name == "dense2/kernel"
                               ? std::sqrt(6.0 / static_cast<double>(fan_in + fan_out))
                               : std::sqrt(6.0 / static_cast<double>(fan_in));
      const uint64_t base = SplitMix64(seed ^ (stream * 0xd1b54a32d192ed03ULL));
      for (int64_t i = 0; i < tensor.size(); ++i) {
        const uint64_t bits = SplitMix64(base + static_cast<uint64_t>(i));
        const double unit = static_cast<double>(bits >> 11) * 0x1.0p-53;  // [0, 1)
        tensor.data()[i] = static_cast<float>((2.0 * unit - 1.0) * limit);
      }
    }
    params.emplace(name, std::move(tensor));
  }
  return params;
}

absl::StatusOr<LossAndGrads> CnnLossAndGrads(const CnnConfig& config, const TensorTree& params,
                                             const Batch& batch) {
  absl::StatusOr<Params<const float*>> p = FloatParams(config, params);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckBatch(config, batch); !s.ok()) return s;
  LossAndGrads result;
  float* gptrs[kNumParams];
  int i = 0;
  for (const auto& [name, shape] : ParamShapes(config)) {
    gptrs[i++] = result.grads.emplace(name, Tensor(shape)).first->second.data();
  }
  Params<float*> g = FromArray(gptrs);
  const int64_t n = batch.size();
  double loss_sum = 0;
  int64_t correct = 0;
  Run<float>(config, *p, batch.inputs.data(), batch.targets.data(), n, &loss_sum, &correct, &g);
  result.loss = loss_sum / static_cast<double>(n);
  result.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  return result;
}

absl::StatusOr<EvalResult> CnnEvaluate(const CnnConfig& config, const TensorTree& params,
                                       const Batch& batch) {
  absl::StatusOr<Params<const float*>> p = FloatParams(config, params);
  if (!p.ok()) return p.status();
  if (absl::Status s = CheckBatch(config, batch); !s.ok()) return s;
  EvalResult result;
  result.count = batch.size();
  Run<float>(config, *p, batch.inputs.data(), batch.targets.data(), batch.size(),
             &result.loss_sum, &result.correct, /*grads=*/nullptr);
  return result;
}

absl::StatusOr<double> CnnLossAndGradsF64(const CnnConfig& config, const ParamsF64& params,
                                          const Batch& batch, ParamsF64* grads) {
  if (absl::Status s = CheckConfig(config); !s.ok()) return s;
  if (absl::Status s = CheckBatch(config, batch); !s.ok()) return s;
  const double* ptrs[kNumParams];
  double* gptrs[kNumParams];
  int i = 0;
  grads->clear();
  for (const auto& [name, shape] : ParamShapes(config)) {
    auto it = params.find(name);
    if (it == params.end() || static_cast<int64_t>(it->second.size()) != NumElements(shape)) {
      return absl::InvalidArgumentError(absl::StrCat("cnn: parameter '", name,
                                                     "' is missing or not of shape ",
                                                     ShapeText(shape)));
    }
    ptrs[i] = it->second.data();
    std::vector<double>& grad = (*grads)[name];
    grad.assign(it->second.size(), 0.0);
    gptrs[i] = grad.data();
    ++i;
  }
  Params<const double*> p = FromArray(ptrs);
  Params<double*> g = FromArray(gptrs);
  double loss_sum = 0;
  int64_t correct = 0;
  Run<double>(config, p, batch.inputs.data(), batch.targets.data(), batch.size(), &loss_sum,
              &correct, &g);
  return loss_sum / static_cast<double>(batch.size());
}

}  // namespace cnn_example
