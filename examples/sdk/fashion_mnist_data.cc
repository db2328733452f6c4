#include "fashion_mnist_data.h"

#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace cnn_example {
namespace {

struct GzCloser {
  void operator()(gzFile_s* file) const { gzclose(file); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// One IDX file: its dimensions and its bytes.
struct IdxFile {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads exactly `size` bytes; false at a short read.
bool ReadAll(gzFile file, void* out, size_t size) {
  auto* dst = static_cast<unsigned char*>(out);
  while (size > 0) {
    const unsigned chunk = size > (1u << 30) ? (1u << 30) : static_cast<unsigned>(size);
    const int got = gzread(file, dst, chunk);
    if (got <= 0) return false;
    dst += got;
    size -= static_cast<size_t>(got);
  }
  return true;
}

uint32_t BigEndian32(const unsigned char* b) {
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

absl::StatusOr<IdxFile> ReadIdx(const std::string& path, int expected_rank) {
  errno = 0;
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file == nullptr) {
    const int err = errno;
    const std::string reason = err != 0 ? std::strerror(err) : "cannot open";
    const std::string message = absl::StrCat(path, ": ", reason);
    return err == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  unsigned char header[4];
  if (!ReadAll(file.get(), header, 4)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an IDX file (shorter than its ",
                                                   "4-byte magic number)"));
  }
  // Magic: two zero bytes, the element type (0x08 = unsigned byte), the number of dimensions.
  if (header[0] != 0 || header[1] != 0 || header[2] != 0x08 || header[3] != expected_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not an IDX file of unsigned bytes with ", expected_rank,
        " dimensions (magic 0x", absl::Hex(BigEndian32(header), absl::kZeroPad8), ", expected 0x",
        absl::Hex(0x0800 | expected_rank, absl::kZeroPad8), ")"));
  }
  IdxFile idx;
  int64_t total = 1;
  for (int i = 0; i < expected_rank; ++i) {
    unsigned char dim[4];
    if (!ReadAll(file.get(), dim, 4)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": truncated IDX header"));
    }
    idx.dims.push_back(BigEndian32(dim));
    total *= idx.dims.back();
    if (total > (int64_t{1} << 34)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": IDX dimensions too large"));
    }
  }
  idx.data.resize(static_cast<size_t>(total));
  if (!ReadAll(file.get(), idx.data.data(), idx.data.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: the header announces ", total, " bytes of data"));
  }
  unsigned char extra;
  if (gzread(file.get(), &extra, 1) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": more data than the header's ", total, " bytes"));
  }
  return idx;
}

}  // namespace

absl::StatusOr<ImageDataset> LoadIdxDataset(const std::string& images_path,
                                            const std::string& labels_path) {
  absl::StatusOr<IdxFile> images = ReadIdx(images_path, 3);
  if (!images.ok()) return images.status();
  absl::StatusOr<IdxFile> labels = ReadIdx(labels_path, 1);
  if (!labels.ok()) return labels.status();
  if (images->dims[1] != 28 || images->dims[2] != 28) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": images are ", images->dims[1],
                                                   "x", images->dims[2], ", expected 28x28"));
  }
  if (images->dims[0] != labels->dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " has ", images->dims[0],
                                                   " images but ", labels_path, " has ",
                                                   labels->dims[0], " labels"));
  }
  for (size_t i = 0; i < labels->data.size(); ++i) {
    if (labels->data[i] > 9) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", i, " is ",
                                                     int{labels->data[i]}, ", not a class in [0, 10)"));
    }
  }
  ImageDataset data;
  data.count = images->dims[0];
  data.pixels_per_image = images->dims[1] * images->dims[2];
  data.pixels = std::move(images->data);
  data.labels = std::move(labels->data);
  return data;
}

substrax::Batch MakeBatch(const ImageDataset& data, absl::Span<const int64_t> indices) {
  const int64_t n = static_cast<int64_t>(indices.size());
  substrax::Batch batch;
  batch.inputs = substrax::Tensor({n, data.pixels_per_image});
  batch.targets = substrax::Tensor({n});
  float* x = batch.inputs.data();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = data.pixels.data() + indices[i] * data.pixels_per_image;
    for (int64_t j = 0; j < data.pixels_per_image; ++j) x[j] = src[j] * (1.0f / 255.0f);
    x += data.pixels_per_image;
    batch.targets.data()[i] = static_cast<float>(data.labels[indices[i]]);
  }
  return batch;
}

}  // namespace cnn_example
