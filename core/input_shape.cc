#include "core/input_shape.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace substrax {
namespace {

constexpr uint32_t kIdxImagesMagic = 0x00000803;  // unsigned bytes, 3 dimensions

// An open file, read through zlib: gz* functions pass plain files through unchanged, so one
// reader serves both and the name's ending does not matter.
class HeaderReader {
 public:
  ~HeaderReader() {
    if (file_ != nullptr) gzclose(file_);
  }

  // `field` names the spec field the path came from, for messages.
  absl::Status Open(const std::string& field, const std::string& path) {
    field_ = field;
    path_ = path;
    errno = 0;
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) return Unreadable(errno);
    return absl::OkStatus();
  }

  // Up to `n` more bytes; fewer only at the end of the file.
  absl::StatusOr<std::string> Read(size_t n) {
    std::string bytes(n, '\0');
    errno = 0;
    const int got = gzread(file_, bytes.data(), static_cast<unsigned>(n));
    if (got < 0) {
      int error = Z_OK;
      const char* message = gzerror(file_, &error);
      if (error == Z_ERRNO) return Unreadable(errno);
      return Invalid(absl::StrCat("corrupt gzip data (", message, ")"));
    }
    bytes.resize(got);
    return bytes;
  }

  absl::Status Invalid(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(field_, ": ", path_, ": ", what));
  }

 private:
  // The data usually lives on the workers, not where plan runs; say so rather than only "ENOENT".
  absl::Status Unreadable(int error) const {
    return absl::Status(
        error == 0 ? absl::StatusCode::kNotFound : absl::ErrnoToStatusCode(error),
        absl::StrCat(field_, ": cannot read ", path_, " (",
                     error == 0 ? "not a readable file" : std::strerror(error),
                     "): the input width comes from the data's header; run this where the data "
                     "is (a worker's host) or copy the file here"));
  }

  std::string field_;
  std::string path_;
  gzFile file_ = nullptr;
};

struct IdxImagesHeader {
  int64_t examples = 0;
  int64_t rows = 0;
  int64_t cols = 0;
};

absl::StatusOr<IdxImagesHeader> ReadIdxImagesHeader(const v1::DataSplit& train) {
  const std::string field = "spec.data.train.images";
  if (train.images().empty()) return absl::InvalidArgumentError(field + ": is required");
  HeaderReader reader;
  if (absl::Status s = reader.Open(field, train.images()); !s.ok()) return s;
  absl::StatusOr<std::string> header = reader.Read(16);
  if (!header.ok()) return header.status();
  if (header->size() < 16) {
    return reader.Invalid(absl::StrCat("truncated: ", header->size(),
                                       " bytes, too short for an IDX images header (16)"));
  }
  auto be32 = [&](size_t offset) {
    const auto* b = reinterpret_cast<const unsigned char*>(header->data() + offset);
    return uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | uint32_t{b[3]};
  };
  if (be32(0) != kIdxImagesMagic) {
    return reader.Invalid(absl::StrCat(
        "not an IDX images file: magic 0x", absl::Hex(be32(0), absl::kZeroPad8),
        ", expected 0x00000803 (unsigned bytes, N x rows x cols)"));
  }
  const int64_t rows = be32(8), cols = be32(12);
  if (rows < 1 || cols < 1) {
    return reader.Invalid(absl::StrCat("images of ", rows, " x ", cols, " pixels"));
  }
  return IdxImagesHeader{static_cast<int64_t>(be32(4)), rows, cols};
}

absl::StatusOr<int64_t> IdxFeatures(const v1::DataSplit& train) {
  absl::StatusOr<IdxImagesHeader> header = ReadIdxImagesHeader(train);
  if (!header.ok()) return header.status();
  return header->rows * header->cols;
}

absl::StatusOr<int64_t> CsvFeatures(const v1::DataSpec& data) {
  const std::string field = "spec.data.train.path";
  if (data.train().path().empty()) return absl::InvalidArgumentError(field + ": is required");
  const char delimiter = data.csv().delimiter().empty() ? ',' : data.csv().delimiter()[0];
  HeaderReader reader;
  if (absl::Status s = reader.Open(field, data.train().path()); !s.ok()) return s;
  // The header is the first line that is not blank; read until it is complete.
  std::string text;
  while (true) {
    absl::StatusOr<std::string> chunk = reader.Read(1 << 16);
    if (!chunk.ok()) return chunk.status();
    text += *chunk;
    absl::string_view rest = text;
    if (absl::StartsWith(rest, "\xEF\xBB\xBF")) rest.remove_prefix(3);  // UTF-8 byte order mark
    const bool at_end = chunk->empty();
    for (absl::string_view line : absl::StrSplit(rest, '\n')) {
      const bool complete = line.data() + line.size() < rest.data() + rest.size() || at_end;
      if (!complete) break;
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      int64_t columns = 0, labels = 0;
      for (absl::string_view column : absl::StrSplit(line, delimiter)) {
        column = absl::StripAsciiWhitespace(column);
        if (column.size() >= 2 && column.front() == '"' && column.back() == '"') {
          column = column.substr(1, column.size() - 2);
        }
        ++columns;
        if (column == data.csv().label_column()) ++labels;
      }
      if (labels != 1) {
        return reader.Invalid(absl::StrCat(labels == 0 ? "no" : "more than one", " column '",
                                           data.csv().label_column(),
                                           "' (spec.data.csv.label_column) in the header"));
      }
      if (columns < 2) return reader.Invalid("no feature columns besides the label column");
      return columns - 1;
    }
    if (at_end) return reader.Invalid("empty, expected a header row");
  }
}

}  // namespace

absl::StatusOr<int64_t> InputFeatures(const v1::DataSpec& data) {
  switch (data.format()) {
    case v1::DATA_FORMAT_SYNTHETIC:
      if (data.synthetic().num_features() < 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("spec.data.synthetic.num_features: must be >= 1, got ",
                         data.synthetic().num_features()));
      }
      return data.synthetic().num_features();
    case v1::DATA_FORMAT_IDX:
      return IdxFeatures(data.train());
    case v1::DATA_FORMAT_CSV:
      return CsvFeatures(data);
    default:
      return absl::InvalidArgumentError("spec.data.format: unspecified; use idx, csv or synthetic");
  }
}

absl::StatusOr<int64_t> TrainExamples(const v1::DataSpec& data) {
  switch (data.format()) {
    case v1::DATA_FORMAT_SYNTHETIC:
      return data.synthetic().num_train_examples();
    case v1::DATA_FORMAT_IDX: {
      absl::StatusOr<IdxImagesHeader> header = ReadIdxImagesHeader(data.train());
      if (!header.ok()) return header.status();
      return header->examples;
    }
    default:
      return absl::UnimplementedError(
          "the number of examples of csv data is known only once the file is read");
  }
}

}  // namespace substrax
