// The environment contract of command jobs (contract/command_env.h) against the rule for a
// spec's env (core/job_env.h): a spec may never set a variable the contract sets, or a job could
// lie to its own processes about their rank, their peers or their devices. Here because the
// contract depends only on proto and base, and core on proto only: tests see both.
#include <string>

#include "contract/command_env.h"
#include "core/job_env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::StartsWith;

TEST(CommandEnvReservedTest, EveryNameTheContractSetsIsDeniedToASpec) {
  ASSERT_FALSE(CommandEnvNames().empty());
  for (const std::string& name : CommandEnvNames()) {
    EXPECT_EQ(JobEnvNameProblem(name), "") << name;
    // Denied, whatever the administrator allows (not merely off the default allowlist): add a
    // missing name to kDenied in core/job_env.cc and to docs/job-spec.md.
    EXPECT_THAT(JobEnvDenial(name), StartsWith("denied: ")) << name;
    EXPECT_THAT(JobEnvRefusal(name, {name, "*"}), StartsWith("denied: ")) << name;
  }
}

}  // namespace
}  // namespace substrax
