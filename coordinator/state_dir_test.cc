#include "coordinator/state_dir.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::filesystem::path dir = std::filesystem::path(base != nullptr ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  return dir.string();
}

std::filesystem::perms ModeOf(const std::string& path) {
  return std::filesystem::symlink_status(path).permissions() & std::filesystem::perms::all;
}

// flock(2) locks belong to open file descriptions, so a second Acquire in the same process
// conflicts as a second coordinator would (tests/chaos/coordinator_state_test starts two).
TEST(StateDirLockTest, OneHolderAtATimeAndTheSecondIsToldWho) {
  const std::string dir = TempDir("locked") + "/state";
  absl::StatusOr<std::unique_ptr<StateDirLock>> first = StateDirLock::Acquire(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<std::unique_ptr<StateDirLock>> second = StateDirLock::Acquire(dir);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(second.status().message(),
              HasSubstr(absl::StrCat("--state-dir ", dir, " is in use by another coordinator (pid ",
                                     getpid(), ", which holds the lock on ", dir,
                                     "/coordinator.lock)")));
  first->reset();  // released (as when the holder exits, however it exits)
  EXPECT_TRUE(StateDirLock::Acquire(dir).ok());
}

TEST(StateDirLockTest, TheDirectoryAndEveryFileInItBecomePrivate) {
  const std::string dir = TempDir("narrowed");
  std::filesystem::create_directories(dir);
  std::filesystem::permissions(dir, std::filesystem::perms::all);
  std::ofstream(dir + "/rendezvous.key") << "secret\n";
  std::filesystem::permissions(dir + "/rendezvous.key", std::filesystem::perms::all);
  // A symlink is neither followed nor changed: its target is not the state's.
  std::ofstream(dir + "/../outside") << "x";
  std::filesystem::permissions(dir + "/../outside", std::filesystem::perms::all);
  std::filesystem::create_symlink(dir + "/../outside", dir + "/link");
  absl::StatusOr<std::unique_ptr<StateDirLock>> lock = StateDirLock::Acquire(dir);
  ASSERT_TRUE(lock.ok()) << lock.status();
  const auto rw = std::filesystem::perms::owner_read | std::filesystem::perms::owner_write;
  EXPECT_EQ(ModeOf(dir), std::filesystem::perms::owner_all);
  EXPECT_EQ(ModeOf(dir + "/rendezvous.key"), rw);
  EXPECT_EQ(ModeOf(dir + "/coordinator.lock"), rw);
  EXPECT_EQ(ModeOf(dir + "/../outside"), std::filesystem::perms::all);
}

TEST(StateDirLockTest, AnUnusableDirectoryIsUnavailable) {
  const std::string dir = TempDir("not-a-dir");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  absl::StatusOr<std::unique_ptr<StateDirLock>> lock = StateDirLock::Acquire(dir + "/file/state");
  EXPECT_EQ(lock.status().code(), absl::StatusCode::kUnavailable) << lock.status();
  EXPECT_THAT(lock.status().message(), HasSubstr(dir + "/file/state"));
}

}  // namespace
}  // namespace substrax
