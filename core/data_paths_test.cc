#include "core/data_paths.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;

TEST(DataPathsTest, Dns1123Label) {
  EXPECT_TRUE(IsDns1123Label("a"));
  EXPECT_TRUE(IsDns1123Label("fashion-mnist-1"));
  EXPECT_TRUE(IsDns1123Label(std::string(63, 'a')));
  EXPECT_FALSE(IsDns1123Label(std::string(64, 'a')));
  EXPECT_TRUE(IsDns1123Label(std::string(52, 'a'), kMaxJobNameLength));
  EXPECT_FALSE(IsDns1123Label(std::string(53, 'a'), kMaxJobNameLength));
  for (const char* bad : {"", "-a", "a-", "A", "a_b", "a.b", "a/b", "../../escape", "a b", ".."}) {
    EXPECT_FALSE(IsDns1123Label(bad)) << bad;
  }
}

TEST(DataPathsTest, NormalizedAbsolute) {
  for (const char* good : {"/", "/data", "/data/x.csv", "/a/b/c"}) {
    EXPECT_TRUE(CheckNormalizedAbsolute(good).ok()) << good;
  }
  EXPECT_THAT(CheckNormalizedAbsolute("data/x").message(), HasSubstr("not an absolute path"));
  EXPECT_THAT(CheckNormalizedAbsolute("").message(), HasSubstr("not an absolute path"));
  EXPECT_THAT(CheckNormalizedAbsolute("/data//x").message(), HasSubstr("empty component"));
  EXPECT_THAT(CheckNormalizedAbsolute("/data/").message(), HasSubstr("empty component"));
  EXPECT_THAT(CheckNormalizedAbsolute("/data/./x").message(), HasSubstr("'.' component"));
  EXPECT_THAT(CheckNormalizedAbsolute("/data/../etc/passwd").message(),
              HasSubstr("'..' component"));
  EXPECT_EQ(CheckNormalizedAbsolute("/data/..").code(), absl::StatusCode::kInvalidArgument);
}

TEST(DataPathsTest, NormalizeAbsolute) {
  EXPECT_EQ(*NormalizeAbsolute("/data/"), "/data");
  EXPECT_EQ(*NormalizeAbsolute("//data//./sets/"), "/data/sets");
  EXPECT_EQ(*NormalizeAbsolute("/"), "/");
  EXPECT_EQ(*NormalizeAbsolute("/./"), "/");
  EXPECT_FALSE(NormalizeAbsolute("data").ok());
  EXPECT_FALSE(NormalizeAbsolute("/data/../etc").ok());
}

TEST(DataPathsTest, UnderRootOnComponentBoundaries) {
  EXPECT_TRUE(IsUnderRoot("/data/x", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data", "/data"));
  EXPECT_TRUE(IsUnderRoot("/data/a/b", "/data"));
  EXPECT_FALSE(IsUnderRoot("/database/x", "/data"));
  EXPECT_FALSE(IsUnderRoot("/dat", "/data"));
  EXPECT_FALSE(IsUnderRoot("/etc/passwd", "/data"));
  EXPECT_TRUE(IsUnderRoot("/etc/passwd", "/"));
  const std::vector<std::string> roots = {"/data", "/data/sets", "/srv"};
  ASSERT_NE(FindRoot("/data/sets/x", roots), nullptr);
  EXPECT_EQ(*FindRoot("/data/sets/x", roots), "/data/sets");
  EXPECT_EQ(*FindRoot("/data/setsx", roots), "/data");
  EXPECT_EQ(FindRoot("/proc/self/environ", roots), nullptr);
}

TEST(DataPathsTest, DataPathsNameTheirFields) {
  v1::DataSpec data;
  data.mutable_train()->set_images("/d/ti");
  data.mutable_train()->set_labels("/d/tl");
  data.mutable_test()->set_path("/d/test.csv");
  const auto paths = DataPaths(data);
  ASSERT_EQ(paths.size(), 3u);
  EXPECT_EQ(paths[0].first, "spec.data.train.images");
  EXPECT_EQ(paths[1].first, "spec.data.train.labels");
  EXPECT_EQ(paths[2].first, "spec.data.test.path");
  EXPECT_EQ(paths[2].second, "/d/test.csv");
}

TEST(DataPathsTest, CheckDataPathsUnderRoots) {
  v1::DataSpec data;
  data.mutable_train()->set_path("/data/train.csv");
  data.mutable_test()->set_path("/proc/self/environ");
  EXPECT_TRUE(CheckDataPathsUnderRoots(v1::DataSpec(), {}).ok()) << "synthetic data has no paths";
  absl::Status s = CheckDataPathsUnderRoots(data, {"/data", "/srv/sets"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.data.test.path: '/proc/self/environ' is not under"));
  EXPECT_THAT(s.message(), HasSubstr("/data, /srv/sets"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("train")));
  s = CheckDataPathsUnderRoots(data, {});
  EXPECT_THAT(s.message(), HasSubstr("no worker has reported any data root"));
  data.mutable_test()->set_path("/data/../etc/passwd");
  s = CheckDataPathsUnderRoots(data, {"/data"});
  EXPECT_THAT(s.message(), HasSubstr("spec.data.test.path: '/data/../etc/passwd' has a '..'"));
  data.mutable_test()->set_path("test.csv");
  EXPECT_THAT(CheckDataPathsUnderRoots(data, {"/data"}).message(),
              HasSubstr("not an absolute path"));
  data.mutable_test()->set_path("/data/test.csv");
  EXPECT_TRUE(CheckDataPathsUnderRoots(data, {"/data"}).ok());
}

TEST(DataPathsTest, TheTensorBoardDirectoryIsConfinedLikeCheckpoints) {
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_directory("/ckpt/job");
  spec.mutable_tensorboard()->set_directory("/ckpt/runs/job");
  const auto paths = CheckpointRootPaths(spec);
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[1].first, "spec.tensorboard.directory");
  EXPECT_EQ(CheckpointPaths(spec).size(), 1u) << "no checkpoints are listed from it";
  EXPECT_TRUE(CheckCheckpointPathsUnderRoots(spec, {"/ckpt"}).ok());
  spec.mutable_tensorboard()->set_directory("/home/me/runs");
  absl::Status s = CheckCheckpointPathsUnderRoots(spec, {"/ckpt"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.tensorboard.directory: '/home/me/runs' is not under a "
                                     "checkpoint root"));
  spec.mutable_tensorboard()->set_directory("/ckpt/../etc");
  EXPECT_THAT(CheckCheckpointPathsUnderRoots(spec, {"/ckpt"}).message(),
              HasSubstr("spec.tensorboard.directory: '/ckpt/../etc' has a '..'"));
}


TEST(DataPathsTest, OwnerDirectoryNamesAreSafeAndDistinct) {
  EXPECT_EQ(OwnerDirectoryName("alice"), "alice");
  EXPECT_EQ(OwnerDirectoryName("alice@example.com"), "alice@example.com");
  EXPECT_EQ(OwnerDirectoryName("team-a_x+1"), "team-a_x+1");
  EXPECT_EQ(OwnerDirectoryName(".."), "%2E.");
  EXPECT_EQ(OwnerDirectoryName("."), "%2E");
  EXPECT_EQ(OwnerDirectoryName("a/b"), "a%2Fb");
  EXPECT_EQ(OwnerDirectoryName("a b"), "a%20b");
  // '%' itself is escaped: "a%2Fb" as an owner is not the directory of "a/b".
  EXPECT_EQ(OwnerDirectoryName("a%2Fb"), "a%252Fb");
  EXPECT_EQ(OwnerDirectoryName("\xc3\xa9"), "%C3%A9");
  EXPECT_EQ(OwnerDirectoryName(""), "");
  for (const char* name : {"alice", "%2E.", "a%2Fb", "%C3%A9"}) {
    EXPECT_TRUE(IsDirectoryEntryName(name)) << name;
  }
  for (const std::string& name : std::vector<std::string>{"", ".", "..", "a/b", std::string(256, 'a'), std::string("a\0b", 3)}) {
    EXPECT_FALSE(IsDirectoryEntryName(name)) << name;
  }
  EXPECT_EQ(OwnerCheckpointRoots({"/ckpt", "/"}, "bob"),
            (std::vector<std::string>{"/ckpt/bob", "/bob"}));
}

TEST(DataPathsTest, CheckpointPathsStayInTheOwnersDirectory) {
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_directory("/ckpt/alice/run");
  EXPECT_TRUE(CheckCheckpointPathsUnderRoots(spec, {"/ckpt", "/scratch"}, "alice").ok());
  absl::Status s = CheckCheckpointPathsUnderRoots(spec, {"/ckpt", "/scratch"}, "bob");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("spec.checkpoint.directory: '/ckpt/alice/run' is not in the "
                                     "submitter's own directory"));
  EXPECT_THAT(s.message(), HasSubstr("/ckpt/bob or /scratch/bob"));
  // "/ckpt/alice-2" is not alice's: the boundary is a path component.
  spec.mutable_checkpoint()->set_directory("/ckpt/alice-2/run");
  EXPECT_FALSE(CheckCheckpointPathsUnderRoots(spec, {"/ckpt"}, "alice").ok());
  // The root's owner directory itself is the owner's too.
  spec.mutable_checkpoint()->set_directory("/ckpt/alice");
  EXPECT_TRUE(CheckCheckpointPathsUnderRoots(spec, {"/ckpt"}, "alice").ok());
  // Resuming from another owner's checkpoints, and logging into their directory, are refused.
  spec.set_resume_from("/ckpt/bob/run");
  spec.mutable_tensorboard()->set_directory("/ckpt/bob/tb");
  s = CheckCheckpointPathsUnderRoots(spec, {"/ckpt"}, "alice");
  EXPECT_THAT(s.message(), HasSubstr("spec.resume_from: '/ckpt/bob/run'"));
  EXPECT_THAT(s.message(), HasSubstr("spec.tensorboard.directory: '/ckpt/bob/tb'"));
  // No owner directory (an admin's job): anywhere under a root.
  EXPECT_TRUE(CheckCheckpointPathsUnderRoots(spec, {"/ckpt"}).ok());
}

}  // namespace
}  // namespace substrax
