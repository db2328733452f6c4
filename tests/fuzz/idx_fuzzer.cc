// Fuzz target: ReadIdx on a pair of IDX files (plain or gzip'd). The input is
//   [2 bytes: n, big-endian] [images file: n bytes] [labels file: the rest],
// so that both files evolve together and a header can agree with the other file.
//
// Checks: a dataset read is consistent (features [N, rows*cols] in [0, 1], targets [N] below
// num_classes), never empty.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "tests/fuzz/fuzz_input.h"
#include "tests/fuzz/temp_file.h"
#include "worker/data/dataset.h"

namespace substrax {
namespace {

void Check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "idx_fuzzer: %s\n", what);
  std::abort();
}

void FuzzIdx(FuzzInput& in) {
  static TempFile* const images = new TempFile("images");
  static TempFile* const labels = new TempFile("labels");
  const int64_t images_size = (int64_t{in.Byte()} << 8) | in.Byte();
  std::string images_bytes;
  for (int64_t i = 0; i < images_size && !in.empty(); ++i) {
    images_bytes.push_back(static_cast<char>(in.Byte()));
  }
  absl::StatusOr<Dataset> dataset =
      ReadIdx(images->Write(images_bytes), labels->Write(in.Rest()), DataAccess::Unconfined());
  if (!dataset.ok()) return;
  const int64_t n = dataset->num_examples();
  Check(n >= 1, "a dataset without examples was accepted");
  Check(dataset->features.rank() == 2 && dataset->targets.rank() == 1 &&
            dataset->targets.dim(0) == n,
        "features and targets do not agree");
  for (float feature : dataset->features.span()) {
    Check(feature >= 0.0f && feature <= 1.0f, "a feature outside [0, 1]");
  }
  for (float label : dataset->targets.span()) {
    Check(label >= 0.0f && label < static_cast<float>(dataset->num_classes),
          "a label outside [0, num_classes)");
  }
}

}  // namespace
}  // namespace substrax

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  substrax::FuzzInput in(data, size);
  substrax::FuzzIdx(in);
  return 0;
}
