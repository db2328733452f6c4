#include "agent/work_files.h"

#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// A file of `bytes` bytes whose modification time is `age` before `now`.
void MakeFile(const std::string& path, size_t bytes, absl::Time now, absl::Duration age) {
  std::ofstream(path, std::ios::binary) << std::string(bytes, 'x');
  const timeval when = absl::ToTimeval(now - age);
  const timeval times[2] = {when, when};
  ASSERT_EQ(utimes(path.c_str(), times), 0) << path;
}

void MakeAttempt(const std::string& dir, const std::string& prefix, size_t log_bytes,
                 absl::Time now, absl::Duration age) {
  for (const char* kind : {".launch", ".result"}) {
    MakeFile(absl::StrCat(dir, "/", prefix, "-process-0", kind), 100, now, age);
  }
  MakeFile(absl::StrCat(dir, "/", prefix, "-process-0.log"), log_bytes, now, age);
}

bool Exists(const std::string& dir, const std::string& prefix) {
  return fs::exists(absl::StrCat(dir, "/", prefix, "-process-0.log"));
}

TEST(WorkFilesTest, TailOfALargeFileReadsOnlyTheEnd) {
  const std::string path = TempDir("tail") + "/big.log";
  {
    std::ofstream out(path, std::ios::binary);
    const std::string line(1023, 'a');
    for (int i = 0; i < 64 * 1024; ++i) out << line << '\n';  // 64 MiB
    out << "the last line\n";
  }
  absl::StatusOr<std::string> tail = TailOfFile(path, 2000);
  ASSERT_TRUE(tail.ok()) << tail.status();
  EXPECT_EQ(tail->size(), 2003u);
  EXPECT_TRUE(absl::StartsWith(*tail, "...a"));
  EXPECT_TRUE(absl::EndsWith(*tail, "the last line\n"));
}

TEST(WorkFilesTest, TailOfASmallFileIsTheWholeFile) {
  const std::string path = TempDir("tail-small") + "/small.log";
  std::ofstream(path) << "only this\n";
  EXPECT_EQ(*TailOfFile(path, 2000), "only this\n");
  const absl::StatusOr<std::string> missing = TailOfFile(path + ".missing", 10);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::StrContains(missing.status().message(), path + ".missing"));
}

TEST(WorkFilesTest, CleanupDeletesEndedAttemptsPastTheAgeButNeverRunningOnes) {
  const std::string dir = TempDir("age");
  const absl::Time now = absl::Now();
  MakeAttempt(dir, "old-attempt-1", 10, now, absl::Hours(24 * 8));
  MakeAttempt(dir, "old-running-attempt-2", 10, now, absl::Hours(24 * 30));
  MakeAttempt(dir, "new-attempt-1", 10, now, absl::Hours(1));
  MakeFile(dir + "/unrelated.txt", 10, now, absl::Hours(24 * 365));
  LogRetention retention;
  retention.max_age = absl::Hours(24 * 7);
  absl::StatusOr<CleanupResult> r =
      CleanWorkDir(dir, retention, {AttemptFilePrefix("old-running", 2)}, now);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->attempts_deleted, 1);
  EXPECT_EQ(r->bytes_deleted, 210);
  EXPECT_TRUE(r->errors.empty());
  EXPECT_FALSE(Exists(dir, "old-attempt-1"));
  EXPECT_FALSE(fs::exists(dir + "/old-attempt-1-process-0.result"));
  EXPECT_TRUE(Exists(dir, "old-running-attempt-2"));
  EXPECT_TRUE(Exists(dir, "new-attempt-1"));
  EXPECT_TRUE(fs::exists(dir + "/unrelated.txt"));
}

TEST(WorkFilesTest, CleanupDeletesOldestFirstUntilUnderTheBudget) {
  const std::string dir = TempDir("budget");
  const absl::Time now = absl::Now();
  // Each attempt takes 1200 bytes; the running one is the oldest and the largest.
  MakeAttempt(dir, "running-attempt-1", 5000, now, absl::Hours(10));
  MakeAttempt(dir, "a-attempt-1", 1000, now, absl::Hours(5));
  MakeAttempt(dir, "b-attempt-1", 1000, now, absl::Hours(4));
  MakeAttempt(dir, "c-attempt-1", 1000, now, absl::Hours(3));
  LogRetention retention;
  retention.max_bytes = 5200 + 1200;  // the running attempt and one more
  absl::StatusOr<CleanupResult> r =
      CleanWorkDir(dir, retention, {AttemptFilePrefix("running", 1)}, now);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->attempts_deleted, 2);
  EXPECT_EQ(r->bytes_kept, 6400);
  EXPECT_TRUE(Exists(dir, "running-attempt-1"));
  EXPECT_FALSE(Exists(dir, "a-attempt-1"));
  EXPECT_FALSE(Exists(dir, "b-attempt-1"));
  EXPECT_TRUE(Exists(dir, "c-attempt-1"));
  // A budget the running attempt alone exceeds deletes every ended attempt and nothing else.
  retention.max_bytes = 100;
  r = CleanWorkDir(dir, retention, {AttemptFilePrefix("running", 1)}, now);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(Exists(dir, "running-attempt-1"));
  EXPECT_FALSE(Exists(dir, "c-attempt-1"));
}

TEST(WorkFilesTest, CleanupOfAMissingDirectoryNamesIt) {
  const absl::StatusOr<CleanupResult> r =
      CleanWorkDir("/nonexistent/substrax-work", LogRetention(), {}, absl::Now());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "/nonexistent/substrax-work"));
}

TEST(WorkFilesTest, ParsesRetentionAndBudget) {
  EXPECT_EQ(*ParseRetention("7d"), absl::Hours(168));
  EXPECT_EQ(*ParseRetention("36h"), absl::Hours(36));
  EXPECT_EQ(*ParseRetention("0"), absl::ZeroDuration());
  EXPECT_FALSE(ParseRetention("a week").ok());
  EXPECT_FALSE(ParseRetention("-1d").ok());
  EXPECT_EQ(*ParseByteSize("1GiB"), int64_t{1} << 30);
  EXPECT_EQ(*ParseByteSize("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseByteSize("4096"), 4096);
  EXPECT_EQ(*ParseByteSize("0"), 0);
  EXPECT_FALSE(ParseByteSize("1GB").ok());
  EXPECT_FALSE(ParseByteSize("-1MiB").ok());
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

TEST(WorkFilesTest, CleanupDeletesLaunchAndStartedFilesWithTheirAttempt) {
  const std::string dir = TempDir("launch_files");
  const absl::Time now = absl::Now();
  // ".assignment": an older agent's file; ".launch.tmp.a1b2c3": an atomic write cut short.
  for (const char* kind :
       {".assignment", ".launch", ".started", ".log", ".result", ".launch.tmp.a1b2c3"}) {
    std::ofstream(dir + "/prog-1-attempt-1-process-0" + kind) << "x";
  }
  LogRetention retention;
  retention.max_age = absl::ZeroDuration();
  retention.max_bytes = 1;
  absl::StatusOr<CleanupResult> r = CleanWorkDir(dir, retention, {}, now);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->attempts_deleted, 1);
  EXPECT_EQ(r->bytes_deleted, 6);
  EXPECT_TRUE(fs::is_empty(dir));
}

// The permission bits of `path`.
mode_t ModeOf(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0;
}

TEST(WorkDirTest, ACreatedWorkDirIsTheOwnersAlone) {
  const std::string dir = TempDir("prepare") + "/new/work";
  ASSERT_TRUE(PrepareWorkDir(dir).ok());
  EXPECT_EQ(ModeOf(dir), 0700u);
  // An existing one of the agent's own that others may read is made 0700; a second call is fine.
  const std::string open_dir = TempDir("prepare_open");
  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  ASSERT_TRUE(PrepareWorkDir(open_dir).ok());
  EXPECT_EQ(ModeOf(open_dir), 0700u);
  EXPECT_TRUE(PrepareWorkDir(open_dir).ok());
}

TEST(WorkDirTest, ASymlinkOrAFileIsRefused) {
  const std::string base = TempDir("prepare_refused");
  const std::string target = base + "/target";
  fs::create_directories(target);
  fs::create_symlink(target, base + "/link");
  absl::Status link = PrepareWorkDir(base + "/link");
  EXPECT_EQ(link.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(link.message(), absl::StrCat("work dir ", base, "/link is a symbolic link, which the "
                                         "agent does not follow; remove it or give another "
                                         "--work-dir"));
  std::ofstream(base + "/file") << "x";
  absl::Status file = PrepareWorkDir(base + "/file");
  EXPECT_EQ(file.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(file.message(), "/file is not a directory")) << file;
}

TEST(WorkDirTest, AnotherUsersDirectoryIsRefused) {
  if (geteuid() != 0) {
    // Only root can make a directory another user's; CI runs as root and must not skip.
    if (const char* ci = std::getenv("CI"); ci != nullptr && std::string(ci) == "true") {
      FAIL() << "CI=true but not root: this test needs root";
    }
    GTEST_SKIP() << "needs root to chown a directory to another user";
  }
  const std::string dir = TempDir("prepare_other");
  ASSERT_EQ(chown(dir.c_str(), 65534, 65534), 0);
  absl::Status other = PrepareWorkDir(dir);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(other.message(),
                                "is owned by uid 65534, not by this agent's user (uid 0) or root"))
      << other;
}

TEST(WorkDirTest, TheDefaultIsPerUser) {
  const std::string saved = std::getenv("XDG_RUNTIME_DIR") ? std::getenv("XDG_RUNTIME_DIR") : "";
  setenv("XDG_RUNTIME_DIR", "/run/user/1234", 1);
  EXPECT_EQ(DefaultWorkDir(), "/run/user/1234/substrax-agent");
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(DefaultWorkDir(), geteuid() == 0 ? std::string("/var/lib/substrax-agent")
                                             : absl::StrCat("/tmp/substrax-agent-", geteuid()));
  if (!saved.empty()) setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
}

// A job user's directory (launch.h) counts with what it holds and goes as a whole; a link in
// it is deleted, never what it points to.
TEST(WorkFilesTest, CleanupDeletesAJobUsersDirectoryWithItsAttempt) {
  const std::string dir = TempDir("job-dirs");
  const absl::Time now = absl::Now();
  for (const char* prefix : {"old-attempt-1", "new-attempt-1"}) {
    const std::string job_dir = absl::StrCat(dir, "/", prefix, "-process-0.job");
    fs::create_directories(job_dir + "/more");
    const absl::Duration age = prefix[0] == 'o' ? absl::Hours(24 * 8) : absl::Hours(1);
    MakeFile(job_dir + "/launch", 100, now, age);
    MakeFile(job_dir + "/more/left", 1000, now, age);
    MakeFile(absl::StrCat(dir, "/", prefix, "-process-0.log"), 10, now, age);
    fs::create_symlink(dir + "/keep.txt", job_dir + "/link");
    // The link and the directories are as old as the files.
    const timeval when = absl::ToTimeval(now - age);
    const timeval times[2] = {when, when};
    for (const std::string& path : {job_dir + "/link", job_dir + "/more", job_dir}) {
      ASSERT_EQ(lutimes(path.c_str(), times), 0) << path;
    }
  }
  MakeFile(dir + "/keep.txt", 10, now, absl::Hours(24 * 365));
  LogRetention retention;
  retention.max_age = absl::Hours(24 * 7);
  retention.max_bytes = 0;
  absl::StatusOr<CleanupResult> result = CleanWorkDir(dir, retention, {}, now);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->attempts_deleted, 1);
  EXPECT_FALSE(fs::exists(dir + "/old-attempt-1-process-0.job"));
  EXPECT_FALSE(Exists(dir, "old-attempt-1"));
  EXPECT_TRUE(fs::exists(dir + "/new-attempt-1-process-0.job/more/left"));
  EXPECT_TRUE(fs::exists(dir + "/keep.txt"));
  EXPECT_GE(result->bytes_deleted, 1110);
  EXPECT_GE(result->bytes_kept, 1110);
  EXPECT_TRUE(result->errors.empty());
}

}  // namespace
}  // namespace substrax
