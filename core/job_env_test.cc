#include "core/job_env.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::StartsWith;

// Every start-up variable the issue names, and others of the kind: denied whatever the
// allowlist says (the administrator's "*"-free list below allows each by name).
const std::vector<std::string>& StartUpVariables() {
  static const auto* const kNames = new std::vector<std::string>{
      "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "BASH_ENV", "ENV", "BASHOPTS", "SHELLOPTS",
      "PS4", "PATH", "IFS", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PERL5LIB", "PERL5OPT",
      "RUBYOPT", "NODE_OPTIONS", "OPENSSL_CONF", "OPENSSL_MODULES", "GCONV_PATH",
      "GLIBC_TUNABLES", "CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
      "PJRT_NAMES_AND_LIBRARY_PATHS", "MALLOC_CHECK_", "HOSTALIASES", "LOCPATH", "NLSPATH",
      "JAVA_TOOL_OPTIONS", "BASH_FUNC_x", "PROMPT_COMMAND", "TPU_LIBRARY_PATH",
      "OMP_TOOL_LIBRARIES", "NCCL_DEBUG_FILE", "CUDA_CACHE_PATH", "JAX_COMPILATION_CACHE_DIR",
      "TORCH_EXTENSIONS_DIR", "GIT_SSH_COMMAND"};
  return *kNames;
}

// What the agent sets, now or for the command jobs to come.
const std::vector<std::string>& AgentVariables() {
  static const auto* const kNames = new std::vector<std::string>{
      "SUBSTRAX_LAUNCH", "SUBSTRAX_DEVICES", "HOME", "USER", "LOGNAME", "CUDA_VISIBLE_DEVICES",
      "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
      "GROUP_RANK", "NODE_RANK", "PET_NPROC_PER_NODE", "TORCHELASTIC_RUN_ID",
      "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_LOCAL_DEVICE_IDS",
      "JAX_NUM_CPU_DEVICES"};
  return *kNames;
}

TEST(JobEnvTest, StartUpVariablesAreDeniedEvenWhenTheAdministratorAllowsThem) {
  for (const std::string& name : StartUpVariables()) {
    EXPECT_THAT(JobEnvDenial(name), StartsWith("denied: ")) << name;
    EXPECT_THAT(JobEnvRefusal(name, {name, "*"}), StartsWith("denied: ")) << name;
  }
  EXPECT_THAT(JobEnvDenial("LD_PRELOAD"), HasSubstr("run code of the submitter's choosing"));
  EXPECT_THAT(JobEnvDenial("BASH_ENV"), HasSubstr("shells read it"));
  EXPECT_THAT(JobEnvDenial("PATH"), HasSubstr("fixed PATH"));
}

TEST(JobEnvTest, OtherLaunchersVariablesAreDenied) {
  for (const char* name : {"SLURM_PROCID", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK",
                                   "PMI_RANK", "PMIX_RANK"}) {
    EXPECT_THAT(JobEnvRefusal(name, {name, "*"}), StartsWith("denied: ")) << name;
    EXPECT_THAT(JobEnvDenial(name), HasSubstr("another launcher's")) << name;
  }
}

TEST(JobEnvTest, WhatTheAgentSetsIsDenied) {
  for (const std::string& name : AgentVariables()) {
    EXPECT_THAT(JobEnvRefusal(name, {name}), StartsWith("denied: ")) << name;
  }
  EXPECT_THAT(JobEnvDenial("SUBSTRAX_LAUNCH"), HasSubstr("the agent sets it"));
  EXPECT_THAT(JobEnvDenial("MASTER_ADDR"), HasSubstr("reserved for the agent"));
}

TEST(JobEnvTest, TheDefaultAllowlistTakesLibrarySettingsAndTheJobsOwn) {
  for (const char* name :
       {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NCCL_DEBUG",
        "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "JAX_PLATFORMS", "TF_CPP_MIN_LOG_LEVEL",
        "TORCH_SHOW_CPP_STACKTRACES", "CUDA_MODULE_LOADING", "LANG", "LC_ALL", "TZ",
        "JOB_LEARNING_RATE", "APP_MODE"}) {
    EXPECT_THAT(JobEnvRefusal(name, {}), IsEmpty()) << name;
  }
}

TEST(JobEnvTest, OtherNamesNeedTheAdministrator) {
  const std::string refusal = JobEnvRefusal("WANDB_MODE", {});
  EXPECT_THAT(refusal, StartsWith("not allowed: a job may set only variables matching OMP_*"));
  EXPECT_THAT(refusal, HasSubstr("--job-env-allow"));
  EXPECT_THAT(JobEnvRefusal("WANDB_MODE", {"WANDB_*"}), IsEmpty());
  EXPECT_THAT(JobEnvRefusal("WANDB_MODE", {"WANDB_MODE"}), IsEmpty());
  EXPECT_THAT(JobEnvRefusal("WANDB_MODEL", {"WANDB_MODE"}), StartsWith("not allowed"));
  EXPECT_THAT(JobEnvRefusal("HF_HOME", {"WANDB_*"}), HasSubstr("APP_*, WANDB_*;"));
}

TEST(JobEnvTest, NamesArePlainAndBounded) {
  EXPECT_THAT(JobEnvRefusal("", {}), HasSubstr("letters, digits and '_'"));
  EXPECT_THAT(JobEnvRefusal("1X", {}), HasSubstr("not starting with a digit"));
  EXPECT_THAT(JobEnvRefusal("JOB_A=B", {}), HasSubstr("letters, digits and '_'"));
  EXPECT_THAT(JobEnvRefusal("BASH_FUNC_f%%", {}), HasSubstr("letters, digits and '_'"));
  EXPECT_THAT(JobEnvRefusal(std::string(kMaxJobEnvNameBytes, 'J'), {"J*"}), IsEmpty());
  EXPECT_THAT(JobEnvRefusal(std::string(kMaxJobEnvNameBytes + 1, 'J'), {"J*"}),
              HasSubstr("more than the limit of 128"));
}

TEST(JobEnvTest, PatternsMatchANameOrAPrefix) {
  EXPECT_TRUE(JobEnvPatternMatches("OMP_*", "OMP_NUM_THREADS"));
  EXPECT_TRUE(JobEnvPatternMatches("OMP_*", "OMP_"));
  EXPECT_FALSE(JobEnvPatternMatches("OMP_*", "OMP"));
  EXPECT_TRUE(JobEnvPatternMatches("TZ", "TZ"));
  EXPECT_FALSE(JobEnvPatternMatches("TZ", "TZDIR"));
  EXPECT_TRUE(JobEnvPatternMatches("NCCL_*_PLUGIN", "NCCL_NET_PLUGIN"));
  EXPECT_FALSE(JobEnvPatternMatches("NCCL_*_PLUGIN", "NCCL_PLUGIN"));
}

TEST(JobEnvTest, TheAdministratorsPatternsAreChecked) {
  EXPECT_TRUE(ValidateJobEnvAllow({}).ok());
  EXPECT_TRUE(ValidateJobEnvAllow({"WANDB_*", "HF_HOME", "X*"}).ok());
  for (const char* bad : {"*", "A-B", "WANDB_*X", "*_X", "A B", "1A*"}) {
    absl::Status s = ValidateJobEnvAllow({bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("'", bad, "'"))) << bad;
  }
  absl::Status denied = ValidateJobEnvAllow({"LD_PRELOAD"});
  EXPECT_THAT(denied.message(), HasSubstr("LD_PRELOAD is denied: the dynamic loader"));
  EXPECT_THAT(denied.message(), HasSubstr("no setting allows it"));
  EXPECT_THAT(ValidateJobEnvAllow(std::vector<std::string>(kMaxJobEnvAllowPatterns + 1, "A"))
                  .message(),
              HasSubstr("more than the limit of 256"));
}

}  // namespace
}  // namespace substrax
