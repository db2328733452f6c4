#include "coordinator/queues_file.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kGood[] = R"(queues:
  - name: research
    quotas: [{backend: cpu, devices: 4}]
priority_classes:
  - {name: high, value: 1000}
)";

constexpr char kBetter[] = R"(queues:
  - name: research
    quotas: [{backend: cpu, devices: 8}]
priority_classes:
  - {name: high, value: 1000}
)";

class QueuesFileTest : public ::testing::Test {
 protected:
  void Write(const std::string& text) {
    std::ofstream(path_, std::ios::trunc) << text;
  }
  const std::string path_ = std::string(::testing::TempDir()) + "/queues.yaml";
  const absl::Time t0_ = absl::FromUnixSeconds(1'800'000'000);
};

TEST_F(QueuesFileTest, AChangedFileIsAppliedAndABadOneRefusedKeepingTheOld) {
  Write(kGood);
  absl::StatusOr<QueuesFile> file = QueuesFile::Load(path_, t0_);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->config().queues(0).quotas(0).devices(), 4);
  EXPECT_EQ(file->loaded_at(), t0_);

  QueuesFile::Change same = file->Poll(t0_ + absl::Seconds(1));
  EXPECT_FALSE(same.config.has_value());
  EXPECT_THAT(same.refused, IsEmpty());

  Write("queues:\n  - name: Research!\n");
  QueuesFile::Change bad = file->Poll(t0_ + absl::Seconds(2));
  EXPECT_FALSE(bad.config.has_value());
  EXPECT_THAT(bad.refused, HasSubstr("queues[0].name"));
  EXPECT_THAT(file->error(), HasSubstr("queues[0].name"));
  EXPECT_EQ(file->config().queues(0).quotas(0).devices(), 4);  // the old one stays
  EXPECT_THAT(file->Poll(t0_ + absl::Seconds(3)).refused, IsEmpty());  // said once

  Write(kBetter);
  QueuesFile::Change better = file->Poll(t0_ + absl::Seconds(4));
  ASSERT_TRUE(better.config.has_value());
  EXPECT_EQ(better.config->queues(0).quotas(0).devices(), 8);
  EXPECT_THAT(file->error(), IsEmpty());
  EXPECT_EQ(file->loaded_at(), t0_ + absl::Seconds(4));

  std::remove(path_.c_str());
  EXPECT_THAT(file->Poll(t0_ + absl::Seconds(5)).refused, HasSubstr("cannot open"));
  EXPECT_EQ(file->config().queues(0).quotas(0).devices(), 8);
}

TEST_F(QueuesFileTest, ABadOrMissingFileRefusesTheStart) {
  EXPECT_EQ(QueuesFile::Load(path_ + ".missing", t0_).status().code(),
            absl::StatusCode::kNotFound);
  Write("queues: [{name: a, quotas: [{backend: tpu, devices: 1}]}]\n");
  absl::StatusOr<QueuesFile> bad = QueuesFile::Load(path_, t0_);
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("queues[0].quotas[0].backend"));
}

}  // namespace
}  // namespace substrax
