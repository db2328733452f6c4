// Fashion-MNIST from its IDX files (gzip-compressed, as the dataset ships them), read with zlib.
// Kept as bytes (47 MB for the training set; floats would take four times that) and turned into
// substrax::Batch values, pixels scaled to [0, 1], when a batch is assembled.
#ifndef SUBSTRAX_EXAMPLES_SDK_FASHION_MNIST_DATA_H_
#define SUBSTRAX_EXAMPLES_SDK_FASHION_MNIST_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "substrax/tensor.h"

namespace cnn_example {

struct ImageDataset {
  int64_t count = 0;
  int64_t pixels_per_image = 0;  // rows * columns
  std::vector<uint8_t> pixels;   // count * pixels_per_image, row-major
  std::vector<uint8_t> labels;   // count
};

// Reads an images file (IDX magic 0x00000803: count, rows, columns) and its labels file (magic
// 0x00000801: count). gzip or plain files both work (zlib reads either).
// Errors: NOT_FOUND naming a file that does not exist; INVALID_ARGUMENT naming the file and
// what is wrong (bad magic, truncated, counts that differ, a label > 9, images not 28x28).
absl::StatusOr<ImageDataset> LoadIdxDataset(const std::string& images_path,
                                            const std::string& labels_path);

// The examples `indices` of `data` as one batch: inputs [n, pixels] in [0, 1], targets [n].
substrax::Batch MakeBatch(const ImageDataset& data, absl::Span<const int64_t> indices);

}  // namespace cnn_example

#endif  // SUBSTRAX_EXAMPLES_SDK_FASHION_MNIST_DATA_H_
