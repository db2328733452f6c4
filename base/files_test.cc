#include "base/files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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

TEST(OpenRegularFileNoFollowTest, OnlyARegularFileAtThePathItself) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/plain", "x").ok());
  struct stat st;
  const int fd = OpenRegularFileNoFollow(dir + "/plain", &st);
  ASSERT_GE(fd, 0);
  EXPECT_EQ(st.st_size, 1);
  close(fd);
  // A link is not followed, even to a regular file; a FIFO is not waited on; neither is opened.
  ASSERT_EQ(symlink((dir + "/plain").c_str(), (dir + "/link").c_str()), 0);
  EXPECT_EQ(OpenRegularFileNoFollow(dir + "/link", &st), -1);
  EXPECT_EQ(errno, ELOOP);
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(OpenRegularFileNoFollow(dir + "/fifo", &st), -1);
  EXPECT_EQ(errno, 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(OpenRegularFileNoFollow(dir + "/missing", &st), -1);
  EXPECT_EQ(errno, ENOENT);
}

}  // namespace
}  // namespace substrax
