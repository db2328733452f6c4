// Fuzz target: ReadCsv on any file. The input is
//   [1 byte: the delimiter (',', ';', '\t' or ' ') and classification or regression] [the file],
// with the label column named "label".
//
// Checks: a dataset read is consistent (features [N, F], finite; targets [N] class ids below
// num_classes, or [N, 1] finite values), never empty.
#include <cmath>
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
  std::fprintf(stderr, "csv_fuzzer: %s\n", what);
  std::abort();
}

void FuzzCsv(FuzzInput& in) {
  static TempFile* const file = new TempFile("csv");
  static const char kDelimiters[] = {',', ';', '\t', ' '};
  const uint8_t options = in.Byte();
  const char delimiter = kDelimiters[options % 4];
  const bool classification = (options & 4) != 0;
  absl::StatusOr<Dataset> dataset =
      ReadCsv(file->Write(in.Rest()), "label", delimiter, classification, DataAccess::Unconfined());
  if (!dataset.ok()) return;
  const int64_t n = dataset->num_examples();
  Check(n >= 1 && dataset->num_features() >= 1, "an empty dataset was accepted");
  Check(dataset->targets.dim(0) == n, "features and targets do not agree");
  for (float feature : dataset->features.span()) {
    Check(std::isfinite(feature), "a feature that is not finite");
  }
  for (float target : dataset->targets.span()) {
    Check(std::isfinite(target), "a target that is not finite");
    if (classification) {
      Check(target >= 0.0f && target < static_cast<float>(dataset->num_classes) &&
                target == std::floor(target),
            "a label that is not a class id below num_classes");
    }
  }
}

}  // namespace
}  // namespace substrax

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  substrax::FuzzInput in(data, size);
  substrax::FuzzCsv(in);
  return 0;
}
