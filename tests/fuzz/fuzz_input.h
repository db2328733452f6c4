// FuzzInput: turns a fuzzer's bytes into the choices of a structured input (integers in a
// range, booleans, strings), as clang's FuzzedDataProvider does. Ours because the corpus replay
// tests build with gcc, which does not ship <fuzzer/FuzzedDataProvider.h>.
//
// Exhausted input reads as zeros, so every byte string decodes to some input and a fuzzer's
// mutations stay meaningful.
#ifndef SUBSTRAX_TESTS_FUZZ_FUZZ_INPUT_H_
#define SUBSTRAX_TESTS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace substrax {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return pos_ >= size_; }

  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool Bool() { return (Byte() & 1) != 0; }

  // A value in [lo, hi] (lo <= hi), from as many bytes as the range needs.
  int64_t Range(int64_t lo, int64_t hi) {
    const uint64_t span = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
    uint64_t value = 0;
    for (uint64_t seen = 0; seen < span && !empty(); seen = (seen << 8) | 0xff) {
      value = (value << 8) | Byte();
    }
    if (span != UINT64_MAX) value %= span + 1;
    return static_cast<int64_t>(static_cast<uint64_t>(lo) + value);
  }

  // Any int64, biased towards the edges that break arithmetic (0, -1, the extremes).
  int64_t Int64() {
    switch (Byte() % 8) {
      case 0:
        return 0;
      case 1:
        return -1;
      case 2:
        return INT64_MAX;
      case 3:
        return INT64_MIN;
      case 4:
        return INT32_MAX + Range(-2, 2);
      default:
        return Range(-4, 64);
    }
  }

  // Up to `max_length` bytes.
  std::string String(size_t max_length) {
    const size_t length = static_cast<size_t>(Range(0, static_cast<int64_t>(max_length)));
    std::string out;
    for (size_t i = 0; i < length && !empty(); ++i) out.push_back(static_cast<char>(Byte()));
    return out;
  }

  // The bytes not read yet.
  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_) + (pos_ < size_ ? pos_ : size_),
                    pos_ < size_ ? size_ - pos_ : 0);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace substrax

#endif  // SUBSTRAX_TESTS_FUZZ_FUZZ_INPUT_H_
