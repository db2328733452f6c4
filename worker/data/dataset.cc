#include "worker/data/dataset.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/job_spec.h"
#include "core/status.h"
#include "worker/data/random.h"

namespace substrax {
namespace {

// A CSV line longer than this is refused: 16 MiB holds a row of kMaxFeatures numbers of 15
// characters each, and a file that is not CSV at all fails early instead of being split into
// millions of fields.
constexpr size_t kMaxCsvLineBytes = size_t{16} << 20;

// Synthetic splits larger than this many feature values (8 GiB of floats) are refused: a typo in
// a spec should not exhaust the host's memory.
constexpr int64_t kMaxSyntheticValues = int64_t{1} << 31;

// The error of a failed open or read: abseil's code for `error` (an errno value: NOT_FOUND for
// ENOENT, PERMISSION_DENIED for EACCES, ...); UNKNOWN when zlib failed without setting errno.
absl::Status FileError(int error, const std::string& message) {
  if (error == 0) return absl::UnknownError(absl::StrCat(message, " (zlib gave no reason)"));
  return absl::ErrnoToStatus(error, message);
}

// The whole content of `path`, opened as `access` allows (safe_open.h), decompressed when it is
// gzip data. zlib's gz* functions read plain files unchanged, so one reader serves both and the
// file name's ending does not matter. Errors never quote the content: zlib's messages are its
// own fixed texts.
absl::StatusOr<std::string> ReadMaybeGzipped(const std::string& path, const DataAccess& access) {
  SUBSTRAX_ASSIGN_OR_RETURN(ScopedFd fd, OpenDataFile(path, access, /*size=*/nullptr));
  errno = 0;
  gzFile file = gzdopen(fd.get(), "rb");
  if (file == nullptr) return FileError(errno, absl::StrCat(path, ": cannot read"));
  fd.Release();  // gzclose closes it
  std::string content;
  std::vector<char> buffer(1 << 20);
  absl::Status status;
  while (true) {
    const int n = gzread(file, buffer.data(), static_cast<unsigned>(buffer.size()));
    int error = Z_OK;
    const char* message = gzerror(file, &error);
    if (n < 0 || (error != Z_OK && error != Z_BUF_ERROR)) {
      status = error == Z_ERRNO ? FileError(errno, absl::StrCat(path, ": cannot read"))
                                : absl::InvalidArgumentError(
                                      absl::StrCat(path, ": corrupt gzip data (", message, ")"));
      break;
    }
    if (n == 0) {
      // zlib reports a gzip stream cut short as Z_BUF_ERROR at the end, not as a read error.
      if (error == Z_BUF_ERROR) {
        status =
            absl::InvalidArgumentError(absl::StrCat(path, ": truncated gzip data (", message, ")"));
      }
      break;
    }
    if (static_cast<int64_t>(content.size()) + n > access.max_file_bytes) {
      status = absl::InvalidArgumentError(
          absl::StrCat(path, ": decompresses to more than the limit of ", access.max_file_bytes,
                       " bytes for a data file"));
      break;
    }
    content.append(buffer.data(), n);
  }
  gzclose(file);
  if (!status.ok()) return status;
  return content;
}

// An IDX file: its dimensions and the data after its header.
struct IdxFile {
  std::vector<uint64_t> dims;
  std::string data;
};

uint32_t BigEndian32(absl::string_view bytes) {
  const auto* b = reinterpret_cast<const unsigned char*>(bytes.data());
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) | (uint32_t{b[2]} << 8) | b[3];
}

// Reads an IDX file of unsigned bytes with `rank` dimensions (`what` names its content:
// "images") and checks that its size is exactly what the header promises.
absl::StatusOr<IdxFile> ReadIdxFile(const std::string& path, int rank, absl::string_view what,
                                    const DataAccess& access) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::string content, ReadMaybeGzipped(path, access));
  const uint32_t expected_magic = 0x00000800u | static_cast<uint32_t>(rank);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (content.size() < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated: ", content.size(), " bytes, too short for an IDX header"));
  }
  const uint32_t magic = BigEndian32(content);
  // The magic number found is not quoted: until it matches, the file may be anything, and its
  // bytes must not reach the job's error. The sizes and dimensions quoted below come from a
  // header that has matched, and are what a training job reports anyway.
  if (magic != expected_magic) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: not an IDX %s file: its magic number (first 4 bytes) is not 0x%08x (unsigned "
        "bytes, %d dimensions); check the path, and that images and labels are not swapped",
        path, what, expected_magic, rank));
  }
  if (content.size() < header) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: ", content.size(),
                                                   " bytes, the IDX header alone has ", header));
  }
  IdxFile idx;
  uint64_t count = 1;
  bool overflow = false;
  for (int d = 0; d < rank; ++d) {
    const uint64_t dim = BigEndian32(absl::string_view(content).substr(4 + 4 * d));
    idx.dims.push_back(dim);
    if (dim != 0 && count > UINT64_MAX / dim) overflow = true;
    count *= dim;
  }
  const uint64_t size = content.size() - header;
  const std::string dims = absl::StrJoin(idx.dims, " x ");
  if (overflow || count > size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated: the header promises ", dims,
                                                   " bytes of data, the file has ", size));
  }
  if (count < size) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size - count, " bytes after the ",
                                                   dims, " bytes the header describes"));
  }
  if (count == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": holds no ", what, " (", dims, ")"));
  }
  content.erase(0, header);
  idx.data = std::move(content);
  return idx;
}

// Fields of one CSV line, without surrounding white space and one pair of double quotes.
std::vector<absl::string_view> SplitCsvLine(absl::string_view line, char delimiter) {
  std::vector<absl::string_view> fields = absl::StrSplit(line, delimiter);
  for (absl::string_view& field : fields) {
    field = absl::StripAsciiWhitespace(field);
    if (field.size() >= 2 && field.front() == '"' && field.back() == '"') {
      field = field.substr(1, field.size() - 2);
    }
  }
  return fields;
}

// Parses one cell as a number that fits a finite float. The error says what is wrong with the
// cell without quoting it (file contents never reach an error); the caller adds where it is
// (built only on error: files have millions of cells).
absl::StatusOr<double> ParseCell(absl::string_view cell) {
  double value = 0;
  if (cell.empty()) return absl::InvalidArgumentError("empty, expected a number");
  if (!absl::SimpleAtod(cell, &value)) return absl::InvalidArgumentError("not a number");
  if (!std::isfinite(static_cast<float>(value))) {
    return absl::InvalidArgumentError("not a finite number in the range of a 32-bit float");
  }
  return value;
}

// Parses a class label: an integer in [0, kMaxNumClasses). Errors as ParseCell.
absl::StatusOr<double> ParseClassLabel(absl::string_view cell) {
  SUBSTRAX_ASSIGN_OR_RETURN(const double value, ParseCell(cell));
  if (value < 0 || value != std::floor(value)) {
    return absl::InvalidArgumentError(
        "the class label is not a non-negative integer (a class id)");
  }
  if (value >= kMaxNumClasses) {
    return absl::InvalidArgumentError(
        absl::StrCat("the class label is too large (at most ", kMaxNumClasses - 1, ")"));
  }
  return value;
}

int64_t SyntheticCount(const v1::SyntheticOptions& options, bool test_split) {
  return test_split ? options.num_test_examples() : options.num_train_examples();
}

// The problems of synthetic options that MakeSynthetic cannot work with, as INVALID_ARGUMENT.
absl::Status ValidateSynthetic(const v1::SyntheticOptions& options, bool test_split) {
  const std::string p = "spec.data.synthetic.";
  const int64_t num_examples = SyntheticCount(options, test_split);
  const bool classification = options.task() == v1::SYNTHETIC_TASK_CLASSIFICATION;
  std::vector<std::string> problems;
  if (options.task() != v1::SYNTHETIC_TASK_CLASSIFICATION &&
      options.task() != v1::SYNTHETIC_TASK_REGRESSION) {
    problems.push_back(p + "task: is not set (classification or regression)");
  }
  if (options.num_features() < 1 || options.num_features() > kMaxFeatures) {
    problems.push_back(absl::StrCat(p, "num_features: must be in [1, ", kMaxFeatures, "], got ",
                                    options.num_features()));
  }
  const int64_t min_outputs = classification ? 2 : 1;
  const int64_t max_outputs = classification ? kMaxNumClasses : kMaxFeatures;
  if (options.num_outputs() < min_outputs || options.num_outputs() > max_outputs) {
    problems.push_back(absl::StrCat(p, "num_outputs: must be in [", min_outputs, ", ", max_outputs,
                                    "], got ", options.num_outputs()));
  }
  if (!(options.noise() >= 0) || !std::isfinite(options.noise())) {
    problems.push_back(
        absl::StrCat(p, "noise: must be a finite number >= 0, got ", options.noise()));
  }
  if (num_examples < 1 || num_examples > kMaxExamples) {
    problems.push_back(absl::StrCat(p, test_split ? "num_test_examples" : "num_train_examples",
                                    ": must be in [1, ", kMaxExamples, "], got ", num_examples));
  } else if (options.num_features() >= 1 &&
             num_examples > kMaxSyntheticValues / options.num_features()) {
    problems.push_back(absl::StrCat(p, "num_features: ", num_examples, " examples x ",
                                    options.num_features(), " features is more than ",
                                    kMaxSyntheticValues, " values; ask for fewer"));
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

// Class centres: expected distance between two of them about 4 whatever the number of features.
std::vector<double> SyntheticCentres(Rng& rng, int64_t classes, int64_t features) {
  const double scale = 4.0 / std::sqrt(2.0 * static_cast<double>(features));
  std::vector<double> centres(classes * features);
  for (double& c : centres) c = scale * rng.Normal();
  return centres;
}

absl::StatusOr<Dataset> LoadFromFiles(const v1::DataSpec& spec, bool test_split,
                                      bool classification, const DataAccess& access) {
  if (test_split && !spec.has_test()) {
    return absl::FailedPreconditionError(
        "the job's data has no test split (spec.data.test is not set)");
  }
  const v1::DataSplit& split = test_split ? spec.test() : spec.train();
  if (spec.format() == v1::DATA_FORMAT_IDX) {
    if (!classification) {
      return absl::InvalidArgumentError(
          "idx data has class labels, but the model predicts values (regression); use a "
          "classification model");
    }
    return ReadIdx(split.images(), split.labels(), access);
  }
  const std::string& delimiter = spec.csv().delimiter();
  if (delimiter.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec.data.csv.delimiter: must be one character, got \"", delimiter, "\""));
  }
  return ReadCsv(split.path(), spec.csv().label_column(), delimiter.empty() ? ',' : delimiter[0],
                 classification, access);
}

absl::StatusOr<Dataset> LoadSynthetic(const v1::DataSpec& spec, bool test_split, uint64_t seed,
                                      bool classification) {
  const v1::SyntheticOptions& options = spec.synthetic();
  if (test_split && options.num_test_examples() == 0) {
    return absl::FailedPreconditionError(
        "the job's data has no test split (spec.data.synthetic.num_test_examples is 0)");
  }
  if (options.task() != v1::SYNTHETIC_TASK_UNSPECIFIED &&
      (options.task() == v1::SYNTHETIC_TASK_CLASSIFICATION) != classification) {
    return absl::InvalidArgumentError(absl::StrCat(
        "spec.data.synthetic.task: a ", classification ? "regression" : "classification",
        " task does not suit a ", classification ? "classification" : "regression", " model"));
  }
  SUBSTRAX_RETURN_IF_ERROR(ValidateSynthetic(options, test_split));
  return MakeSynthetic(options, seed, test_split);
}

}  // namespace

absl::StatusOr<Dataset> ReadIdx(const std::string& images_path, const std::string& labels_path,
                                const DataAccess& access) {
  SUBSTRAX_ASSIGN_OR_RETURN(const IdxFile images, ReadIdxFile(images_path, 3, "images", access));
  SUBSTRAX_ASSIGN_OR_RETURN(const IdxFile labels, ReadIdxFile(labels_path, 1, "labels", access));
  const uint64_t n = images.dims[0];
  if (labels.dims[0] != n) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " holds ", n, " images but ",
                                                   labels_path, " holds ", labels.dims[0],
                                                   " labels; the files must belong together"));
  }
  const int64_t pixels = static_cast<int64_t>(images.dims[1] * images.dims[2]);
  Dataset data;
  data.features = Tensor({static_cast<int64_t>(n), pixels});
  float* features = data.features.data();
  for (size_t i = 0; i < images.data.size(); ++i) {
    features[i] = static_cast<unsigned char>(images.data[i]) / 255.0f;
  }
  data.targets = Tensor({static_cast<int64_t>(n)});
  float* targets = data.targets.data();
  int64_t largest = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t label = static_cast<unsigned char>(labels.data[i]);
    largest = std::max(largest, label);
    targets[i] = static_cast<float>(label);
  }
  data.num_classes = largest + 1;
  return data;
}

absl::StatusOr<Dataset> ReadCsv(const std::string& path, const std::string& label_column,
                                char delimiter, bool classification, const DataAccess& access) {
  SUBSTRAX_ASSIGN_OR_RETURN(const std::string content, ReadMaybeGzipped(path, access));
  absl::string_view rest = content;
  if (absl::StartsWith(rest, "\xEF\xBB\xBF")) rest.remove_prefix(3);  // UTF-8 byte order mark

  std::vector<std::string> columns;  // empty until the header is read
  size_t label_index = 0;
  std::vector<float> features, targets;
  int64_t rows = 0, largest = 0;
  for (int64_t line_number = 1; !rest.empty(); ++line_number) {
    const size_t end = std::min(rest.find('\n'), rest.size());
    const absl::string_view line = rest.substr(0, end);
    rest.remove_prefix(std::min(end + 1, rest.size()));
    auto at = [&] { return absl::StrCat(path, ":", line_number); };
    if (line.size() > kMaxCsvLineBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          at(), ": the line is ", line.size(), " bytes, more than the limit of ", kMaxCsvLineBytes,
          "; check that this is a CSV file with '\\n' line ends"));
    }
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const std::vector<absl::string_view> fields = SplitCsvLine(line, delimiter);

    if (columns.empty()) {
      for (absl::string_view field : fields) columns.emplace_back(field);
      const auto count = std::count(columns.begin(), columns.end(), label_column);
      // The header's other names are the file's contents: they are counted, never quoted.
      if (count != 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            at(), ": ", count == 0 ? "no" : "more than one", " column '", label_column,
            "' (spec.data.csv.label_column) in the header of ", columns.size(),
            " columns; check the label column's name and spec.data.csv.delimiter"));
      }
      if (columns.size() < 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            at(), ": no feature columns besides the label column '", label_column, "'"));
      }
      label_index = std::find(columns.begin(), columns.end(), label_column) - columns.begin();
      continue;
    }

    if (fields.size() != columns.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          at(), ": ", fields.size(), " fields, but the header has ", columns.size(), " columns"));
    }
    for (size_t c = 0; c < fields.size(); ++c) {
      const bool label = c == label_index;
      const absl::StatusOr<double> value =
          label && classification ? ParseClassLabel(fields[c]) : ParseCell(fields[c]);
      if (!value.ok()) {
        return Annotate(value.status(),
                        absl::StrCat(at(), ": column ", c + 1,
                                     label ? absl::StrCat(" ('", label_column, "', the label)")
                                           : std::string()));
      }
      (label ? targets : features).push_back(static_cast<float>(*value));
      if (label && classification) largest = std::max(largest, static_cast<int64_t>(*value));
    }
    ++rows;
  }
  if (columns.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": empty, expected a header row"));
  }
  if (rows == 0) return absl::InvalidArgumentError(absl::StrCat(path, ": no data rows"));

  Dataset data;
  const int64_t num_features = static_cast<int64_t>(columns.size()) - 1;
  data.features = Tensor({rows, num_features}, std::move(features));
  if (classification) {
    data.targets = Tensor({rows}, std::move(targets));
    data.num_classes = largest + 1;
  } else {
    data.targets = Tensor({rows, 1}, std::move(targets));
  }
  return data;
}

Dataset MakeSynthetic(const v1::SyntheticOptions& options, uint64_t seed, bool test_split) {
  const absl::Status valid = ValidateSynthetic(options, test_split);
  SUBSTRAX_CHECK(valid.ok(), valid.message());
  const int64_t n = SyntheticCount(options, test_split);
  const int64_t f = options.num_features();
  const int64_t outputs = options.num_outputs();
  // The model (centres or W_true, b_true) comes from a stream of its own, so both splits share
  // it; the examples come from a stream per split.
  Rng model(seed, RngStream::kSyntheticModel);
  Rng examples(seed, test_split ? RngStream::kSyntheticTest : RngStream::kSyntheticTrain);

  Dataset data;
  data.features = Tensor({n, f});
  float* x = data.features.data();
  if (options.task() == v1::SYNTHETIC_TASK_CLASSIFICATION) {
    const std::vector<double> centres = SyntheticCentres(model, outputs, f);
    const double sigma = options.noise() > 0 ? options.noise() : 1.0;
    data.targets = Tensor({n});
    data.num_classes = outputs;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t label = static_cast<int64_t>(examples.UniformInt(outputs));
      data.targets.data()[i] = static_cast<float>(label);
      for (int64_t j = 0; j < f; ++j) {
        x[i * f + j] = static_cast<float>(centres[label * f + j] + sigma * examples.Normal());
      }
    }
    return data;
  }

  std::vector<double> w(f * outputs), b(outputs);
  const double w_scale = 1.0 / std::sqrt(static_cast<double>(f));
  for (double& v : w) v = w_scale * model.Normal();
  for (double& v : b) v = model.Uniform(-1.0, 1.0);
  data.targets = Tensor({n, outputs});
  float* y = data.targets.data();
  for (int64_t i = 0; i < n; ++i) {
    float* row = x + i * f;
    for (int64_t j = 0; j < f; ++j) row[j] = static_cast<float>(examples.Normal());
    for (int64_t o = 0; o < outputs; ++o) {
      // From the stored (float) features, so that targets are exactly affine in what the model
      // sees when noise is 0. The noise is drawn even when 0: changing it keeps the features.
      double value = b[o] + options.noise() * examples.Normal();
      for (int64_t j = 0; j < f; ++j) value += static_cast<double>(row[j]) * w[j * outputs + o];
      y[i * outputs + o] = static_cast<float>(value);
    }
  }
  return data;
}

absl::StatusOr<Dataset> LoadSplit(const v1::DataSpec& spec, bool test_split, uint64_t seed,
                                  bool classification, const DataAccess& access) {
  absl::StatusOr<Dataset> data;
  switch (spec.format()) {
    case v1::DATA_FORMAT_IDX:
    case v1::DATA_FORMAT_CSV:
      data = LoadFromFiles(spec, test_split, classification, access);
      break;
    case v1::DATA_FORMAT_SYNTHETIC:
      data = LoadSynthetic(spec, test_split, seed, classification);
      break;
    default:
      data = absl::InvalidArgumentError(
          "spec.data.format: is not set; use one of idx, csv, synthetic");
  }
  if (!data.ok()) return Annotate(data.status(), test_split ? "test split" : "train split");
  return data;
}

}  // namespace substrax
