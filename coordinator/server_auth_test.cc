#include "coordinator/server_auth.h"

#include <string>

#include "gtest/gtest.h"

namespace substrax {
namespace {

constexpr char kWatch[] = "/substrax.v1.JobService/WatchJob";
constexpr char kGet[] = "/substrax.v1.JobService/GetJob";
constexpr char kHeartbeat[] = "/substrax.v1.CoordinatorService/Heartbeat";

Caller As(const std::string& name, Role role) {
  Caller caller;
  caller.name = name;
  caller.roles = static_cast<RoleSet>(role);
  caller.via = "token";
  return caller;
}

TEST(CallerCapsTest, EachIdentityHasItsOwnStreamAndCallCountsGivenBackAtTheEnd) {
  CallAuthorizer authorizer(nullptr, CallerCaps{2, 1});
  bool counted = false;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(authorizer.Admit(As("vera", Role::kViewer), true, kWatch, &counted).ok());
    EXPECT_TRUE(counted);
  }
  absl::StatusOr<Caller> third = authorizer.Admit(As("vera", Role::kViewer), true, kWatch, &counted);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(counted);
  EXPECT_NE(third.status().message().find(
                "vera (viewer, by token) already has 2 open streams (watch, logs -f), the cap "
                "per caller (--max-streams-per-caller=2)"),
            std::string::npos)
      << third.status();
  // Unary calls are counted apart, and so is every other identity.
  ASSERT_TRUE(authorizer.Admit(As("vera", Role::kViewer), false, kGet, &counted).ok());
  absl::StatusOr<Caller> second_call =
      authorizer.Admit(As("vera", Role::kViewer), false, kGet, &counted);
  EXPECT_EQ(second_call.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second_call.status().message().find("(--max-calls-per-caller=1)"), std::string::npos);
  EXPECT_TRUE(authorizer.Admit(As("walt", Role::kViewer), true, kWatch, &counted).ok());
  EXPECT_EQ(authorizer.counted("vera"), 3);

  authorizer.Release("vera", true);
  EXPECT_TRUE(authorizer.Admit(As("vera", Role::kViewer), true, kWatch, &counted).ok());
  authorizer.Release("vera", true);
  authorizer.Release("vera", true);
  authorizer.Release("vera", false);
  EXPECT_EQ(authorizer.counted("vera"), 0);
}

TEST(CallerCapsTest, WorkersTheirServiceAndRefusalsAreNeverCounted) {
  CallAuthorizer authorizer(nullptr, CallerCaps{1, 1});
  bool counted = true;
  for (int i = 0; i < 10; ++i) {
    // A worker anywhere; anyone on the worker-facing service; --insecure's anonymous caller.
    EXPECT_TRUE(authorizer.Admit(As("w-1", Role::kWorker), true, kWatch, &counted).ok());
    EXPECT_FALSE(counted);
    EXPECT_TRUE(authorizer.Admit(As("vera", Role::kViewer), false, kHeartbeat, &counted).ok());
    EXPECT_FALSE(counted);
    Caller anonymous;
    anonymous.name = "anonymous";
    anonymous.unrestricted = true;
    EXPECT_TRUE(authorizer.Admit(anonymous, true, kWatch, &counted).ok());
    EXPECT_FALSE(counted);
    // A refused call stays refused, uncounted.
    absl::StatusOr<Caller> refused =
        authorizer.Admit(absl::PermissionDeniedError("no"), true, kWatch, &counted);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_FALSE(counted);
  }
  EXPECT_EQ(authorizer.counted("w-1") + authorizer.counted("vera") +
                authorizer.counted("anonymous"),
            0);
  // No cap (0): counted, never refused.
  CallAuthorizer uncapped(nullptr, CallerCaps{0, 0});
  for (int i = 0; i < 100; ++i) {
    EXPECT_TRUE(uncapped.Admit(As("vera", Role::kViewer), true, kWatch, &counted).ok());
  }
}

}  // namespace
}  // namespace substrax
