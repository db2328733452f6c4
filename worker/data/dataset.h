// Datasets: a split of examples held in memory as two tensors, read from IDX files (as
// Fashion-MNIST ships them) or CSV, or generated from a seed.
//
// Every process of a data-parallel job loads the whole split and takes its shard of each global
// batch (worker/data/sampler.h), so loading is deterministic: the same files or the same seed give
// the same Dataset, byte for byte, on every platform.
//
// Pure functions; thread-safe. A Dataset is a value; read it from any number of threads.
#ifndef SUBSTRAX_WORKER_DATA_DATASET_H_
#define SUBSTRAX_WORKER_DATA_DATASET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "substrax/v1/job.pb.h"
#include "worker/data/safe_open.h"
#include "worker/tensor/tensor.h"

namespace substrax {

struct Dataset {
  // [N, F] float32.
  Tensor features;
  // Classification: [N], class ids stored as floats. Regression: [N, outputs].
  Tensor targets;
  // Classification: the number of classes (files: 1 + the largest label present; synthetic data:
  // num_outputs). 0 for regression.
  int64_t num_classes = 0;

  int64_t num_examples() const { return features.rank() == 0 ? 0 : features.dim(0); }
  int64_t num_features() const { return features.rank() < 2 ? 0 : features.dim(1); }
};

// Reads a pair of IDX files, gzip-compressed or plain (told apart by their content):
//   images: magic 0x00000803, uint8, dims N x rows x cols -> features [N, rows*cols] scaled to
//           [0, 1] (byte / 255);
//   labels: magic 0x00000801, uint8, dims N -> targets [N]; num_classes = 1 + the largest.
// Files are opened as `access` allows (OpenDataFile in safe_open.h, whose errors these are too).
// Errors, each naming the file and never quoting its contents: NOT_FOUND when a file does not
// exist; PERMISSION_DENIED when it is outside the data roots or not a regular file;
// INVALID_ARGUMENT for a wrong magic number, a file shorter or longer than its header says,
// corrupt gzip data, more than access.max_file_bytes, no examples, or image and label counts
// that differ.
absl::StatusOr<Dataset> ReadIdx(const std::string& images_path, const std::string& labels_path,
                                const DataAccess& access);

// Reads a CSV file with a header row, gzip-compressed or plain. `label_column` names the label
// column; every other column is a numeric feature, in file order. Fields are split at
// `delimiter`; surrounding white space and one pair of double quotes around a field are removed
// (quoted fields cannot contain the delimiter). Blank lines are skipped; "\r\n" line ends and a
// UTF-8 byte order mark are accepted.
// Classification: labels are non-negative integers (below kMaxNumClasses); targets [N].
// Regression: any finite number; targets [N, 1].
// The file is opened as `access` allows (OpenDataFile in safe_open.h, whose errors these are
// too). Errors: NOT_FOUND when the file does not exist; PERMISSION_DENIED when it is outside
// the data roots or not a regular file; INVALID_ARGUMENT for an empty file, a line longer than
// 16 MiB, a header without `label_column` (or with it twice), no feature columns, no data rows,
// a row with the wrong number of fields, a cell that is not a finite number, or a bad class
// label. Messages name the file and line, and the column (by number, counted from 1) where one is
// at fault; they never quote the file's contents (cells, header names), only the label column's
// name, which comes from the spec:
//   "/data/iris.csv:17: column 3: not a number".
absl::StatusOr<Dataset> ReadCsv(const std::string& path, const std::string& label_column,
                                char delimiter, bool classification, const DataAccess& access);

// Generates a split from `seed`; the test split draws its examples from another stream than the
// train split, but from the same model (class centres, W_true, b_true), so a model fitted to one
// generalises to the other.
//   classification: num_outputs classes, each with a random centre (expected distance between two
//     centres about 4); features = centre of a uniformly drawn class + Gaussian noise of standard
//     deviation `noise`, or 1 when `noise` is 0, so that neighbouring classes overlap a little.
//   regression: features ~ N(0, 1); targets [N, num_outputs] = x W_true + b_true + `noise` z with
//     z ~ N(0, 1) (exactly affine when noise is 0), W_true ~ N(0, 1/num_features) and
//     b_true ~ U[-1, 1).
// The split has num_train_examples or num_test_examples examples.
// Precondition (checked; LoadSplit validates it first): task is set, num_features >= 1,
// num_outputs >= 1 (>= 2 for classification), noise >= 0, and the split's count >= 1.
Dataset MakeSynthetic(const v1::SyntheticOptions& options, uint64_t seed, bool test_split);

// Loads the train or the test split of `spec` by its format. `seed` is the job seed (synthetic
// data); `classification` says whether the model predicts classes; data files are opened as
// `access` allows.
// Errors: FAILED_PRECONDITION when the test split is asked for and the spec has none;
// INVALID_ARGUMENT for an unset format, synthetic options out of range, a synthetic task or IDX
// data that does not suit the model, or a CSV delimiter that is not one character; otherwise
// those of ReadIdx / ReadCsv. Messages start with the split ("test split: ...").
absl::StatusOr<Dataset> LoadSplit(const v1::DataSpec& spec, bool test_split, uint64_t seed,
                                  bool classification, const DataAccess& access);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DATA_DATASET_H_
