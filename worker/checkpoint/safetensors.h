// safetensors files (https://github.com/huggingface/safetensors, format version of 2023): the
// shard format of substrax checkpoints, which numpy, PyTorch and JAX users load directly.
//
//   8 bytes   N, the header's length, unsigned little-endian
//   N bytes   JSON: {"<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, ...,
//                    "__metadata__": {"<key>": "<string>", ...}}   (padded with spaces)
//   the rest  every tensor's bytes, little-endian, row-major, in offset order, no gaps
//
// Reading validates everything the format promises (sizes, offsets that tile the data exactly,
// shapes that match the byte counts, known dtypes) before a byte of data is handed out, so a
// truncated or corrupted file is an error, never a wrong tensor. Checksums of whole files:
// Xxh3Hex (XXH3, 64 bits).
//
// Thread-compatible: a SafetensorsFile is immutable once read.
#ifndef SUBSTRAX_WORKER_CHECKPOINT_SAFETENSORS_H_
#define SUBSTRAX_WORKER_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace substrax {

// The element types substrax writes and reads, by their safetensors names.
enum class SafetensorsDtype { kF32, kF64, kF16, kBF16, kI64, kI32, kU8, kBool };

// "F32" for kF32; and back (nullopt-like: INVALID_ARGUMENT for an unknown name).
std::string SafetensorsDtypeName(SafetensorsDtype dtype);
absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name);
// Bytes per element.
int SafetensorsDtypeSize(SafetensorsDtype dtype);

struct SafetensorsTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  // Little-endian, row-major; its size must be the product of the shape times the dtype's.
  std::string bytes;
};

// The file's bytes. Tensors are laid out in name order (as the reference implementation does).
// Errors: INVALID_ARGUMENT (an empty or repeated name, "__metadata__" as a name, a negative
// dimension, bytes that do not match the shape).
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);

class SafetensorsFile {
 public:
  // Parses `contents` (a whole file). `source` names it in errors. Errors: INVALID_ARGUMENT
  // saying what is wrong where ("model-0.safetensors: header of 12 bytes but the file has 9").
  static absl::StatusOr<SafetensorsFile> Parse(std::string contents, const std::string& source);
  // Reads and parses a file of at most `max_bytes`. Errors: NOT_FOUND, PERMISSION_DENIED (as the
  // open failed), INVALID_ARGUMENT (larger than max_bytes; as Parse).
  static absl::StatusOr<SafetensorsFile> Read(const std::string& path,
                                              int64_t max_bytes = int64_t{64} << 30);

  // Tensor names, in name order.
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The tensor `name` (bytes copied out). Errors: NOT_FOUND naming the tensors there are.
  absl::StatusOr<SafetensorsTensor> Tensor(const std::string& name) const;

 private:
  struct Entry {
    SafetensorsDtype dtype;
    std::vector<int64_t> shape;
    int64_t begin = 0;
    int64_t end = 0;
  };
  std::string source_;
  std::string contents_;
  int64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// XXH3 (64 bits) of `data`, as 16 lowercase hex digits.
std::string Xxh3Hex(absl::string_view data);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_CHECKPOINT_SAFETENSORS_H_
