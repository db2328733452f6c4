#include "worker/collectives/store.h"

#include <cstdlib>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  return std::string(base ? base : "/tmp") + "/" + name;
}

void ExerciseStore(Store& store) {
  ASSERT_TRUE(store.Set("a", "1").ok());
  EXPECT_EQ(*store.Get("a", absl::ZeroDuration()), "1");
  ASSERT_TRUE(store.Set("a", "two").ok());
  EXPECT_EQ(*store.Get("a", absl::Seconds(1)), "two");
  ASSERT_TRUE(store.Set("job/attempt-1/key%x", std::string("\0bin\xff", 5)).ok());
  EXPECT_EQ(*store.Get("job/attempt-1/key%x", absl::Seconds(1)), std::string("\0bin\xff", 5));

  auto missing = store.Get("never", absl::Milliseconds(20));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.status().message(), HasSubstr("never' was not set within 20ms"));

  // A getter waiting on another thread sees the value as soon as it is set.
  std::thread setter([&store] { ASSERT_TRUE(store.Set("late", "here").ok()); });
  auto late = store.Get("late", absl::Seconds(30));
  setter.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(*late, "here");
}

TEST(StoreTest, InMemory) {
  InMemoryStore store;
  ExerciseStore(store);
}

TEST(StoreTest, File) {
  auto store = FileStore::Create(TempDir("file_store"));
  ASSERT_TRUE(store.ok()) << store.status();
  ExerciseStore(**store);
  // A second store on the same directory (another process) sees the keys.
  auto other = FileStore::Create(TempDir("file_store"));
  EXPECT_EQ(*(*other)->Get("a", absl::ZeroDuration()), "two");
}

TEST(StoreTest, FileStoreReportsUnusableDirectory) {
  auto store = FileStore::Create("/proc/no/such/place");
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable);
}

TEST(StoreTest, PrefixesSeparateKeySpaces) {
  InMemoryStore base;
  PrefixStore one(&base, "attempt-1"), two(&base, "attempt-2");
  ASSERT_TRUE(one.Set("id", "x").ok());
  EXPECT_EQ(*base.Get("attempt-1/id", absl::ZeroDuration()), "x");
  EXPECT_FALSE(two.Get("id", absl::Milliseconds(1)).ok());
  ExerciseStore(two);
}

}  // namespace
}  // namespace substrax
