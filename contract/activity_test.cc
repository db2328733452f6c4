#include "contract/activity.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <thread>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

TEST(ActivityTest, WhatTheWriterPublishesTheReaderSees) {
  const std::string path = TempPath("activity");
  absl::StatusOr<std::unique_ptr<ActivityBoard>> board = ActivityBoard::Create(path);
  ASSERT_TRUE(board.ok()) << board.status();
  const int d3 = (*board)->DeviceSlot(3);
  EXPECT_EQ((*board)->DeviceSlot(3), d3);  // the same device, the same slot
  (*board)->SetPhase(d3, ActivityPhase::kCompute, 812);
  const int g = (*board)->GroupSlot("axis 'data' group 0", 3, 2, 4);
  for (int i = 0; i < 4061; ++i) (*board)->Enter(g, CollectiveKind::kAllReduce, 1024);
  for (int i = 0; i < 4060; ++i) (*board)->Complete(g);

  absl::StatusOr<v1::ProcessActivity> read = ReadActivityFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->devices_size(), 1);
  EXPECT_EQ(read->devices(0).device_id(), 3);
  EXPECT_EQ(read->devices(0).step(), 812);
  EXPECT_EQ(read->devices(0).phase(), "compute");
  EXPECT_GT(read->devices(0).since().seconds(), 1700000000);
  ASSERT_EQ(read->collectives_size(), 1);
  const v1::CollectiveCounter& c = read->collectives(0);
  EXPECT_EQ(c.group(), "axis 'data' group 0");
  EXPECT_EQ(c.device_id(), 3);
  EXPECT_EQ(c.rank(), 2);
  EXPECT_EQ(c.size(), 4);
  EXPECT_EQ(c.entered(), 4061);
  EXPECT_EQ(c.completed(), 4060);
  EXPECT_EQ(c.last_kind(), "all_reduce");
  EXPECT_EQ(c.last_count(), 1024);
}

TEST(ActivityTest, SlotsRunOutWithoutHarm) {
  absl::StatusOr<std::unique_ptr<ActivityBoard>> board =
      ActivityBoard::Create(TempPath("full"));
  ASSERT_TRUE(board.ok());
  for (int i = 0; i < kActivityDeviceSlots; ++i) EXPECT_GE((*board)->DeviceSlot(i), 0);
  EXPECT_EQ((*board)->DeviceSlot(kActivityDeviceSlots), -1);
  for (int i = 0; i < kActivityGroupSlots; ++i) EXPECT_GE((*board)->GroupSlot("g", 0, 0, 1), 0);
  EXPECT_EQ((*board)->GroupSlot("g", 0, 0, 1), -1);
  // A slot of -1 is a no-op, not a crash.
  (*board)->SetPhase(-1, ActivityPhase::kData, 1);
  (*board)->Enter(-1, CollectiveKind::kBarrier, 0);
  (*board)->Complete(-1);
}

TEST(ActivityTest, TheReaderRefusesWhatIsNotAnActivityFile) {
  EXPECT_EQ(ReadActivityFile(TempPath("missing")).status().code(), absl::StatusCode::kNotFound);
  const std::string other = TempPath("other");
  std::ofstream(other) << std::string(ActivityFileBytes(), 'x');
  EXPECT_EQ(ReadActivityFile(other).status().code(), absl::StatusCode::kDataLoss);
  const std::string short_file = TempPath("short");
  std::ofstream(short_file) << "SXACT01";
  EXPECT_EQ(ReadActivityFile(short_file).status().code(), absl::StatusCode::kDataLoss);
  // Never through a symbolic link (a job could point its path at a file of the agent's).
  absl::StatusOr<std::unique_ptr<ActivityBoard>> board = ActivityBoard::Create(TempPath("real"));
  ASSERT_TRUE(board.ok());
  const std::string link = TempPath("link");
  ASSERT_EQ(symlink(TempPath("real").c_str(), link.c_str()), 0);
  EXPECT_FALSE(ReadActivityFile(link).ok());
}

TEST(ActivityTest, NamesAreCutAndMadePrintable) {
  const std::string path = TempPath("names");
  absl::StatusOr<std::unique_ptr<ActivityBoard>> board = ActivityBoard::Create(path);
  ASSERT_TRUE(board.ok());
  (*board)->GroupSlot(std::string(200, 'n'), 0, 0, 2);
  (*board)->GroupSlot("bad\xff\n", 0, 0, 2);
  absl::StatusOr<v1::ProcessActivity> read = ReadActivityFile(path);
  ASSERT_TRUE(read.ok());
  ASSERT_EQ(read->collectives_size(), 2);
  EXPECT_EQ(read->collectives(0).group(), std::string(kActivityNameBytes - 1, 'n'));
  EXPECT_EQ(read->collectives(1).group(), "bad??");
}

TEST(ActivityTest, TheProcessBoardAndTheThreadsDevice) {
  EXPECT_EQ(ThreadActivityDevice(), -1);
  SetThreadActivityDevice(5);
  EXPECT_EQ(ThreadActivityDevice(), 5);
  std::thread other([] { EXPECT_EQ(ThreadActivityDevice(), -1); });
  other.join();
  EXPECT_EQ(ProcessActivityBoard(), nullptr);
  absl::StatusOr<std::unique_ptr<ActivityBoard>> board = ActivityBoard::Create(TempPath("p"));
  ASSERT_TRUE(board.ok());
  ActivityBoard* raw = board->get();
  InstallProcessActivityBoard(std::move(*board));
  EXPECT_EQ(ProcessActivityBoard(), raw);
}

}  // namespace
}  // namespace substrax
