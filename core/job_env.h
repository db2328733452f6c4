// Which environment variables a job's spec may set (spec.program.env): the rule the coordinator
// applies at submit and the agent again before it starts a job process (docs/job-spec.md).
//
// A job's variables reach processes that run code the submitter did not write (the built-in
// trainer, a program from a --programs-dir, the shells and interpreters those start), often as
// the worker's own user. A variable that such a process reads at start-up to load or run code
// (LD_PRELOAD, BASH_ENV, PYTHONPATH, ...) would run the submitter's code there. So:
//   - a name is plain: [A-Za-z_][A-Za-z0-9_]*, at most kMaxJobEnvNameBytes;
//   - it is never one of the denied names (JobEnvDenial): the loader's, shells' and
//     interpreters' start-up variables, those that make a library load modules or compiled code
//     or write files at paths of the caller's choosing, and those the agent itself sets. No
//     administrator setting allows them;
//   - and it matches the allowlist: DefaultJobEnvAllow(), plus the patterns the administrator
//     adds with the coordinator's --job-env-allow.
// Patterns are a name, or a prefix followed by '*' (OMP_*). Pure: no I/O, thread-safe.
#ifndef SUBSTRAX_CORE_JOB_ENV_H_
#define SUBSTRAX_CORE_JOB_ENV_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace substrax {

// The longest variable name (and allowlist pattern) accepted.
inline constexpr size_t kMaxJobEnvNameBytes = 128;
// The most patterns --job-env-allow may add.
inline constexpr size_t kMaxJobEnvAllowPatterns = 256;

// The allowlist every cluster has: threading and communication libraries' tuning variables,
// locale and time zone, and two prefixes for the job's own settings (JOB_*, APP_*).
const std::vector<std::string>& DefaultJobEnvAllow();

// Whether `name` matches `pattern`: equal, or for "PREFIX*" starts with PREFIX.
bool JobEnvPatternMatches(absl::string_view pattern, absl::string_view name);

// Why `name` is not a plain variable name ("" when it is).
std::string JobEnvNameProblem(absl::string_view name);

// Why no job may ever set `name`, beginning with "denied: " ("" when nothing denies it): what
// it would let the submitter do, or that the agent sets it. Checks the name only; call
// JobEnvNameProblem first.
std::string JobEnvDenial(absl::string_view name);

// Everything that refuses `name` at submit, "" when nothing does: its syntax, then
// JobEnvDenial, then "not allowed: ..." when it matches neither DefaultJobEnvAllow() nor
// `extra_allow` (the message lists both and names --job-env-allow).
std::string JobEnvRefusal(absl::string_view name, const std::vector<std::string>& extra_allow);

// Checks the administrator's patterns (--job-env-allow). Errors: INVALID_ARGUMENT naming the
// pattern (not a name or "PREFIX*" with a non-empty prefix, too long, too many) and saying that
// a denied name is never allowed when the pattern is one ("LD_PRELOAD is denied: ...").
absl::Status ValidateJobEnvAllow(const std::vector<std::string>& patterns);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_JOB_ENV_H_
