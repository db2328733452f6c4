// Rng: the random numbers of the data layer (shuffling, synthetic data), identical on every
// platform, compiler and standard library for a given (seed, stream).
//
// Every process of a job draws the same epoch permutation from the job seed without talking to
// the others, so the generator and its conversions are ours: xoshiro256** (Blackman & Vigna)
// seeded through SplitMix64, an unbiased bounded integer by rejection, a uniform double from
// the top 53 bits, and a normal by Marsaglia's polar method. std:: distributions are
// implementation-defined and are never used.
//
// Header-only. An Rng is a value; it is not thread-safe (give each thread its own).
#ifndef SUBSTRAX_WORKER_DATA_RANDOM_H_
#define SUBSTRAX_WORKER_DATA_RANDOM_H_

#include <cmath>
#include <cstdint>

#include "core/status.h"

namespace substrax {

// One step of SplitMix64 (Steele, Lea & Flood): advances `state` and returns its mixed output.
inline uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Independent streams of one seed. Each user of randomness draws from its own stream, so adding
// draws to one (more synthetic features) never changes another (the shuffle order).
enum class RngStream : uint64_t {
  kShuffle = 1,         // index: the epoch (EpochPermutation)
  kSyntheticModel = 2,  // class centres, W_true and b_true: shared by train and test
  kSyntheticTrain = 3,  // the training examples
  kSyntheticTest = 4,   // the test examples
};

class Rng {
 public:
  // The generator of stream (`stream`, `index`) of `seed`; `index` numbers the members of a
  // family of streams (the epoch of a shuffle).
  Rng(uint64_t seed, RngStream stream, uint64_t index = 0) {
    uint64_t key = (static_cast<uint64_t>(stream) << 56) ^ index;
    uint64_t state = seed ^ SplitMix64(key);
    for (uint64_t& word : s_) word = SplitMix64(state);
  }

  // A generator in the given xoshiro256** state (not all zero), for checking the algorithm against
  // its published reference outputs.
  static Rng FromState(uint64_t s0, uint64_t s1, uint64_t s2, uint64_t s3) {
    Rng rng(0, RngStream::kShuffle);
    rng.s_[0] = s0;
    rng.s_[1] = s1;
    rng.s_[2] = s2;
    rng.s_[3] = s3;
    return rng;
  }

  // 64 uniformly distributed bits (xoshiro256**).
  uint64_t Next() {
    const uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n) without modulo bias (n >= 1; checked).
  uint64_t UniformInt(uint64_t n) {
    SUBSTRAX_CHECK(n >= 1, "UniformInt needs a non-empty range");
    // Draws below `limit` map onto [0, n) equally often; the rest are redrawn (fewer than half).
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do {
      x = Next();
    } while (x >= limit);
    return x % n;
  }

  // Uniform in [0, 1), a multiple of 2^-53.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

  // Uniform in [lo, hi).
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }

  // Standard normal (mean 0, standard deviation 1). Marsaglia's polar method: only sqrt (exact in
  // IEEE 754) and log from libm. The second value of each pair is kept for the next call.
  double Normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = Uniform(-1.0, 1.0);
      v = Uniform(-1.0, 1.0);
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double scale = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * scale;
    has_spare_ = true;
    return u * scale;
  }

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DATA_RANDOM_H_
