// TensorBoard event files: scalar series by step, in the format `tensorboard --logdir DIR` reads.
//
// An event file is a sequence of TFRecords, each one serialized `tensorboard.Event`
// (proto/tensorboard/event.proto). A record is framed as
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes |
//   data | uint32 masked CRC32C of data
// with mask(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8. The first record is an Event with
// file_version "brain.Event:2"; each later one holds one step's scalar values as
// `summary { value { tag simple_value } }`.
//
// `substraxctl metrics --tensorboard DIR` writes a finished job's series with it; the runner
// writes spec.tensorboard's files with it while the job trains.
//
// The framing functions are pure and thread-safe. A TensorBoardWriter is not thread-safe: one
// thread writes it.
#ifndef SUBSTRAX_CORE_TENSORBOARD_WRITER_H_
#define SUBSTRAX_CORE_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace substrax {

// CRC32C (Castagnoli, the polynomial 0x1EDC6F41, reflected) of `data`.
uint32_t Crc32c(absl::string_view data);
// TFRecord's masked CRC32C of `data`: mask(Crc32c(data)).
uint32_t MaskedCrc32c(absl::string_view data);
// `data` framed as one TFRecord.
std::string FrameTfRecord(absl::string_view data);
// The records of a TFRecord file's contents, checking both CRCs of each. Errors: DATA_LOSS
// naming the record (by index and byte offset) that is cut short or whose CRC does not match.
absl::StatusOr<std::vector<std::string>> ParseTfRecords(absl::string_view contents);

// One scalar of one step: TensorBoard plots the values of a tag over steps.
struct TensorBoardScalar {
  std::string tag;
  double value = 0;  // written as a float (simple_value), as TensorBoard reads it
};

// Writes one new event file in a directory.
class TensorBoardWriter {
 public:
  // Creates `dir` (and its missing parents) and a new file in it named
  // "events.out.tfevents.<unix seconds of now>.<hostname>" (".<pid>.<n>" added if that name is
  // taken), and writes the file_version record. Errors: FAILED_PRECONDITION when `dir` or the
  // file cannot be created or written (permissions, a file in the way, a full disk), naming the
  // path and the system's reason.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir,
                                                                   absl::Time now);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Appends one Event for `step` holding `scalars`, at `wall_time`. Nothing reaches the file
  // until Flush (or the destructor). An empty `scalars` writes nothing.
  void AddStep(int64_t step, absl::Time wall_time, const std::vector<TensorBoardScalar>& scalars);
  // Writes what was added since the last flush. Errors: FAILED_PRECONDITION naming the file and
  // the system's reason (what failed stays pending, and a later Flush tries again).
  absl::Status Flush();

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_;
  std::string path_;
  std::string pending_;  // framed records not yet written
};

}  // namespace substrax

#endif  // SUBSTRAX_CORE_TENSORBOARD_WRITER_H_
