#include "base/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

std::string TempDir() {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                 "/files_test.XXXXXX");
  return mkdtemp(dir.data()) ? dir : "";
}

TEST(WriteFileAtomicallyTest, WritesTheWholeContentsWithTheMode) {
  const std::string dir = TempDir();
  const std::string path = dir + "/key.pem";
  ASSERT_TRUE(WriteFileAtomically(path, "secret", 0600).ok());
  EXPECT_EQ(*ReadWholeFile(path), "secret");
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  // Replacing keeps no temporary file behind.
  ASSERT_TRUE(WriteFileAtomically(path, "other").ok());
  EXPECT_EQ(*ReadWholeFile(path), "other");
  EXPECT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644);
}

TEST(WriteFileAtomicallyTest, ConcurrentWritersLeaveOneWholeValue) {
  const std::string dir = TempDir();
  const std::string path = dir + "/value";
  const std::string a(1 << 20, 'a');
  const std::string b(1 << 20, 'b');
  std::vector<std::thread> writers;
  for (int i = 0; i < 8; ++i) {
    writers.emplace_back([&, i] { ASSERT_TRUE(WriteFileAtomically(path, i % 2 ? a : b).ok()); });
  }
  for (std::thread& t : writers) t.join();
  const std::string read = *ReadWholeFile(path);
  EXPECT_TRUE(read == a || read == b);
}

TEST(WriteFileAtomicallyTest, AMissingDirectoryIsAnErrorNamingThePath) {
  const absl::Status status = WriteFileAtomically("/nonexistent-dir/x", "y");
  EXPECT_TRUE(absl::IsNotFound(status)) << status;
  EXPECT_NE(status.message().find("/nonexistent-dir/x"), std::string::npos) << status;
}

TEST(ReadWholeFileTest, AMissingFileIsNotFound) {
  const absl::StatusOr<std::string> read = ReadWholeFile("/nonexistent-dir/x");
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
}

}  // namespace
}  // namespace substrax
