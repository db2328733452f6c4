#include "worker/tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace substrax {
namespace {

// "(2, 3)", "(4,)", "()".
std::string ShapeToText(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// How errors begin: "tensor 'conv_0/kernel': ", or nothing for a tensor without a name.
std::string TensorPrefix(absl::string_view name) {
  return name.empty() ? std::string() : absl::StrCat("tensor '", name, "': ");
}

// The number of elements of `shape`, or INVALID_ARGUMENT naming `name` for a negative dimension.
absl::StatusOr<int64_t> NumElements(const std::vector<int64_t>& shape, absl::string_view name) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(TensorPrefix(name), "shape ", ShapeToText(shape),
                       " has a negative dimension; every dimension must be >= 0"));
    }
    n *= d;
  }
  return n;
}

absl::Status CountMismatch(absl::string_view name, const std::vector<int64_t>& shape,
                           int64_t elements, size_t values) {
  return absl::InvalidArgumentError(absl::StrCat(TensorPrefix(name), "shape ", ShapeToText(shape),
                                                 " has ", elements, " elements, got ", values,
                                                 " values"));
}

// The constructors cannot return a status: a bad shape or count given to them is a programming
// error, reported without a source location of ours (the caller's code is at fault) and with
// the way to get an error instead.
[[noreturn]] void StopOnMisuse(const char* constructor, const absl::Status& status,
                               const char* instead) {
  std::fprintf(stderr, "%s: %s (%s returns this as an error status instead)\n", constructor,
               std::string(status.message()).c_str(), instead);
  std::abort();
}

}  // namespace

Tensor::Tensor(std::vector<int64_t> shape) : shape_(std::move(shape)) {
  absl::StatusOr<int64_t> n = NumElements(shape_, "");
  if (!n.ok()) StopOnMisuse("substrax::Tensor(shape)", n.status(), "substrax::Tensor::Zeros");
  data_.assign(*n, 0.0f);
}

Tensor::Tensor(std::vector<int64_t> shape, std::vector<float> values)
    : shape_(std::move(shape)), data_(std::move(values)) {
  absl::StatusOr<int64_t> n = NumElements(shape_, "");
  constexpr char kConstructor[] = "substrax::Tensor(shape, values)";
  if (!n.ok()) StopOnMisuse(kConstructor, n.status(), "substrax::Tensor::Create");
  if (*n != size()) {
    StopOnMisuse(kConstructor, CountMismatch("", shape_, *n, data_.size()),
                 "substrax::Tensor::Create");
  }
}

absl::StatusOr<Tensor> Tensor::Create(std::vector<int64_t> shape, std::vector<float> values,
                                      absl::string_view name) {
  absl::StatusOr<int64_t> n = NumElements(shape, name);
  if (!n.ok()) return n.status();
  if (*n != static_cast<int64_t>(values.size())) {
    return CountMismatch(name, shape, *n, values.size());
  }
  return Tensor(std::move(shape), std::move(values));
}

absl::StatusOr<Tensor> Tensor::Zeros(std::vector<int64_t> shape, absl::string_view name) {
  absl::Status valid = NumElements(shape, name).status();
  if (!valid.ok()) return valid;
  return Tensor(std::move(shape));
}

absl::Status Tensor::CopyFrom(absl::Span<const float> values, absl::string_view name) {
  if (static_cast<int64_t>(values.size()) != size()) {
    return CountMismatch(name, shape_, size(), values.size());
  }
  std::copy(values.begin(), values.end(), data_.begin());
  return absl::OkStatus();
}

void Tensor::Fill(float value) { std::fill(data_.begin(), data_.end(), value); }

absl::StatusOr<Tensor> Tensor::SliceRows(int64_t start, int64_t limit) const {
  if (rank() == 0) return absl::InvalidArgumentError("cannot slice rows of a scalar");
  if (start < 0 || start > limit || limit > shape_[0]) {
    return absl::InvalidArgumentError(absl::StrCat("rows [", start, ", ", limit,
                                                   ") out of range for shape ", ShapeString()));
  }
  const int64_t row = shape_[0] == 0 ? 0 : size() / shape_[0];
  std::vector<int64_t> shape = shape_;
  shape[0] = limit - start;
  return Tensor(std::move(shape),
                std::vector<float>(data_.begin() + start * row, data_.begin() + limit * row));
}

absl::StatusOr<Tensor> Tensor::Slice(absl::Span<const std::pair<int64_t, int64_t>> ranges) const {
  if (static_cast<int>(ranges.size()) != rank()) {
    return absl::InvalidArgumentError(absl::StrCat(ranges.size(), " ranges for a tensor of shape ",
                                                   ShapeString()));
  }
  std::vector<int64_t> shape(rank());
  for (int d = 0; d < rank(); ++d) {
    const auto [start, limit] = ranges[d];
    if (start < 0 || start > limit || limit > shape_[d]) {
      return absl::InvalidArgumentError(absl::StrCat("range [", start, ", ", limit,
                                                     ") out of bounds on dimension ", d,
                                                     " of shape ", ShapeString()));
    }
    shape[d] = limit - start;
  }
  Tensor out(shape);
  if (out.size() == 0) return out;
  // Walk the output in row-major order, tracking the source offset.
  std::vector<int64_t> strides(rank(), 1);
  for (int d = rank() - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape_[d + 1];
  std::vector<int64_t> idx(rank(), 0);
  const int64_t inner = shape.empty() ? 1 : shape.back();
  for (int64_t written = 0; written < out.size(); written += inner) {
    int64_t offset = 0;
    for (int d = 0; d < rank(); ++d) offset += (ranges[d].first + idx[d]) * strides[d];
    std::copy_n(data_.begin() + offset, inner, out.data_.begin() + written);
    for (int d = rank() - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::string Tensor::ShapeString() const { return ShapeToText(shape_); }

int64_t TreeSize(const TensorTree& tree) {
  int64_t n = 0;
  for (const auto& [name, t] : tree) n += t.size();
  return n;
}

absl::StatusOr<TreeDifference> CompareTrees(const TensorTree& a, const TensorTree& b,
                                            double floor) {
  if (a.size() != b.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("trees have ", a.size(), " and ", b.size(), " tensors"));
  }
  TreeDifference diff;
  for (const auto& [name, ta] : a) {
    auto it = b.find(name);
    if (it == b.end()) return absl::InvalidArgumentError(absl::StrCat("'", name, "' only in one tree"));
    const Tensor& tb = it->second;
    if (ta.shape() != tb.shape()) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' has shapes ", ta.ShapeString(),
                                                     " and ", tb.ShapeString()));
    }
    double max_diff = 0, max_b = 0;
    for (int64_t i = 0; i < ta.size(); ++i) {
      const double x = ta.data()[i], y = tb.data()[i];
      const double rel = std::abs(x - y) / std::max(std::abs(y), floor);
      if (rel > diff.max_relative || std::isnan(rel)) {
        diff.max_relative = std::isnan(rel) ? INFINITY : rel;
        diff.where = absl::StrCat(name, "[", i, "]");
      }
      max_diff = std::isnan(x - y) ? INFINITY : std::max(max_diff, std::abs(x - y));
      max_b = std::max(max_b, std::abs(y));
    }
    const double normwise = max_diff == 0 ? 0 : max_diff / std::max(max_b, 1e-30);
    if (normwise > diff.max_normwise) {
      diff.max_normwise = normwise;
      diff.normwise_where = name;
    }
  }
  return diff;
}

}  // namespace substrax
