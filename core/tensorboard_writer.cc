#include "core/tensorboard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "boost/crc.hpp"
#include "tensorboard/event.pb.h"

namespace substrax {
namespace {

// Boost.CRC's parameters for CRC-32C: reflected input and output, all ones in and out.
using Crc32cComputer = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

constexpr uint32_t kMaskDelta = 0xa282ead8u;
constexpr size_t kLengthBytes = 8;
constexpr size_t kCrcBytes = 4;

void AppendLittleEndian(uint64_t value, size_t bytes, std::string* out) {
  for (size_t i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t ReadLittleEndian(absl::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = bytes.size(); i > 0; --i) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i - 1]);
  }
  return value;
}

double UnixSeconds(absl::Time t) { return absl::ToDoubleSeconds(t - absl::UnixEpoch()); }

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

absl::Status SystemError(absl::string_view what, const std::string& path, int error) {
  return absl::FailedPreconditionError(
      absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(error)));
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  Crc32cComputer crc;
  crc.process_bytes(data.data(), data.size());
  return crc.checksum();
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + kMaskDelta;
}

std::string FrameTfRecord(absl::string_view data) {
  std::string record;
  record.reserve(kLengthBytes + 2 * kCrcBytes + data.size());
  AppendLittleEndian(data.size(), kLengthBytes, &record);
  AppendLittleEndian(MaskedCrc32c(record), kCrcBytes, &record);
  record.append(data.data(), data.size());
  AppendLittleEndian(MaskedCrc32c(data), kCrcBytes, &record);
  return record;
}

absl::StatusOr<std::vector<std::string>> ParseTfRecords(absl::string_view contents) {
  std::vector<std::string> records;
  size_t offset = 0;
  while (offset < contents.size()) {
    const std::string where = absl::StrCat("TFRecord ", records.size(), " at byte ", offset);
    absl::string_view rest = contents.substr(offset);
    if (rest.size() < kLengthBytes + kCrcBytes) {
      return absl::DataLossError(absl::StrCat(where, ": cut short in its length header"));
    }
    const absl::string_view length_bytes = rest.substr(0, kLengthBytes);
    if (ReadLittleEndian(rest.substr(kLengthBytes, kCrcBytes)) != MaskedCrc32c(length_bytes)) {
      return absl::DataLossError(absl::StrCat(where, ": the CRC of its length does not match"));
    }
    const uint64_t length = ReadLittleEndian(length_bytes);
    const size_t header = kLengthBytes + kCrcBytes;
    if (length > rest.size() - header || rest.size() - header - length < kCrcBytes) {
      return absl::DataLossError(
          absl::StrCat(where, ": cut short (", length, " data bytes announced)"));
    }
    const absl::string_view data = rest.substr(header, length);
    if (ReadLittleEndian(rest.substr(header + length, kCrcBytes)) != MaskedCrc32c(data)) {
      return absl::DataLossError(absl::StrCat(where, ": the CRC of its data does not match"));
    }
    records.emplace_back(data);
    offset += header + length + kCrcBytes;
  }
  return records;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    const std::string& dir, absl::Time now) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the directory ", dir, ": ", error.message()));
  }
  const std::string base =
      absl::StrCat(dir, "/events.out.tfevents.", absl::ToUnixSeconds(now), ".", HostName());
  // Two writers in the same second on the same host (two runs into one directory) must not
  // share a file: O_EXCL picks a free name.
  std::string path = base;
  int fd = -1;
  for (int n = 1;; ++n) {
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) break;
    if (errno != EEXIST || n > 1000) return SystemError("create the event file", path, errno);
    path = absl::StrCat(base, ".", getpid(), ".", n);
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(fd, path));
  tensorboard::Event version;
  version.set_wall_time(UnixSeconds(now));
  version.set_file_version("brain.Event:2");
  writer->pending_ = FrameTfRecord(version.SerializeAsString());
  absl::Status flushed = writer->Flush();
  if (!flushed.ok()) return flushed;
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() {
  // Best effort: a caller that needs to know calls Flush first.
  Flush().IgnoreError();
  close(fd_);
}

void TensorBoardWriter::AddStep(int64_t step, absl::Time wall_time,
                                const std::vector<TensorBoardScalar>& scalars) {
  if (scalars.empty()) return;
  tensorboard::Event event;
  event.set_wall_time(UnixSeconds(wall_time));
  event.set_step(step);
  for (const TensorBoardScalar& scalar : scalars) {
    tensorboard::Summary::Value* value = event.mutable_summary()->add_value();
    value->set_tag(scalar.tag);
    value->set_simple_value(static_cast<float>(scalar.value));
  }
  pending_ += FrameTfRecord(event.SerializeAsString());
}

absl::Status TensorBoardWriter::Flush() {
  size_t written = 0;
  while (written < pending_.size()) {
    const ssize_t n = write(fd_, pending_.data() + written, pending_.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      pending_.erase(0, written);
      return SystemError("write the event file", path_, error);
    }
    written += static_cast<size_t>(n);
  }
  pending_.clear();
  return absl::OkStatus();
}

}  // namespace substrax
