#include "core/status.h"

#include <string>

#include "gtest/gtest.h"

namespace substrax {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError(absl::StrCat(x, " is odd"));
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  SUBSTRAX_ASSIGN_OR_RETURN(int half, Half(x));
  SUBSTRAX_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  SUBSTRAX_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusTest, AssignOrReturnPassesValuesAndErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  absl::StatusOr<int> odd = Quarter(6);
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(odd.status().message(), "3 is odd");
}

TEST(StatusTest, ReturnIfErrorReturnsTheError) {
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).message(), "5 is odd");
}

TEST(StatusTest, AnnotateKeepsCodeAndPrefixesContext) {
  absl::Status s = Annotate(absl::UnavailableError("peer died"), "rank 3 (host b)");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "rank 3 (host b): peer died");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ignored").ok());
}

}  // namespace
}  // namespace substrax
