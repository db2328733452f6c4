#include "worker/compute/model.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>

#include "Eigen/Dense"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_spec.h"
#include "core/mesh.h"
#include "core/status.h"
#include "worker/compute/init.h"
#include "worker/tensor/aligned_floats.h"

namespace substrax {
namespace {

// Tensors are row-major; so are these, so a Map over Tensor data needs no copy.
using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;

enum class LossKind { kMeanSquaredError, kSoftmaxCrossEntropy };

// Formats a shape the way Tensor::ShapeString does, without building a tensor of that shape.
std::string ShapeString(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// One dense layer's parameters (this device's shards), checked against the model's shapes.
struct Layer {
  ConstMatrixMap kernel;   // [in, out], or its block of columns / rows
  ConstRowVectorMap bias;  // [out], or its block
  LayerSplit split;
};

// Sums `m` in place over the model axis (RowMatrix storage is contiguous).
absl::Status AllReduce(const TensorParallelism& tp, RowMatrix& m) {
  return tp.all_reduce_sum(absl::MakeSpan(m.data(), static_cast<size_t>(m.size())));
}

// What the loss head makes of the model's outputs.
struct HeadResult {
  double loss_sum = 0;  // sum over examples of the per-example loss
  int64_t correct = 0;
};

// A stack of dense layers with ReLU between them and a loss on the last one's outputs: every
// built-in model is one.
class DenseStack final : public Model {
 public:
  DenseStack(std::vector<ParamSpec> params, bool classification, TensorParallelism tp,
             std::vector<LayerSplit> splits, int64_t num_features, int64_t num_outputs)
      : Model(std::move(params), classification, std::move(tp)),
        splits_(std::move(splits)),
        loss_(classification ? LossKind::kSoftmaxCrossEntropy : LossKind::kMeanSquaredError),
        num_features_(num_features),
        num_outputs_(num_outputs) {
    // ModelParams lists each layer's kernel, then its bias; the layer walk below relies on it.
    for (size_t i = 0; i < this->params().size(); ++i) {
      SUBSTRAX_CHECK(absl::EndsWith(this->params()[i].name, i % 2 == 0 ? "/kernel" : "/bias"),
                     this->params()[i].name);
    }
    SUBSTRAX_CHECK(splits_.size() * 2 == this->params().size(), absl::StrCat(splits_.size()));
  }

  absl::StatusOr<LossAndGrads> LossAndGradientsInto(const TensorTree& params, const Batch& batch,
                                                    const GradientSink& sink) const override {
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<Layer> layers, CheckParams(params));
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int64_t> labels, CheckBatch(batch));
    const int64_t n = batch.size();
    if (n == 0) {
      return absl::InvalidArgumentError(
          "batch.inputs: the batch is empty; the mean loss of no examples is undefined");
    }
    SUBSTRAX_ASSIGN_OR_RETURN(const std::vector<RowMatrix> acts, Forward(layers, batch));
    // d is the gradient of the mean loss with respect to the current layer's pre-activations.
    RowMatrix d;
    const HeadResult head = Head(acts.back(), batch, labels, &d);
    d /= static_cast<float>(n);

    LossAndGrads result;
    result.loss = head.loss_sum / static_cast<double>(n);
    result.accuracy =
        is_classification() ? static_cast<double>(head.correct) / static_cast<double>(n) : 0.0;
    for (int l = static_cast<int>(layers.size()) - 1; l >= 0; --l) {
      const size_t kernel = 2 * static_cast<size_t>(l), bias = kernel + 1;
      const ConstMatrixMap input = LayerInput(batch, acts, l);
      MatrixMap(sink.buffer(kernel), input.cols(), d.cols()).noalias() = input.transpose() * d;
      RowVectorMap(sink.buffer(bias), d.cols()).noalias() = d.colwise().sum();
      if (sink.done) {
        sink.done(kernel);
        sink.done(bias);
      }
      if (l > 0) {
        // Through the kernel, then through the ReLU that made this layer's input: its
        // derivative is 1 where the output was positive, 0 elsewhere (0 at the kink, as in JAX).
        // A column-parallel kernel's block of columns gives a partial sum of the input gradient
        // (this device's outputs' share); the first layer needs none, so the first pair has no
        // backward all-reduce.
        RowMatrix d_input = d * layers[l].kernel.transpose();
        if (layers[l].split == LayerSplit::kColumn) {
          SUBSTRAX_RETURN_IF_ERROR(AllReduce(tensor_parallelism(), d_input));
        }
        d = (acts[l - 1].array() > 0.0f).select(d_input, 0.0f);
      }
    }
    return result;
  }

  absl::StatusOr<EvalResult> Evaluate(const TensorTree& params, const Batch& batch) const override {
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<Layer> layers, CheckParams(params));
    SUBSTRAX_ASSIGN_OR_RETURN(std::vector<int64_t> labels, CheckBatch(batch));
    EvalResult result;
    result.count = batch.size();
    if (result.count == 0) return result;
    SUBSTRAX_ASSIGN_OR_RETURN(const std::vector<RowMatrix> acts, Forward(layers, batch));
    const HeadResult head = Head(acts.back(), batch, labels, nullptr);
    result.loss_sum = head.loss_sum;
    result.correct = head.correct;
    return result;
  }

 private:
  // The model's parameters in `params`, layer by layer. Errors: INVALID_ARGUMENT naming a
  // parameter that is missing, unexpected, or of the wrong (local) shape.
  absl::StatusOr<std::vector<Layer>> CheckParams(const TensorTree& params) const {
    for (const ParamSpec& spec : this->params()) {
      auto it = params.find(spec.name);
      if (it == params.end()) {
        return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' is missing"));
      }
      const std::vector<int64_t> local = LocalShape(spec);
      if (it->second.shape() != local) {
        const TensorParallelism& tp = tensor_parallelism();
        return absl::InvalidArgumentError(absl::StrCat(
            "parameter '", spec.name, "' has shape ", it->second.ShapeString(), ", expected ",
            ShapeString(local),
            local == spec.shape
                ? ""
                : absl::StrCat(": the local shard (model-axis index ", tp.index, " of ",
                               tp.axis_size, ") of the global ", ShapeString(spec.shape))));
      }
    }
    if (params.size() != this->params().size()) {
      for (const auto& [name, tensor] : params) {
        bool known = false;
        for (const ParamSpec& spec : this->params()) known = known || spec.name == name;
        if (!known) {
          return absl::InvalidArgumentError(
              absl::StrCat("parameter '", name, "' is not a parameter of this model"));
        }
      }
    }
    std::vector<Layer> layers;
    for (size_t i = 0; i + 1 < this->params().size(); i += 2) {
      const Tensor& w = params.at(this->params()[i].name);
      const Tensor& b = params.at(this->params()[i + 1].name);
      layers.push_back({ConstMatrixMap(w.data(), w.dim(0), w.dim(1)),
                        ConstRowVectorMap(b.data(), b.dim(0)), splits_[i / 2]});
    }
    return layers;
  }

  // Checks the batch's shapes; for classification returns its labels as class ids.
  // Errors: INVALID_ARGUMENT naming batch.inputs or batch.targets.
  absl::StatusOr<std::vector<int64_t>> CheckBatch(const Batch& batch) const {
    const Tensor& x = batch.inputs;
    const Tensor& t = batch.targets;
    if (x.rank() != 2 || x.dim(1) != num_features_) {
      return absl::InvalidArgumentError(absl::StrCat("batch.inputs has shape ", x.ShapeString(),
                                                     ", expected (batch, ", num_features_, ")"));
    }
    const int64_t n = x.dim(0);
    if (!is_classification()) {
      if (t.shape() != std::vector<int64_t>{n, num_outputs_}) {
        return absl::InvalidArgumentError(
            absl::StrCat("batch.targets has shape ", t.ShapeString(), ", expected ",
                         ShapeString({n, num_outputs_}), " (batch, output_size)"));
      }
      return std::vector<int64_t>();
    }
    if (t.shape() != std::vector<int64_t>{n}) {
      return absl::InvalidArgumentError(absl::StrCat("batch.targets has shape ", t.ShapeString(),
                                                     ", expected (", n,
                                                     ",): one class id per example"));
    }
    std::vector<int64_t> labels(n);
    for (int64_t i = 0; i < n; ++i) {
      const float v = t.data()[i];
      // Written so that NaN fails too.
      if (!(v >= 0 && v < static_cast<float>(num_outputs_)) || v != std::floor(v)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch.targets[", i, "] is ", v, ", not a class id in [0, ", num_outputs_, ")"));
      }
      labels[i] = static_cast<int64_t>(v);
    }
    return labels;
  }

  // Input of layer l: the batch for the first layer, the previous layer's activations after.
  static ConstMatrixMap LayerInput(const Batch& batch, const std::vector<RowMatrix>& acts, int l) {
    if (l == 0) {
      return ConstMatrixMap(batch.inputs.data(), batch.inputs.dim(0), batch.inputs.dim(1));
    }
    return ConstMatrixMap(acts[l - 1].data(), acts[l - 1].rows(), acts[l - 1].cols());
  }

  // Every layer's output (this device's columns of a column-parallel one), ReLU applied on all
  // but the last (whose outputs are the model's). Errors: those of the all-reduce.
  absl::StatusOr<std::vector<RowMatrix>> Forward(const std::vector<Layer>& layers,
                                                 const Batch& batch) const {
    std::vector<RowMatrix> acts;
    acts.reserve(layers.size());
    for (size_t l = 0; l < layers.size(); ++l) {
      RowMatrix z;
      z.noalias() = LayerInput(batch, acts, static_cast<int>(l)) * layers[l].kernel;
      // A row-parallel kernel's block of rows gives a partial sum; its bias is added once, after.
      if (layers[l].split == LayerSplit::kRow) {
        SUBSTRAX_RETURN_IF_ERROR(AllReduce(tensor_parallelism(), z));
      }
      z.rowwise() += layers[l].bias;
      if (l + 1 < layers.size()) z = z.cwiseMax(0.0f);
      acts.push_back(std::move(z));
    }
    return acts;
  }

  // Sum of per-example losses and correct predictions of `out` [batch, outputs]; with `d_out`,
  // also the gradient of that sum with respect to `out`.
  HeadResult Head(const RowMatrix& out, const Batch& batch, const std::vector<int64_t>& labels,
                  RowMatrix* d_out) const {
    HeadResult head;
    if (loss_ == LossKind::kMeanSquaredError) {
      // Per-example loss: the mean over outputs of the squared error, so that the mean of the
      // per-example losses is the mean over batch x outputs.
      const RowMatrix diff = out - ConstMatrixMap(batch.targets.data(), out.rows(), out.cols());
      head.loss_sum = diff.cast<double>().squaredNorm() / static_cast<double>(out.cols());
      if (d_out != nullptr) *d_out = diff * (2.0f / static_cast<float>(out.cols()));
      return head;
    }
    // Softmax cross-entropy through log-sum-exp on logits shifted by their row maximum, so that
    // exp never overflows: loss = log(sum(exp(shifted))) - shifted[label].
    const Eigen::VectorXf row_max = out.rowwise().maxCoeff();
    const RowMatrix shifted = out.colwise() - row_max;
    const RowMatrix exps = shifted.array().exp().matrix();
    const Eigen::VectorXf sums = exps.rowwise().sum();
    if (d_out != nullptr) *d_out = sums.cwiseInverse().asDiagonal() * exps;  // softmax
    for (int64_t i = 0; i < out.rows(); ++i) {
      const int64_t label = labels[i];
      head.loss_sum +=
          std::log(static_cast<double>(sums(i))) - static_cast<double>(shifted(i, label));
      Eigen::Index predicted = 0;
      out.row(i).maxCoeff(&predicted);  // the first maximum, as argmax
      if (predicted == label) ++head.correct;
      if (d_out != nullptr) (*d_out)(i, label) -= 1.0f;
    }
    return head;
  }

  std::vector<LayerSplit> splits_;
  LossKind loss_;
  int64_t num_features_;
  int64_t num_outputs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const v1::ModelSpec& spec,
                                                     int64_t num_features, TensorParallelism tp) {
  if (tp.axis_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism: the model axis has ", tp.axis_size,
                     " devices; it needs at least 1"));
  }
  if (tp.axis_size > 1 && spec.type() != v1::MODEL_TYPE_MLP) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism: only an mlp splits over the model axis; ",
        v1::ModelType_Name(spec.type()), " cannot use a model axis of size ", tp.axis_size,
        " (use a mesh without one)"));
  }
  if (tp.index < 0 || tp.index >= tp.axis_size) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallelism: index ", tp.index,
                                                   " is outside the model axis [0, ",
                                                   tp.axis_size, ")"));
  }
  if (tp.axis_size > 1 && !tp.all_reduce_sum) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism: a model axis of size ", tp.axis_size,
        " needs an all_reduce_sum callback (the worker's collective over the model axis)"));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<ParamSpec> params,
                            ModelParams(spec, num_features, tp.axis_size));
  std::vector<LayerSplit> splits = LayerSplits(spec, tp.axis_size);
  return std::make_unique<DenseStack>(std::move(params), IsClassification(spec.type()),
                                      std::move(tp), std::move(splits), num_features,
                                      ModelOutputSize(spec));
}

absl::StatusOr<LossAndGrads> Model::LossAndGradients(const TensorTree& params,
                                                     const Batch& batch) const {
  // Through one aligned scratch buffer (see GradientSink), then into the tensors.
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const ParamSpec& p : params_) {
    offsets.push_back(total);
    int64_t size = 1;
    for (int64_t d : LocalShape(p)) size *= d;
    // Each gradient on its own cache line, as in a flat gradient buffer.
    total += (size + kAlignedFloats - 1) / kAlignedFloats * kAlignedFloats;
  }
  AlignedFloats scratch(static_cast<size_t>(total));
  GradientSink sink;
  sink.buffer = [&](size_t i) { return scratch.data() + offsets[i]; };
  SUBSTRAX_ASSIGN_OR_RETURN(LossAndGrads result, LossAndGradientsInto(params, batch, sink));
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor grad(LocalShape(params_[i]));
    std::copy_n(scratch.data() + offsets[i], grad.size(), grad.data());
    result.grads[params_[i].name] = std::move(grad);
  }
  return result;
}

std::vector<std::pair<int64_t, int64_t>> Model::LocalBlock(const ParamSpec& p) const {
  std::vector<std::pair<int64_t, int64_t>> block;
  for (size_t d = 0; d < p.shape.size(); ++d) {
    const auto& dims = p.partition.dims();
    const bool split = d < dims.size() && std::find(dims[d].begin(), dims[d].end(), kModelAxis) != dims[d].end();
    // ModelParams checked that split widths divide by the axis size.
    const int64_t size = split ? p.shape[d] / tp_.axis_size : p.shape[d];
    const int64_t start = split ? tp_.index * size : 0;
    block.emplace_back(start, start + size);
  }
  return block;
}

std::vector<int64_t> Model::LocalShape(const ParamSpec& p) const {
  std::vector<int64_t> shape;
  for (const auto& [start, limit] : LocalBlock(p)) shape.push_back(limit - start);
  return shape;
}

TensorTree Model::Init(uint64_t seed) const {
  TensorTree tree;
  for (const ParamSpec& p : params_) {
    absl::StatusOr<Tensor> shard = InitParamSlice(seed, p, LocalBlock(p));
    SUBSTRAX_CHECK(shard.ok(), shard.status().ToString());  // LocalBlock lies within the shape
    tree[p.name] = *std::move(shard);
  }
  return tree;
}

}  // namespace substrax
