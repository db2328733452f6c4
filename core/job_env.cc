#include "core/job_env.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace substrax {
namespace {

// What a denied variable would let a submitter do.
constexpr char kLoader[] =
    "the dynamic loader or the C library reads it when any program starts (it loads libraries "
    "or modules, or changes how the C library behaves), so it would run code of the "
    "submitter's choosing in the job's process";
constexpr char kShell[] =
    "shells read it when they start or run commands, so it would run commands of the "
    "submitter's choosing in any shell the job starts";
constexpr char kPath[] =
    "it chooses which programs run; the agent sets a fixed PATH for every job process";
constexpr char kInterpreter[] =
    "an interpreter (Python, Perl, Ruby, Node.js, Java, Lua, Tcl, git) reads it at start-up to "
    "load code or options, so it would run code of the submitter's choosing";
constexpr char kModules[] =
    "a library loads modules, plugins or compiled code from the place it names, so it would "
    "run code of the submitter's choosing in the job's process";
constexpr char kWrites[] =
    "a library writes files at the path it names, which could overwrite files of the worker's "
    "user";
constexpr char kAgent[] =
    "the agent sets it for every job process (the launch contract, the devices, the user's "
    "home); a job's value would contradict it";
constexpr char kDistributed[] =
    "reserved for the agent, which sets it for distributed launchers (torchrun, JAX) to find "
    "their peers";
constexpr char kOtherLauncher[] =
    "another launcher's (Slurm, Open MPI): a framework that sees it takes its ranks and peers "
    "from it instead of from the agent's";

struct Denied {
  const char* pattern;  // a name, or one '*' anywhere
  const char* why;
};

// Names no administrator setting allows. Patterns with '*' at the start or in the middle catch
// families (any *_PLUGIN of any library); the allowlist never needs them.
constexpr Denied kDenied[] = {
    // The loader and the C library.
    {"LD_*", kLoader},
    {"GCONV_PATH", kLoader},
    {"GLIBC_TUNABLES", kLoader},
    {"MALLOC_*", kLoader},
    {"LOCPATH", kLoader},
    {"NLSPATH", kLoader},
    {"HOSTALIASES", kLoader},
    {"LOCALDOMAIN", kLoader},
    {"RES_OPTIONS", kLoader},
    {"RESOLV_*", kLoader},
    {"TZDIR", kLoader},
    // Shells.
    {"BASH_ENV", kShell},
    {"BASH_*", kShell},
    {"ENV", kShell},
    {"BASHOPTS", kShell},
    {"SHELLOPTS", kShell},
    {"PS1", kShell},
    {"PS2", kShell},
    {"PS3", kShell},
    {"PS4", kShell},
    {"PROMPT_COMMAND", kShell},
    {"IFS", kShell},
    {"CDPATH", kShell},
    {"GLOBIGNORE", kShell},
    {"ZDOTDIR", kShell},
    {"SHELL", kShell},
    {"PATH", kPath},
    // Interpreters.
    {"PYTHON*", kInterpreter},
    {"PERL5*", kInterpreter},
    {"PERLLIB", kInterpreter},
    {"PERL_*", kInterpreter},
    {"RUBYOPT", kInterpreter},
    {"RUBYLIB", kInterpreter},
    {"NODE_OPTIONS", kInterpreter},
    {"NODE_PATH", kInterpreter},
    {"JAVA_TOOL_OPTIONS", kInterpreter},
    {"_JAVA_OPTIONS", kInterpreter},
    {"JDK_JAVA_OPTIONS", kInterpreter},
    {"CLASSPATH", kInterpreter},
    {"LUA_*", kInterpreter},
    {"TCLLIBPATH", kInterpreter},
    {"GIT_*", kInterpreter},
    // Libraries that load modules, plugins or compiled code from a path they are given.
    {"OPENSSL_CONF", kModules},
    {"OPENSSL_MODULES", kModules},
    {"OPENSSL_ENGINES", kModules},
    {"CUDA_INJECTION*", kModules},
    {"NCCL_*_PLUGIN", kModules},
    {"*_PLUGIN", kModules},
    {"*_PLUGIN_PATH", kModules},
    {"*_LIBRARY_PATH", kModules},
    {"*_PRELOAD", kModules},
    {"PJRT_NAMES_AND_LIBRARY_PATHS", kModules},
    {"TORCH_EXTENSIONS_DIR", kModules},
    {"TORCH_HOME", kModules},
    {"OMP_TOOL*", kModules},
    {"*_LIBRARIES", kModules},
    {"*_CACHE_DIR", kModules},
    {"*_CACHE_PATH", kModules},
    // Libraries that write files at a path they are given.
    {"NCCL_DEBUG_FILE", kWrites},
    {"*_DUMP_FILE", kWrites},
    // What the agent sets.
    {"SUBSTRAX_*", kAgent},
    {"HOME", kAgent},
    {"USER", kAgent},
    {"LOGNAME", kAgent},
    {"CUDA_VISIBLE_DEVICES", kAgent},
    // What the agent will set for command jobs (torchrun's and JAX's variables; the SUBSTRAX_*
    // ones are above): contract/command_env.h renders them, and
    // tests/launch/command_env_reserved_test.cc checks that every name it can set is denied here.
    {"MASTER_ADDR", kDistributed},
    {"MASTER_PORT", kDistributed},
    {"RANK", kDistributed},
    {"WORLD_SIZE", kDistributed},
    {"LOCAL_RANK", kDistributed},
    {"LOCAL_WORLD_SIZE", kDistributed},
    {"GROUP_RANK", kDistributed},
    {"NODE_RANK", kDistributed},
    {"PET_*", kDistributed},
    {"TORCHELASTIC_*", kDistributed},
    {"JAX_COORDINATOR_ADDRESS", kDistributed},
    {"JAX_NUM_PROCESSES", kDistributed},
    {"JAX_PROCESS_ID", kDistributed},
    {"JAX_NUM_CPU_DEVICES", kDistributed},
    {"JAX_LOCAL_DEVICE_IDS", kDistributed},
    // Other launchers' variables: JAX's and torch's cluster detection would read them.
    {"SLURM_*", kOtherLauncher},
    {"OMPI_*", kOtherLauncher},
    {"PMI_*", kOtherLauncher},
    {"PMIX_*", kOtherLauncher},
};

}  // namespace

const std::vector<std::string>& DefaultJobEnvAllow() {
  // Tuning of the math and communication libraries a job links, which they read as settings
  // (thread counts, algorithms, logging levels), not as places to load code from: the denied
  // names above still win inside these families (NCCL_NET_PLUGIN, CUDA_VISIBLE_DEVICES, ...).
  // XLA_FLAGS is not here: some of its flags name directories XLA runs tools from.
  static const auto* const kAllow = new std::vector<std::string>{
      "OMP_*",        "KMP_*",    "MKL_*",         "OPENBLAS_*", "BLIS_NUM_THREADS",
      "NUMEXPR_*",    "NCCL_*",   "GLOO_*",        "JAX_*",      "TF_CPP_*",
      "TORCH_*",      "CUDA_*",   "CUBLAS_*",      "CUDNN_*",    "TOKENIZERS_PARALLELISM",
      "LANG",         "LC_*",     "TZ",            "JOB_*",      "APP_*",
  };
  return *kAllow;
}

bool JobEnvPatternMatches(absl::string_view pattern, absl::string_view name) {
  const size_t star = pattern.find('*');
  if (star == absl::string_view::npos) return pattern == name;
  const absl::string_view prefix = pattern.substr(0, star);
  const absl::string_view suffix = pattern.substr(star + 1);
  return name.size() >= prefix.size() + suffix.size() && absl::StartsWith(name, prefix) &&
         absl::EndsWith(name, suffix);
}

std::string JobEnvNameProblem(absl::string_view name) {
  if (name.size() > kMaxJobEnvNameBytes) {
    return absl::StrCat("the name has ", name.size(), " bytes, more than the limit of ",
                        kMaxJobEnvNameBytes);
  }
  bool plain = !name.empty() && !absl::ascii_isdigit(static_cast<unsigned char>(name[0]));
  for (char c : name) {
    plain = plain && (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_');
  }
  if (!plain) {
    return "an environment variable name is letters, digits and '_', not starting with a "
           "digit";
  }
  return "";
}

std::string JobEnvDenial(absl::string_view name) {
  for (const Denied& denied : kDenied) {
    if (JobEnvPatternMatches(denied.pattern, name)) return absl::StrCat("denied: ", denied.why);
  }
  return "";
}

std::string JobEnvRefusal(absl::string_view name, const std::vector<std::string>& extra_allow) {
  if (std::string problem = JobEnvNameProblem(name); !problem.empty()) return problem;
  if (std::string denial = JobEnvDenial(name); !denial.empty()) return denial;
  for (const std::vector<std::string>* list : {&DefaultJobEnvAllow(), &extra_allow}) {
    for (const std::string& pattern : *list) {
      if (JobEnvPatternMatches(pattern, name)) return "";
    }
  }
  return absl::StrCat("not allowed: a job may set only variables matching ",
                      absl::StrJoin(DefaultJobEnvAllow(), ", "),
                      extra_allow.empty() ? "" : ", ", absl::StrJoin(extra_allow, ", "),
                      "; an administrator allows more with the coordinator's --job-env-allow, or "
                      "name your own settings JOB_* or APP_*");
}

absl::Status ValidateJobEnvAllow(const std::vector<std::string>& patterns) {
  if (patterns.size() > kMaxJobEnvAllowPatterns) {
    return absl::InvalidArgumentError(absl::StrCat("--job-env-allow: ", patterns.size(),
                                                   " patterns, more than the limit of ",
                                                   kMaxJobEnvAllowPatterns));
  }
  for (const std::string& pattern : patterns) {
    const bool prefix = absl::EndsWith(pattern, "*");
    const absl::string_view name =
        prefix ? absl::string_view(pattern).substr(0, pattern.size() - 1) : pattern;
    std::string problem = JobEnvNameProblem(name);
    if (problem.empty() && name.empty()) problem = "a pattern names a variable or a prefix";
    if (!problem.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--job-env-allow: '", pattern, "' is not a variable name or a prefix followed by '*' (",
          problem, ")"));
    }
    if (std::string denial = JobEnvDenial(name); !prefix && !denial.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--job-env-allow: ", pattern, " is ", denial,
                                                     "; no setting allows it"));
    }
  }
  return absl::OkStatus();
}

}  // namespace substrax
