// Who is calling, and may they: the coordinator's authentication and authorization, with no
// gRPC in it (the rpc layer hands over what the connection proved, coordinator/server.cc).
//
// Identities. A verified client certificate names its holder in the subject's CN and its role
// in the subject's O: `substrax:admin`, `substrax:submitter`, `substrax:viewer` or
// `substrax:worker` (a worker's CN is its worker id). A bearer token names its holder and role
// in the auth config, which stores only the token's SHA-256 (below). A job's process holds an
// attempt token (role `job`, AttemptToken): stateless, the HMAC of its job, attempt and process
// under the coordinator's key, so it needs no storage and outlives a coordinator restart.
//
//   tokens:
//   - name: alice
//     role: submitter
//     sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//
// An attempt token reads `sxa1.<job>.<attempt>.<process>.<64 hex digits>`. Its holder is that
// process of that attempt and nothing else: the rules give role `job` only what a job process
// calls (step and checkpoint reports, rendezvous), and the server checks each request's job,
// attempt and process against the token's scope, and that the attempt is still the job's
// running one (server_calls.cc).
//
// Authorization is one table (MethodRules): every rpc of CoordinatorService, JobService and
// MetricsService with the roles that may call it, looked up by the method name gRPC reports for
// the call (coordinator/server_auth.h records the decision for each call; a method without a
// rule is refused with PERMISSION_DENIED). Ownership (a submitter cancels only its own
// jobs), worker identity (a worker reports only as itself) and an attempt token's scope are
// checked by the caller of Authorize with the Caller it returns.
//
// Errors never say why a secret did not match: UNAUTHENTICATED says what was missing or that a
// token is not recognized; PERMISSION_DENIED names the rpc, the caller and the roles allowed.
//
// Thread-safe.
#ifndef SUBSTRAX_COORDINATOR_AUTH_H_
#define SUBSTRAX_COORDINATOR_AUTH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace substrax {

enum class Role : uint8_t {
  kAdmin = 1,
  kSubmitter = 2,
  kViewer = 4,
  kWorker = 8,
  // A job's process, by its attempt token (never by certificate or auth config).
  kJob = 16,
};
using RoleSet = uint8_t;

// "admin" for kAdmin; and back (nullopt for an unknown name).
std::string RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

// What an attempt token admits: one process of one attempt of one job.
struct AttemptScope {
  std::string job_id;
  int attempt = 0;
  int process_index = 0;

  // "process 1 of job mnist-3 attempt 2".
  std::string Describe() const;
};

struct Caller {
  // The certificate's CN, the token's name, "anonymous" (--insecure), or for an attempt token
  // its scope's Describe().
  std::string name;
  RoleSet roles = 0;
  // "certificate", "token", "attempt token" or "insecure".
  std::string via;
  // Every check passes (--insecure: authentication is off).
  bool unrestricted = false;
  // Set iff the caller holds an attempt token (role kJob): what it may act for.
  std::optional<AttemptScope> attempt;

  bool Has(Role role) const {
    return unrestricted || (roles & static_cast<RoleSet>(role)) != 0;
  }
  // "alice (submitter, by token)".
  std::string Describe() const;
};

// What the connection proved about the caller.
struct PeerCredentials {
  // A verified client certificate's subject CN; empty: no certificate.
  std::string common_name;
  // Its subject, RFC 2253 ("O=substrax:admin,CN=alice"); the O entries give the role.
  std::string subject;
  // The "authorization" request header, if any.
  std::optional<std::string> authorization;
};

struct TokenEntry {
  std::string name;
  Role role = Role::kViewer;
  // Lowercase hex SHA-256 of the token.
  std::string sha256;
};

// Parses an auth config (see above). Errors: INVALID_ARGUMENT naming `source`, the entry and
// the field.
absl::StatusOr<std::vector<TokenEntry>> ParseAuthConfig(absl::string_view yaml,
                                                        absl::string_view source);

// The O values of an RFC 2253 subject ("O=substrax:admin,CN=alice" -> {"substrax:admin"}).
std::vector<std::string> SubjectOrganizations(absl::string_view subject);

struct MethodRule {
  // "substrax.v1.JobService/SubmitJob".
  const char* method;
  RoleSet roles;
};
// Every rpc the coordinator serves, with who may call it.
const std::vector<MethodRule>& MethodRules();

// The key a coordinator derives its attempts' rendezvous secrets from: read from `path`, or
// drawn at random and written there (mode 0600) on first start, so that attempts running over
// a coordinator restart keep their secrets. Errors: INVALID_ARGUMENT (unreadable or too short),
// UNAVAILABLE (cannot be written).
absl::StatusOr<std::string> LoadOrCreateKey(const std::string& path);

// The attempt token of `scope` under `key` (the coordinator's rendezvous key): what the
// coordinator puts in the Assignment of that process (Assignment.attempt_token).
std::string AttemptToken(absl::string_view key, const AttemptScope& scope);

// The scope of `token` if it is an attempt token made under `key`; nullopt for anything else
// (another key, a changed or truncated token, not an attempt token).
std::optional<AttemptScope> VerifyAttemptToken(absl::string_view key, absl::string_view token);

class Authenticator {
 public:
  // `insecure`: every call is Caller{"anonymous", unrestricted}. `auth_config`: a file path
  // (empty: no tokens), read now and again when its modification time changes.
  // Errors: INVALID_ARGUMENT (the file cannot be read or parsed).
  static absl::StatusOr<std::unique_ptr<Authenticator>> Create(bool insecure,
                                                               std::string auth_config);

  // The key attempt tokens are verified with (CoordinatorServer::Start sets the rendezvous key
  // the assignments' tokens are made with); before it is set, no attempt token is accepted.
  void SetAttemptKey(std::string key) ABSL_LOCKS_EXCLUDED(mu_);

  // Errors: UNAUTHENTICATED (neither a certificate nor a token; a token not recognized, an
  // attempt token not made with the attempt key; a malformed authorization header).
  absl::StatusOr<Caller> Authenticate(const PeerCredentials& peer);

  // Authenticate, then the rule of `method`, spelled as gRPC reports it
  // ("/substrax.v1.JobService/SubmitJob"; the table's spelling without the slash is accepted
  // too). Errors: UNAUTHENTICATED as above; PERMISSION_DENIED (the caller's roles are not among
  // the method's; or the method has no rule in MethodRules: refused, never allowed).
  absl::StatusOr<Caller> Authorize(const PeerCredentials& peer, absl::string_view method);

 private:
  Authenticator(bool insecure, std::string auth_config)
      : insecure_(insecure), auth_config_(std::move(auth_config)) {}
  // Re-reads the auth config when it changed (looked at no more than once a second). A config
  // that fails to parse keeps the tokens loaded before and is logged.
  absl::Status MaybeReload(bool force) ABSL_LOCKS_EXCLUDED(mu_);

  const bool insecure_;
  const std::string auth_config_;
  absl::Mutex mu_;
  std::vector<TokenEntry> tokens_ ABSL_GUARDED_BY(mu_);
  std::string attempt_key_ ABSL_GUARDED_BY(mu_);
  // The config file's inode, size and modification time when it was read.
  std::string config_version_ ABSL_GUARDED_BY(mu_);
  absl::Time last_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_AUTH_H_
