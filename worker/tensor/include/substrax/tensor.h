// Tensor: a dense float32 array in row-major order, and TensorTree, a set of named tensors
// (parameters, gradients, optimizer state). The shared currency of worker/compute,
// worker/data and worker/collectives, which do not know each other, and of programs built on
// the SDK (docs/sdk.md), which fill tensors from their own data.
//
// A Tensor owns its values. Not thread-safe for concurrent writes; a device thread owns its
// tensors.
#ifndef SUBSTRAX_TENSOR_H_
#define SUBSTRAX_TENSOR_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace substrax {

class Tensor {
 public:
  // A rank-0 tensor holding 0.
  Tensor() : data_(1, 0.0f) {}
  // Zeros of `shape`. A negative dimension is a programming error: the process stops with a
  // message naming the shape. For a shape that comes from data, use Tensor::Zeros.
  explicit Tensor(std::vector<int64_t> shape);
  // `values` in row-major order, exactly as many as the shape has elements. A mismatch is a
  // programming error: the process stops with a message naming the shape and both counts. For
  // values or shapes that come from data (files, arguments, other programs), use
  // Tensor::Create, which returns the mismatch as an error.
  Tensor(std::vector<int64_t> shape, std::vector<float> values);

  // A tensor of `shape` holding `values` (row-major). `name` says which tensor in errors
  // ("conv_0/kernel"; empty: the error names the shape only).
  // Errors: INVALID_ARGUMENT if a dimension is negative or the count of values is not the number
  // of elements of the shape, naming the tensor, the shape and both counts:
  //   "tensor 'conv_0/kernel': shape (5, 5, 1, 16) has 400 elements, got 399 values".
  static absl::StatusOr<Tensor> Create(std::vector<int64_t> shape, std::vector<float> values,
                                       absl::string_view name = "");
  // Zeros of `shape`. Errors: INVALID_ARGUMENT for a negative dimension, naming the tensor.
  static absl::StatusOr<Tensor> Zeros(std::vector<int64_t> shape, absl::string_view name = "");

  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t size() const { return static_cast<int64_t>(data_.size()); }

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  absl::Span<float> span() { return absl::MakeSpan(data_); }
  absl::Span<const float> span() const { return absl::MakeConstSpan(data_); }

  // Every element set to `value`.
  void Fill(float value);
  // Copies `values` (row-major) into the tensor; its shape stays. `name` as in Create.
  // Errors: INVALID_ARGUMENT if values.size() != size(), naming the tensor, its shape and both
  // counts; the tensor is then unchanged.
  absl::Status CopyFrom(absl::Span<const float> values, absl::string_view name = "");

  // Rows [start, limit) of the leading dimension, copied. Errors: INVALID_ARGUMENT for a
  // rank-0 tensor or a range outside [0, dim(0)].
  absl::StatusOr<Tensor> SliceRows(int64_t start, int64_t limit) const;
  // A copy restricted to [start, limit) along every dimension (ranges.size() == rank()).
  // Errors: INVALID_ARGUMENT for a wrong count or a range out of bounds.
  absl::StatusOr<Tensor> Slice(absl::Span<const std::pair<int64_t, int64_t>> ranges) const;

  // "(2, 3)".
  std::string ShapeString() const;

  friend bool operator==(const Tensor& a, const Tensor& b) {
    return a.shape_ == b.shape_ && a.data_ == b.data_;
  }

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

// Named tensors in a fixed (sorted) order: every rank iterates parameters identically.
using TensorTree = std::map<std::string, Tensor>;

// Total number of float values in a tree.
int64_t TreeSize(const TensorTree& tree);

// How far two trees of the same structure are apart; for equivalence tests.
//  max_relative: the largest elementwise |a - b| / max(|b|, floor), and where.
//  max_normwise: the largest over tensors of max|a - b| / max|b| (the normwise relative error
//                in the max norm, the usual measure for "equal within a relative tolerance" of
//                results computed in different summation orders), and which tensor.
// Errors: INVALID_ARGUMENT if the trees differ in names or shapes.
struct TreeDifference {
  double max_relative = 0;
  std::string where;  // "dense_0/kernel[123]"
  double max_normwise = 0;
  std::string normwise_where;  // "dense_0/kernel"
};
absl::StatusOr<TreeDifference> CompareTrees(const TensorTree& a, const TensorTree& b,
                                            double floor = 1e-3);

// One batch of examples as a device sees it.
struct Batch {
  // [batch, features].
  Tensor inputs;
  // Classification: [batch], class ids stored as floats. Regression: [batch, outputs].
  Tensor targets;
  int64_t size() const { return inputs.rank() == 0 ? 0 : inputs.dim(0); }
};

// Loss and accuracy sums of some examples, as every backend's models report them. Sums, so the
// results of several shards, batches or devices add up.
struct EvalResult {
  double loss_sum = 0;  // sum over examples of the per-example loss
  int64_t correct = 0;  // classification only
  int64_t count = 0;
};

// What a model computes for one training step on one device's batch.
struct LossAndGrads {
  // Mean over the batch.
  double loss = 0;
  // Fraction of the batch classified correctly (classification); 0 for regression.
  double accuracy = 0;
  // Same names and shapes as the parameters: gradients of the mean loss.
  TensorTree grads;
};

}  // namespace substrax

#endif  // SUBSTRAX_TENSOR_H_
