#include "worker/data/safe_open.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

// A marker that stands for the contents of files a job must not see: no error may quote it.
constexpr char kSecret[] = "SECRET-7f3a9c-do-not-quote";

long Openat2Enosys(int, const char*, open_how*, size_t) {
  errno = ENOSYS;
  return -1;
}

long Openat2Eperm(int, const char*, open_how*, size_t) {
  errno = EPERM;
  return -1;
}

// The layout every test reads:
//   <tmp>/root/data.csv          a regular file
//   <tmp>/root/sub/inside.csv    a regular file
//   <tmp>/root/link.csv          -> sub/inside.csv (relative, stays inside)
//   <tmp>/root/out.csv           -> ../outside.txt (leads out)
//   <tmp>/root/abs.csv           -> <tmp>/root/data.csv (absolute)
//   <tmp>/root/fifo              a FIFO nobody writes
//   <tmp>/root/sub/up            -> .. (a directory symlink that stays inside)
//   <tmp>/outside.txt            holds kSecret
class SafeOpenTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    base_ = fs::path(tmp != nullptr ? tmp : "/tmp") / "safe_open_test";
    fs::remove_all(base_);
    root_ = (base_ / "root").string();
    fs::create_directories(base_ / "root" / "sub");
    Write(root_ + "/data.csv", "x,y\n1,2\n");
    Write(root_ + "/sub/inside.csv", "x,y\n3,4\n");
    Write((base_ / "outside.txt").string(), kSecret);
    fs::create_symlink("sub/inside.csv", root_ + "/link.csv");
    fs::create_symlink("../outside.txt", root_ + "/out.csv");
    fs::create_symlink(root_ + "/data.csv", root_ + "/abs.csv");
    fs::create_directory_symlink("..", root_ + "/sub/up");
    ASSERT_EQ(mkfifo((root_ + "/fifo").c_str(), 0600), 0);
    access_ = DataAccess::Confined({root_});
    // The parameter: openat2 unavailable (the fallback for old kernels and seccomp filters).
    if (GetParam()) access_.openat2 = &Openat2Enosys;
  }

  static void Write(const std::string& path, const std::string& content) {
    std::ofstream(path, std::ios::binary) << content;
  }

  absl::Status Open(const std::string& path) {
    int64_t size = -1;
    absl::StatusOr<ScopedFd> fd = OpenDataFile(path, access_, &size);
    if (fd.ok()) {
      EXPECT_GE(fd->get(), 0);
      EXPECT_GT(size, 0);
      // Reads block: O_NONBLOCK is gone.
      EXPECT_EQ(fcntl(fd->get(), F_GETFL) & O_NONBLOCK, 0);
    }
    return fd.status();
  }

  bool fallback() const { return GetParam(); }

  fs::path base_;
  std::string root_;
  DataAccess access_;
};

INSTANTIATE_TEST_SUITE_P(Openat2OrFallback, SafeOpenTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Fallback" : "Openat2";
                         });

TEST_P(SafeOpenTest, OpensRegularFilesUnderTheRoot) {
  EXPECT_TRUE(Open(root_ + "/data.csv").ok());
  EXPECT_TRUE(Open(root_ + "/sub/inside.csv").ok());
}

TEST_P(SafeOpenTest, FollowsARelativeSymlinkThatStaysInsideOnlyWithOpenat2) {
  const absl::Status s = Open(root_ + "/link.csv");
  if (!fallback()) {
    EXPECT_TRUE(s.ok()) << s;
    EXPECT_TRUE(Open(root_ + "/sub/up/data.csv").ok());
  } else {
    // Without openat2, no symlink is followed, wherever it leads.
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_THAT(s.message(), HasSubstr("'link.csv' under data root " + root_ + " is a symlink"));
    const absl::Status up = Open(root_ + "/sub/up/data.csv");
    EXPECT_EQ(up.code(), absl::StatusCode::kPermissionDenied) << up;
    EXPECT_THAT(up.message(), HasSubstr("'sub/up' under data root"));
  }
}

TEST_P(SafeOpenTest, RefusesASymlinkOutOfTheRoot) {
  const absl::Status s = Open(root_ + "/out.csv");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(s.message(), HasSubstr(root_ + "/out.csv"));
  EXPECT_THAT(s.message(), Not(HasSubstr(kSecret)));
  // An absolute symlink is refused even when it points inside: RESOLVE_BENEATH cannot tell.
  EXPECT_EQ(Open(root_ + "/abs.csv").code(), absl::StatusCode::kPermissionDenied);
}

TEST_P(SafeOpenTest, RefusesTraversalAndPathsOutsideTheRoots) {
  const absl::Status dots = Open(root_ + "/../outside.txt");
  EXPECT_EQ(dots.code(), absl::StatusCode::kInvalidArgument) << dots;
  EXPECT_THAT(dots.message(), HasSubstr("'..' component"));
  const absl::Status outside = Open((base_ / "outside.txt").string());
  EXPECT_EQ(outside.code(), absl::StatusCode::kPermissionDenied) << outside;
  EXPECT_THAT(outside.message(), HasSubstr("is not under a data root of this worker (" + root_));
  EXPECT_EQ(Open("data.csv").code(), absl::StatusCode::kInvalidArgument);
  // A sibling whose name starts like the root is not under it.
  fs::create_directories(base_ / "rootx");
  Write((base_ / "rootx" / "a.csv").string(), kSecret);
  EXPECT_EQ(Open((base_ / "rootx" / "a.csv").string()).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_P(SafeOpenTest, RefusesProcDevFifosAndDirectoriesWithoutBlocking) {
  access_.roots.push_back("/proc");
  access_.roots.push_back("/dev");
  for (const std::string& path : {std::string("/proc/self/environ"), std::string("/dev/zero"),
                                  root_ + "/fifo", root_ + "/sub", root_}) {
    const absl::Status s = Open(path);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << path << ": " << s;
    EXPECT_THAT(s.message(), HasSubstr(path));
  }
  EXPECT_THAT(Open(root_ + "/fifo").message(), HasSubstr("is a FIFO"));
  EXPECT_THAT(Open("/dev/zero").message(), HasSubstr("is a character device"));
  EXPECT_THAT(Open(root_ + "/sub").message(), HasSubstr("is a directory"));
  // Without openat2 "/proc/self" is refused as a symlink before the file is reached.
  if (!fallback()) {
    EXPECT_THAT(Open("/proc/self/environ").message(), HasSubstr("/proc or /sys"));
  }
}

TEST_P(SafeOpenTest, WithoutRootsNothingOpensAndMissingFilesAreNotFound) {
  access_.roots.clear();
  const absl::Status s = Open(root_ + "/data.csv");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(s.message(), HasSubstr("no data roots (start its daemon with --data-root DIR)"));
  access_.roots = {root_};
  EXPECT_EQ(Open(root_ + "/missing.csv").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(Open(root_ + "/nodir/missing.csv").code(), absl::StatusCode::kNotFound);
}

TEST_P(SafeOpenTest, RefusesFilesOverTheSizeLimit) {
  access_.max_file_bytes = 4;
  const absl::Status s = Open(root_ + "/data.csv");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("8 bytes, more than the limit of 4"));
}

TEST(SafeOpenFallbackTest, EpermFromASeccompFilterAlsoFallsBack) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path root = fs::path(tmp != nullptr ? tmp : "/tmp") / "eperm_root";
  fs::create_directories(root);
  std::ofstream(root / "a.csv") << "x,y\n1,2\n";
  DataAccess access = DataAccess::Confined({root.string()});
  access.openat2 = &Openat2Eperm;
  EXPECT_TRUE(OpenDataFile((root / "a.csv").string(), access, nullptr).ok());
}

TEST(SafeOpenUnconfinedTest, ReadsAnyRegularFileButStillNoDevicesFifosOrProc) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(tmp != nullptr ? tmp : "/tmp") / "unconfined";
  fs::create_directories(dir);
  std::ofstream(dir / "a.csv") << "x,y\n1,2\n";
  const DataAccess any = DataAccess::Unconfined();
  EXPECT_TRUE(OpenDataFile((dir / "a.csv").string(), any, nullptr).ok());
  EXPECT_EQ(OpenDataFile("/dev/zero", any, nullptr).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(OpenDataFile("/proc/self/environ", any, nullptr).status().code(),
            absl::StatusCode::kPermissionDenied);
  const std::string fifo = (dir / "fifo").string();
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(OpenDataFile(fifo, any, nullptr).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace substrax
