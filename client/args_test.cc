#include "client/args.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace substrax::ctl {
namespace {

struct RangeCase {
  std::string text;
  int64_t first;
  int64_t last;
};

TEST(ParseStepRangeTest, AcceptsEveryDocumentedForm) {
  for (const RangeCase& c : std::vector<RangeCase>{{"", 0, 0},
                                                   {":", 0, 0},
                                                   {"100:200", 100, 200},
                                                   {"100:", 100, 0},
                                                   {":50", 0, 50},
                                                   {"7", 7, 7},
                                                   {"7:7", 7, 7},
                                                   {" 1:2 ", 1, 2}}) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<v1::StepRange> range = ParseStepRange(c.text);
    ASSERT_TRUE(range.ok()) << range.status();
    EXPECT_EQ(range->first(), c.first);
    EXPECT_EQ(range->last(), c.last);
  }
}

TEST(ParseStepRangeTest, RejectsMalformedRangesNamingTheProblem) {
  struct Bad {
    std::string text;
    std::string message;
  };
  for (const Bad& c : std::vector<Bad>{{"a:b", "'a' is not a step number"},
                                       {"10:x", "'x' is not a step number"},
                                       {"1.5:", "'1.5' is not a step number"},
                                       {"-3:", "steps are >= 0, got -3"},
                                       {"5:3", "the range is empty (3 < 5)"},
                                       {"5:0", "the range is empty"},
                                       {"1:2:3", "more than one ':'"},
                                       {"0", "a single step must be >= 1"},
                                       {"+4:", "'+4' is not a step number"}}) {
    SCOPED_TRACE(c.text);
    absl::StatusOr<v1::StepRange> range = ParseStepRange(c.text);
    ASSERT_FALSE(range.ok());
    EXPECT_EQ(range.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(range.status().message().find(c.message), absl::string_view::npos)
        << range.status().message();
    EXPECT_NE(range.status().message().find("--steps"), absl::string_view::npos);
  }
}

TEST(ExitCodeTest, MapsEveryGrpcCodeByTheContract) {
  using C = absl::StatusCode;
  const std::vector<std::pair<C, int>> table = {
      {C::kOk, 0},
      {C::kUnavailable, 3},
      {C::kDeadlineExceeded, 3},
      {C::kInvalidArgument, 2},
      {C::kNotFound, 1},
      {C::kFailedPrecondition, 1},
      {C::kResourceExhausted, 1},
      {C::kAborted, 1},
      {C::kInternal, 1},
      {C::kUnknown, 1},
      {C::kPermissionDenied, 1},
      {C::kUnauthenticated, 1},
      {C::kCancelled, 1},
      {C::kUnimplemented, 1},
      {C::kAlreadyExists, 1},
      {C::kOutOfRange, 1},
      {C::kDataLoss, 1},
  };
  for (const auto& [code, exit_code] : table) {
    EXPECT_EQ(ExitCodeForStatus(code), exit_code) << absl::StatusCodeToString(code);
  }
}

TEST(ParseJobStatesTest, CommaSeparatedCaseInsensitive) {
  absl::StatusOr<std::vector<v1::JobState>> states = ParseJobStates("pending, RUNNING,failed");
  ASSERT_TRUE(states.ok()) << states.status();
  EXPECT_EQ(*states, (std::vector<v1::JobState>{v1::JOB_STATE_PENDING, v1::JOB_STATE_RUNNING,
                                                v1::JOB_STATE_FAILED}));
  EXPECT_TRUE(ParseJobStates("")->empty());
  absl::StatusOr<std::vector<v1::JobState>> bad = ParseJobStates("running,done");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("unknown state 'done'"), absl::string_view::npos);
  EXPECT_FALSE(ParseJobStates("unspecified").ok());
}

TEST(ParseFlagsTest, ReductionGroupByFormatTimeout) {
  EXPECT_EQ(*ParseReduction(""), v1::REDUCTION_UNSPECIFIED);
  EXPECT_EQ(*ParseReduction("max"), v1::REDUCTION_MAX);
  EXPECT_EQ(*ParseReduction("none"), v1::REDUCTION_NONE);
  EXPECT_FALSE(ParseReduction("median").ok());
  EXPECT_FALSE(ParseReduction("unspecified").ok());
  EXPECT_EQ(*ParseGroupBy(""), v1::GROUP_BY_NONE);
  EXPECT_EQ(*ParseGroupBy("host"), v1::GROUP_BY_HOST);
  EXPECT_EQ(*ParseGroupBy("device"), v1::GROUP_BY_DEVICE);
  EXPECT_FALSE(ParseGroupBy("rack").ok());
  EXPECT_EQ(*ParseOutputFormat("yaml"), OutputFormat::kYaml);
  EXPECT_FALSE(ParseOutputFormat("xml").ok());
  EXPECT_EQ(*ParseTimeout("500ms"), absl::Milliseconds(500));
  EXPECT_FALSE(ParseTimeout("0s").ok());
  EXPECT_FALSE(ParseTimeout("10").ok());
  EXPECT_FALSE(ParseTimeout("inf").ok());
}

TEST(ResolveCoordinatorTest, FlagThenEnvThenLocalAddressFileThenDefault) {
  const std::string file = std::string(::testing::TempDir()) + "/address";
  const std::string missing = std::string(::testing::TempDir()) + "/no-such-address";
  {
    std::ofstream out(file);
    out << "127.0.0.1:41234\n";
  }
  EXPECT_EQ(ResolveCoordinator("a:1", "b:2", file), "a:1");
  EXPECT_EQ(ResolveCoordinator("", "b:2", file), "b:2");
  EXPECT_EQ(ResolveCoordinator("", "", file), "127.0.0.1:41234");
  EXPECT_EQ(ResolveCoordinator("", "", missing), kDefaultCoordinator);
  {
    std::ofstream out(file);  // an empty file (a coordinator that never served) is no address
  }
  EXPECT_EQ(ResolveCoordinator("", "", file), kDefaultCoordinator);
  std::remove(file.c_str());
}

TEST(UserPathTest, RelativeToTheDirectoryBazelRunWasTypedIn) {
  EXPECT_EQ(UserPath("job.yaml", "/home/u"), "/home/u/job.yaml");
  EXPECT_EQ(UserPath("/abs/job.yaml", "/home/u"), "/abs/job.yaml");
  EXPECT_EQ(UserPath("job.yaml", ""), "job.yaml");
}

TEST(ParseWorkersShapeTest, WorkersTimesDevices) {
  absl::StatusOr<WorkersShape> shape = ParseWorkersShape("2x4");
  ASSERT_TRUE(shape.ok()) << shape.status();
  EXPECT_EQ(shape->workers, 2);
  EXPECT_EQ(shape->devices_per_worker, 4);
  EXPECT_EQ(ParseWorkersShape("1X1")->workers, 1);
  for (const char* bad : {"", "2", "2x", "x2", "2x2x2", "0x2", "2x-1", "a x b", "300x300"}) {
    absl::StatusOr<WorkersShape> r = ParseWorkersShape(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(r.status().message().rfind("--workers: '", 0), 0u) << r.status();
  }
}

}  // namespace
}  // namespace substrax::ctl
