#include "worker/compute/init.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace substrax {
namespace {

constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;

// SplitMix64's step and output function. Its output is a bijection of z with full avalanche, so
// neighbouring inputs (consecutive flat indices, seeds 0 and 1) give unrelated outputs.
uint64_t SplitMix64(uint64_t z) {
  z += kGoldenGamma;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// 64-bit FNV-1a over the name's bytes: the same on every host and library, unlike std::hash.
uint64_t StableNameHash(absl::string_view name) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

float GlorotLimit(const ParamSpec& spec) {
  int64_t fan_in = spec.fan_in, fan_out = spec.fan_out;
  if (fan_in + fan_out <= 0 && spec.shape.size() == 2) {
    fan_in = spec.shape[0];
    fan_out = spec.shape[1];
  }
  if (fan_in + fan_out <= 0) return 0.0f;
  return static_cast<float>(std::sqrt(6.0 / static_cast<double>(fan_in + fan_out)));
}

// The per-element generator of one parameter: what depends only on (seed, spec) is computed once.
class ElementInit {
 public:
  ElementInit(uint64_t seed, const ParamSpec& spec)
      : key_(SplitMix64(SplitMix64(seed) ^ StableNameHash(spec.name))),
        limit_(absl::EndsWith(spec.name, "/kernel") ? GlorotLimit(spec) : 0.0f) {}

  float operator()(int64_t flat_index) const {
    if (limit_ == 0.0f) return 0.0f;
    // Element i is output i of a SplitMix64 stream seeded with key_: counter-based, so any
    // element is computed without the ones before it.
    const uint64_t bits = SplitMix64(key_ + static_cast<uint64_t>(flat_index) * kGoldenGamma);
    // The top 24 bits make u in [0, 1) exactly in float, so 2u - 1 is exact and in [-1, 1) and
    // the product never leaves [-limit, limit].
    const float u = static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
    return limit_ * (2.0f * u - 1.0f);
  }

 private:
  uint64_t key_;
  float limit_;
};

}  // namespace

float InitValue(uint64_t seed, const ParamSpec& spec, int64_t flat_index) {
  return ElementInit(seed, spec)(flat_index);
}

Tensor InitParam(uint64_t seed, const ParamSpec& spec) {
  const ElementInit init(seed, spec);
  Tensor out(spec.shape);
  float* data = out.data();
  for (int64_t i = 0; i < out.size(); ++i) data[i] = init(i);
  return out;
}

absl::StatusOr<Tensor> InitParamSlice(uint64_t seed, const ParamSpec& spec,
                                      absl::Span<const std::pair<int64_t, int64_t>> ranges) {
  const int rank = static_cast<int>(spec.shape.size());
  if (static_cast<int>(ranges.size()) != rank) {
    return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "' has rank ", rank,
                                                   ", got ", ranges.size(), " slice ranges"));
  }
  std::vector<int64_t> shape(rank);
  for (int d = 0; d < rank; ++d) {
    const auto [start, limit] = ranges[d];
    if (start < 0 || start > limit || limit > spec.shape[d]) {
      return absl::InvalidArgumentError(absl::StrCat("parameter '", spec.name, "': slice range [",
                                                     start, ", ", limit, ") is not within [0, ",
                                                     spec.shape[d], "] on dimension ", d));
    }
    shape[d] = limit - start;
  }
  const ElementInit init(seed, spec);
  Tensor out(shape);
  if (out.size() == 0) return out;
  // Row-major strides of the global shape; walk the block one innermost row at a time.
  std::vector<int64_t> strides(rank, 1);
  for (int d = rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * spec.shape[d + 1];
  const int64_t inner = rank == 0 ? 1 : shape[rank - 1];
  std::vector<int64_t> idx(rank, 0);
  float* data = out.data();
  for (int64_t written = 0; written < out.size(); written += inner) {
    int64_t base = 0;
    for (int d = 0; d < rank; ++d) base += (ranges[d].first + idx[d]) * strides[d];
    for (int64_t j = 0; j < inner; ++j) data[written + j] = init(base + j);
    for (int d = rank - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

TensorTree InitParams(uint64_t seed, const std::vector<ParamSpec>& specs) {
  TensorTree tree;
  for (const ParamSpec& spec : specs) tree[spec.name] = InitParam(seed, spec);
  return tree;
}

}  // namespace substrax
