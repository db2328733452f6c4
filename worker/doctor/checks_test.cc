#include "worker/doctor/checks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax::doctor {
namespace {

using ::testing::HasSubstr;

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::create_directories(dir);
  return dir;
}

TEST(DoctorChecksTest, AReadableDataRootAndAWritableDirAreOk) {
  const Finding data = CheckDataRoot(Dir("data"));
  EXPECT_EQ(data.verdict, Verdict::kOk) << data.seen;
  EXPECT_THAT(data.seen, HasSubstr("readable"));
  const Finding ckpt = CheckWritableDir("checkpoint root", Dir("ckpt"), SpaceLimits{0, 0});
  EXPECT_EQ(ckpt.verdict, Verdict::kOk) << ckpt.seen;
  EXPECT_THAT(ckpt.seen, HasSubstr("writable, "));
  EXPECT_TRUE(std::filesystem::is_empty(Dir("ckpt")));  // the probe is removed
}

TEST(DoctorChecksTest, AMissingOrUnreadableRootIsAProblemWithWhatToDo) {
  const Finding missing = CheckDataRoot(Dir("x") + "/missing");
  EXPECT_EQ(missing.verdict, Verdict::kProblem);
  EXPECT_THAT(missing.seen, HasSubstr("No such file or directory"));
  EXPECT_THAT(missing.fix, HasSubstr("create it or mount the data there"));
  if (geteuid() == 0) GTEST_SKIP() << "root reads any directory: the permission case needs a user";
  const std::string closed = Dir("closed");
  chmod(closed.c_str(), 0);
  const Finding unreadable = CheckDataRoot(closed);
  chmod(closed.c_str(), 0700);
  EXPECT_EQ(unreadable.verdict, Verdict::kProblem);
  EXPECT_THAT(unreadable.fix, HasSubstr("read and execute permission"));
}

TEST(DoctorChecksTest, LittleFreeSpaceIsAWarningThenAProblem) {
  const std::string dir = Dir("space");
  const int64_t huge = int64_t{1} << 60;
  EXPECT_EQ(CheckWritableDir("work dir", dir, SpaceLimits{huge, 0}).verdict, Verdict::kWarning);
  const Finding full = CheckWritableDir("work dir", dir, SpaceLimits{huge, huge});
  EXPECT_EQ(full.verdict, Verdict::kProblem);
  EXPECT_THAT(full.fix, HasSubstr("free space there"));
}

TEST(DoctorChecksTest, TheHostsChecksCoverEveryRoot) {
  const std::vector<Finding> all =
      CheckHost({Dir("d1"), Dir("d2")}, {Dir("c1")}, Dir("work"), SpaceLimits{0, 0});
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(all[0].check, "cpu");
  EXPECT_THAT(all[4].check, HasSubstr("work dir "));
}

}  // namespace
}  // namespace substrax::doctor
