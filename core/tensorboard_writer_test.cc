#include "core/tensorboard_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensorboard/event.pb.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

std::string TestDir(const std::string& name) {
  const std::string dir = std::string(getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(Crc32cTest, KnownVectors) {
  // The check value of CRC-32C (RFC 3720 and the CRC catalogue).
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  // RFC 3720 B.4: 32 bytes of zeros.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
}

TEST(Crc32cTest, MaskRotatesAndAddsTheDelta) {
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(MaskedCrc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(TfRecordTest, FramingIsLengthCrcDataCrc) {
  const std::string record = FrameTfRecord("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  const uint32_t length_crc = MaskedCrc32c(record.substr(0, 8));
  EXPECT_EQ(record.substr(8, 4), std::string({static_cast<char>(length_crc & 0xff),
                                              static_cast<char>((length_crc >> 8) & 0xff),
                                              static_cast<char>((length_crc >> 16) & 0xff),
                                              static_cast<char>(length_crc >> 24)}));
  EXPECT_EQ(record.substr(12, 3), "abc");
}

TEST(TfRecordTest, RoundTrip) {
  const std::vector<std::string> records = {"", "x", std::string(1000, '\xff'),
                                            std::string("\0\1\2", 3)};
  std::string contents;
  for (const std::string& r : records) contents += FrameTfRecord(r);
  absl::StatusOr<std::vector<std::string>> parsed = ParseTfRecords(contents);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, records);
}

TEST(TfRecordTest, CorruptionAndTruncationAreDataLoss) {
  std::string contents = FrameTfRecord("first") + FrameTfRecord("second");
  std::string flipped = contents;
  flipped[flipped.size() - 6] ^= 1;  // a data byte of the second record
  absl::StatusOr<std::vector<std::string>> parsed = ParseTfRecords(flipped);
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(parsed.status().message(), HasSubstr("TFRecord 1 at byte 21"));
  parsed = ParseTfRecords(contents.substr(0, contents.size() - 1));
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(parsed.status().message(), HasSubstr("cut short"));
  std::string bad_length = contents;
  bad_length[0] = 'x';
  EXPECT_THAT(ParseTfRecords(bad_length).status().message(), HasSubstr("CRC of its length"));
}

TEST(TensorBoardWriterTest, WritesVersionThenOneEventPerStep) {
  const std::string dir = TestDir("runs/a");  // parents are created
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer = TensorBoardWriter::Create(dir, now);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_THAT((*writer)->path(), StartsWith(dir + "/events.out.tfevents.1700000000."));
  (*writer)->AddStep(10, now + absl::Seconds(1), {{"loss", 0.5}, {"loss/device_3", 0.25}});
  (*writer)->AddStep(20, now + absl::Seconds(2), {{"loss", 1.0 / 3}});
  (*writer)->AddStep(30, now, {});  // nothing
  // Nothing is written before Flush, so a reader never sees half a step.
  EXPECT_EQ(ParseTfRecords(ReadFile((*writer)->path()))->size(), 1u);
  ASSERT_TRUE((*writer)->Flush().ok());

  absl::StatusOr<std::vector<std::string>> records = ParseTfRecords(ReadFile((*writer)->path()));
  ASSERT_TRUE(records.ok()) << records.status();
  ASSERT_EQ(records->size(), 3u);
  tensorboard::Event event;
  ASSERT_TRUE(event.ParseFromString((*records)[0]));
  EXPECT_EQ(event.file_version(), "brain.Event:2");
  EXPECT_DOUBLE_EQ(event.wall_time(), 1700000000.0);
  ASSERT_TRUE(event.ParseFromString((*records)[1]));
  EXPECT_EQ(event.step(), 10);
  EXPECT_DOUBLE_EQ(event.wall_time(), 1700000001.0);
  ASSERT_EQ(event.summary().value_size(), 2);
  EXPECT_EQ(event.summary().value(0).tag(), "loss");
  EXPECT_EQ(event.summary().value(0).simple_value(), 0.5f);
  EXPECT_EQ(event.summary().value(1).tag(), "loss/device_3");
  EXPECT_EQ(event.summary().value(1).simple_value(), 0.25f);
  ASSERT_TRUE(event.ParseFromString((*records)[2]));
  EXPECT_EQ(event.step(), 20);
  EXPECT_EQ(event.summary().value(0).simple_value(), static_cast<float>(1.0 / 3));
}

TEST(TensorBoardWriterTest, TwoWritersInOneSecondGetTwoFiles) {
  const std::string dir = TestDir("twice");
  const absl::Time now = absl::FromUnixSeconds(1700000000);
  auto first = TensorBoardWriter::Create(dir, now);
  auto second = TensorBoardWriter::Create(dir, now);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE((*first)->path(), (*second)->path());
  EXPECT_THAT((*second)->path(), StartsWith((*first)->path() + "."));
}

TEST(TensorBoardWriterTest, RefusesWhatCannotBeWritten) {
  // A file where the directory should be.
  const std::string dir = TestDir("blocked");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
      TensorBoardWriter::Create(dir + "/file/sub", absl::Now());
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(writer.status().message(), HasSubstr("cannot create the directory " + dir));
}

TEST(TensorBoardWriterTest, RefusesADirectoryItMayNotWrite) {
  if (geteuid() == 0) {
    GTEST_SKIP() << "running as root, which writes anywhere: a read-only directory refuses "
                    "only a plain user";
  }
  const std::string read_only = TestDir("blocked") + "/read-only";
  std::filesystem::create_directories(read_only);
  chmod(read_only.c_str(), 0555);
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
      TensorBoardWriter::Create(read_only, absl::Now());
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(writer.status().message(), HasSubstr("Permission denied"));
}

}  // namespace
}  // namespace substrax
