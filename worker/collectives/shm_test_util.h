// Values and rank-order references for the ShmCommunicator tests.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_SHM_TEST_UTIL_H_
#define SUBSTRAX_WORKER_COLLECTIVES_SHM_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/collectives/communicator.h"

namespace substrax::shm_test {

// Rank r's value at element i of call `seed`: fractions of mixed sign and magnitude, so that
// a sum in another order than rank order would differ in the last bits.
template <typename T>
T Value(int rank, size_t i, int seed) {
  uint64_t x = (static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ull) ^
               (static_cast<uint64_t>(i) * 0xBF58476D1CE4E5B9ull) ^
               (static_cast<uint64_t>(seed) * 0x94D049BB133111EBull);
  x ^= x >> 31;
  x *= 0xD6E8FEB86657A5DBull;
  x ^= x >> 29;
  const int64_t mantissa = static_cast<int64_t>(x % 2000001) - 1000000;
  const int exponent = static_cast<int>((x >> 40) % 16) - 8;
  return static_cast<T>(static_cast<double>(mantissa) / 3.0 * (exponent >= 0 ? 1 << exponent : 1.0 / (1 << -exponent)));
}

template <typename T>
std::vector<T> Values(int rank, size_t count, int seed) {
  std::vector<T> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = Value<T>(rank, i, seed);
  return v;
}

// The all-reduce of Values over `n` ranks, left to right in rank order; kMean multiplies the sum
// by T(1) / T(n) as GlooCommunicator does.
template <typename T>
std::vector<T> Reference(int n, size_t count, int seed, ReduceOp op) {
  std::vector<T> out = Values<T>(0, count, seed);
  for (int r = 1; r < n; ++r) {
    for (size_t i = 0; i < count; ++i) {
      const T x = Value<T>(r, i, seed);
      switch (op) {
        case ReduceOp::kMax:
          out[i] = std::max(out[i], x);
          break;
        case ReduceOp::kMin:
          out[i] = std::min(out[i], x);
          break;
        case ReduceOp::kSum:
        case ReduceOp::kMean:
          out[i] = out[i] + x;
          break;
      }
    }
  }
  if (op == ReduceOp::kMean) {
    const T scale = T(1) / static_cast<T>(n);
    for (T& x : out) x *= scale;
  }
  return out;
}

// Bitwise equality (a NaN equals itself, 0.0 differs from -0.0): what "reproducible" means.
template <typename T>
size_t CountDifferent(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) wrong += std::memcmp(&a[i], &b[i], sizeof(T)) != 0;
  return wrong;
}

template <typename T>
void ExerciseTyped(Communicator& comm, size_t count, int seed, std::string* failures) {
  const int n = comm.size(), me = comm.rank();
  const auto fail = [&](const std::string& what) {
    absl::StrAppend(failures, "rank ", me, ", ", DataTypeName(DataTypeOf<T>()), ", count ", count,
                    ", seed ", seed, ": ", what, "\n");
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<T> data = Values<T>(me, count, seed);
    absl::Status s = comm.AllReduce(absl::MakeSpan(data), op);
    if (!s.ok()) return fail(absl::StrCat("all_reduce ", ReduceOpName(op), ": ", s.ToString()));
    if (size_t wrong = CountDifferent(data, Reference<T>(n, count, seed, op)); wrong > 0) {
      fail(absl::StrCat("all_reduce ", ReduceOpName(op), ": ", wrong, " wrong values"));
    }
    // Reduce-scatter: block b of rank r's input holds Values(r) of seed + b, so that the
    // reference of this rank's block is the all-reduce reference of seed + me.
    std::vector<T> input;
    for (int b = 0; b < n; ++b) {
      const std::vector<T> block = Values<T>(me, count, seed + b);
      input.insert(input.end(), block.begin(), block.end());
    }
    std::vector<T> block(count);
    s = comm.ReduceScatter(input, absl::MakeSpan(block), op);
    if (!s.ok()) return fail(absl::StrCat("reduce_scatter ", ReduceOpName(op), ": ", s.ToString()));
    if (size_t wrong = CountDifferent(block, Reference<T>(n, count, seed + me, op)); wrong > 0) {
      fail(absl::StrCat("reduce_scatter ", ReduceOpName(op), ": ", wrong, " wrong values"));
    }
  }
  std::vector<T> gathered(count * n);
  absl::Status s = comm.AllGather(Values<T>(me, count, seed), absl::MakeSpan(gathered));
  if (!s.ok()) return fail(absl::StrCat("all_gather: ", s.ToString()));
  for (int r = 0; r < n; ++r) {
    const std::vector<T> part(gathered.begin() + r * count, gathered.begin() + (r + 1) * count);
    if (size_t wrong = CountDifferent(part, Values<T>(r, count, seed)); wrong > 0) {
      fail(absl::StrCat("all_gather: block ", r, ": ", wrong, " wrong values"));
    }
  }
  for (int root = 0; root < n; ++root) {
    std::vector<T> data = Values<T>(me, count, seed);
    s = comm.Broadcast(absl::MakeSpan(data), root);
    if (!s.ok()) return fail(absl::StrCat("broadcast from ", root, ": ", s.ToString()));
    if (size_t wrong = CountDifferent(data, Values<T>(root, count, seed)); wrong > 0) {
      fail(absl::StrCat("broadcast from ", root, ": ", wrong, " wrong values"));
    }
  }
  s = comm.Barrier();
  if (!s.ok()) fail(absl::StrCat("barrier: ", s.ToString()));
}

// Every collective of `comm` with `count` values per rank, float and double, checked bit for bit
// against the rank-order references. Returns what went wrong, one line each; empty when nothing.
// Plain code, no gtest: forked processes run it too.
inline std::string ExerciseCollectives(Communicator& comm, size_t count, int seed) {
  std::string failures;
  ExerciseTyped<float>(comm, count, seed, &failures);
  ExerciseTyped<double>(comm, count, seed, &failures);
  return failures;
}

}  // namespace substrax::shm_test

#endif  // SUBSTRAX_WORKER_COLLECTIVES_SHM_TEST_UTIL_H_
