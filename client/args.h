// substraxctl: parsing of flag values and the exit-code contract. Pure functions, no RPC;
// thread-safe.
//
// Exit codes (docs/cli.md): 0 ok; 1 the job failed or an error; 2 usage (bad flags, bad spec
// file, malformed ranges); 3 the coordinator is unreachable.
#ifndef SUBSTRAX_CLIENT_ARGS_H_
#define SUBSTRAX_CLIENT_ARGS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "rpc/transport.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/metrics.pb.h"
#include "substrax/v1/metrics_service.pb.h"

namespace substrax::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;

// The address used when neither --coordinator, SUBSTRAX_COORDINATOR nor a local cluster's
// address file says otherwise.
inline constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";
inline constexpr char kCoordinatorEnv[] = "SUBSTRAX_COORDINATOR";
// The state directory of `substraxctl local` when --state-dir is not given.
inline constexpr char kDefaultLocalStateDir[] = ".substrax-local";
// Credentials from the environment when the flags do not give them.
inline constexpr char kTlsCaEnv[] = "SUBSTRAX_TLS_CA";
inline constexpr char kTlsCertEnv[] = "SUBSTRAX_TLS_CERT";
inline constexpr char kTlsKeyEnv[] = "SUBSTRAX_TLS_KEY";
inline constexpr char kTokenFileEnv[] = "SUBSTRAX_TOKEN_FILE";

// Exit code for an RPC that ended with `code` (grpc::StatusCode values equal absl's):
// UNAVAILABLE and DEADLINE_EXCEEDED mean the coordinator could not be reached (3);
// INVALID_ARGUMENT is a bad request (2); every other error is 1; OK is 0.
int ExitCodeForStatus(absl::StatusCode code);
// True for the codes ExitCodeForStatus maps to kExitUnreachable.
bool IsUnreachable(absl::StatusCode code);

enum class OutputFormat { kTable, kJson, kYaml };

// "table", "json" or "yaml". Errors: INVALID_ARGUMENT.
absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text);

// --steps: "A:B" (A to B inclusive), "A:" (A to the latest), ":B" (0 to B), "A" (just A), ":"
// or "" (all). Steps are non-negative integers. Errors: INVALID_ARGUMENT naming what is wrong
// (not a number, negative, B < A, more than one ':').
absl::StatusOr<v1::StepRange> ParseStepRange(absl::string_view text);

// --state: a comma-separated list of job states, case-insensitive ("pending,running").
// Errors: INVALID_ARGUMENT naming the unknown state and listing the valid ones.
absl::StatusOr<std::vector<v1::JobState>> ParseJobStates(absl::string_view text);

// --reduce: mean, sum, max, min, none; "" is the job's declared reduction.
absl::StatusOr<v1::Reduction> ParseReduction(absl::string_view text);
// --group-by: device, host, none; "" is none.
absl::StatusOr<v1::GroupBy> ParseGroupBy(absl::string_view text);
// --timeout: a positive duration such as "10s", "500ms", "2m". Errors: INVALID_ARGUMENT.
absl::StatusOr<absl::Duration> ParseTimeout(absl::string_view text);

// --workers NxD of `plan`: N worker daemons (one host each) with D CPU devices each.
struct WorkersShape {
  int workers = 0;
  int devices_per_worker = 0;
};
// "2x2" (also "2X2"). Each number is 1 to 65536 and so is their product (the largest mesh axis).
// Errors: INVALID_ARGUMENT naming the flag and what is wrong.
absl::StatusOr<WorkersShape> ParseWorkersShape(absl::string_view text);

// Where the coordinator is: `flag` when non-empty, else `env` (SUBSTRAX_COORDINATOR) when
// non-empty, else the first line of `local_address_file` (a local cluster's address, written by
// `substraxctl local up`) when that file exists and is not empty, else kDefaultCoordinator.
std::string ResolveCoordinator(absl::string_view flag, absl::string_view env,
                               const std::string& local_address_file);

// A local cluster's credentials directory: <state_dir>/tls (ca.crt, admin.crt, admin.key, ...).
std::string LocalTlsDir(absl::string_view state_dir);

// The credentials to use: `flags` (--tls-ca, --tls-cert, --tls-key, --token-file,
// --insecure), each missing one from `env` (SUBSTRAX_TLS_CA, ...), and, when neither names a
// CA, the admin credentials of the local cluster in `local_tls_dir` if it has them.
TransportOptions ResolveTransport(TransportOptions flags,
                                  const std::function<std::string(const char*)>& env,
                                  const std::string& local_tls_dir);

// `bazel run` starts binaries in their runfiles directory; relative paths on the command line
// mean the directory the user typed them in, which Bazel passes as BUILD_WORKING_DIRECTORY.
// `working_directory` is that variable's value (empty when not under bazel run).
std::string UserPath(const std::string& path, absl::string_view working_directory);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_ARGS_H_
