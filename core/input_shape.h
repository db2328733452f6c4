// The width of a job's input (its number of features) from the data spec alone, without loading
// the data or linking training code: what the coordinator and `substraxctl plan` need to size the
// first layer. Only headers are read: the IDX header of the images file, or the CSV header row.
//
// Pure functions (they only read files); thread-safe.
#ifndef SUBSTRAX_CORE_INPUT_SHAPE_H_
#define SUBSTRAX_CORE_INPUT_SHAPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

// Features per example of the training data:
//  - synthetic: synthetic.num_features;
//  - idx: rows x cols from the header of train.images (magic 0x00000803, dims N x rows x cols);
//  - csv: the columns of train.path's header row less the label column.
// Files may be gzip-compressed or plain.
// Errors: NOT_FOUND / PERMISSION_DENIED when the file cannot be read on this machine (the message
// names the field and the file, and says to run where the data is); INVALID_ARGUMENT for a file
// that is not what the format says (wrong IDX magic, a truncated header, an empty CSV, no label
// column), an unspecified format, or a missing path (each names the field).
absl::StatusOr<int64_t> InputFeatures(const v1::DataSpec& data);

// Examples in the training split, from the headers alone: synthetic.num_train_examples, or N of
// the IDX images header. Errors: as InputFeatures; UNIMPLEMENTED for csv (it has no header that
// says).
absl::StatusOr<int64_t> TrainExamples(const v1::DataSpec& data);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_INPUT_SHAPE_H_
