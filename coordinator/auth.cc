#include "coordinator/auth.h"

#include <sys/stat.h>

#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "rpc/pki.h"
#include "yaml-cpp/yaml.h"

namespace substrax {
namespace {

constexpr RoleSet R(Role r) { return static_cast<RoleSet>(r); }
constexpr RoleSet kReaders = R(Role::kAdmin) | R(Role::kSubmitter) | R(Role::kViewer);
constexpr RoleSet kWriters = R(Role::kAdmin) | R(Role::kSubmitter);
constexpr RoleSet kWorkers = R(Role::kWorker);
// What a job's process calls: its reports and its attempt's rendezvous (the server checks the
// token's scope against each request).
constexpr RoleSet kWorkersAndJobs = R(Role::kWorker) | R(Role::kJob);

constexpr Role kAllRoles[] = {Role::kAdmin, Role::kSubmitter, Role::kViewer, Role::kWorker,
                              Role::kJob};

// Attempt tokens: `sxa1.<job>.<attempt>.<process>.<mac>`. The MAC's input starts with a label
// that no rendezvous secret's input ("<job>/<attempt>", a job id is a DNS label) can, so a
// token's MAC is never an attempt's rendezvous secret or the other way round.
constexpr absl::string_view kAttemptTokenPrefix = "sxa1";
std::string AttemptTokenMac(absl::string_view key, const AttemptScope& scope) {
  return pki::HmacSha256Hex(key, absl::StrCat("attempt-token:", scope.job_id, "/", scope.attempt,
                                              "/", scope.process_index));
}

std::string RoleSetNames(RoleSet roles) {
  std::vector<std::string> names;
  for (Role r : kAllRoles) {
    if ((roles & R(r)) != 0) names.push_back(RoleName(r));
  }
  return names.empty() ? "no role" : absl::StrJoin(names, ", ");
}

// Splits an RFC 2253 string at unescaped separators (',' between RDNs, '+' inside one).
std::vector<std::string> SplitRdns(absl::string_view subject) {
  std::vector<std::string> parts(1);
  for (size_t i = 0; i < subject.size(); ++i) {
    const char c = subject[i];
    if (c == '\\' && i + 1 < subject.size()) {
      parts.back() += subject[++i];
    } else if (c == ',' || c == '+') {
      parts.emplace_back();
    } else {
      parts.back() += c;
    }
  }
  return parts;
}

}  // namespace

std::string RoleName(Role role) {
  switch (role) {
    case Role::kAdmin:
      return "admin";
    case Role::kSubmitter:
      return "submitter";
    case Role::kViewer:
      return "viewer";
    case Role::kWorker:
      return "worker";
    case Role::kJob:
      return "job";
  }
  return "unknown";
}

std::optional<Role> ParseRole(absl::string_view name) {
  for (Role r : kAllRoles) {
    if (RoleName(r) == name) return r;
  }
  return std::nullopt;
}

std::string AttemptScope::Describe() const {
  return absl::StrCat("process ", process_index, " of job ", job_id, " attempt ", attempt);
}

std::string Caller::Describe() const {
  if (unrestricted) return absl::StrCat(name, " (--insecure: no authentication)");
  return absl::StrCat(name, " (", RoleSetNames(roles), ", by ", via, ")");
}

std::vector<std::string> SubjectOrganizations(absl::string_view subject) {
  std::vector<std::string> out;
  for (const std::string& rdn : SplitRdns(subject)) {
    absl::string_view part = absl::StripAsciiWhitespace(rdn);
    if (absl::StartsWith(part, "O=")) out.emplace_back(part.substr(2));
  }
  return out;
}

const std::vector<MethodRule>& MethodRules() {
  static const auto* rules = new std::vector<MethodRule>{
      // Worker daemons, each as itself (checked by the server).
      {"substrax.v1.CoordinatorService/RegisterWorker", kWorkers},
      {"substrax.v1.CoordinatorService/Heartbeat", kWorkers},
      {"substrax.v1.CoordinatorService/WatchAssignments", kWorkers},
      {"substrax.v1.CoordinatorService/ReportAttemptStatus", kWorkers},
      {"substrax.v1.CoordinatorService/ShipLogs", kWorkers},
      // Job processes (attempt tokens, each for its own job, attempt and process while the
      // attempt runs; checked by the server), and workers as themselves.
      {"substrax.v1.CoordinatorService/ReportSteps", kWorkersAndJobs},
      {"substrax.v1.CoordinatorService/ReportCheckpoints", kWorkersAndJobs},
      // Rendezvous also needs the attempt's secret.
      {"substrax.v1.CoordinatorService/KeyValueSet", kWorkersAndJobs},
      {"substrax.v1.CoordinatorService/KeyValueGet", kWorkersAndJobs},
      {"substrax.v1.CoordinatorService/Barrier", kWorkersAndJobs},
      // Users. Cancel and delete: a submitter only its own jobs (checked by the server).
      {"substrax.v1.JobService/SubmitJob", kWriters},
      {"substrax.v1.JobService/CancelJob", kWriters},
      {"substrax.v1.JobService/DeleteJob", kWriters},
      {"substrax.v1.JobService/GetJob", kReaders},
      {"substrax.v1.JobService/ListJobs", kReaders},
      {"substrax.v1.JobService/WatchJob", kReaders},
      {"substrax.v1.JobService/ListWorkers", kReaders},
      {"substrax.v1.JobService/ListQueues", kReaders},
      {"substrax.v1.JobService/DiagnoseJob", kReaders},
      // A doctor job runs on every worker it can: an operator's command.
      {"substrax.v1.JobService/RunDoctor", R(Role::kAdmin)},
      {"substrax.v1.JobService/GetMesh", kReaders},
      {"substrax.v1.JobService/ReadLogs", kReaders},
      {"substrax.v1.MetricsService/QueryMetrics", kReaders},
  };
  return *rules;
}

absl::StatusOr<std::vector<TokenEntry>> ParseAuthConfig(absl::string_view yaml,
                                                        absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not YAML: ", e.what()));
  }
  std::vector<TokenEntry> tokens;
  if (!root || root.IsNull()) return tokens;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": expected a map with `tokens:`"));
  }
  for (const auto& key : root) {
    const std::string name = key.first.as<std::string>("");
    if (name != "tokens") {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": unknown key '", name, "' (only `tokens` is read)"));
    }
  }
  const YAML::Node list = root["tokens"];
  if (!list || list.IsNull()) return tokens;
  if (!list.IsSequence()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": tokens: expected a list"));
  }
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node entry = list[i];
    const std::string where = absl::StrCat(source, ": tokens[", i, "]");
    if (!entry.IsMap()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected name, role, sha256"));
    }
    TokenEntry t;
    t.name = entry["name"] ? entry["name"].as<std::string>("") : "";
    const std::string role = entry["role"] ? entry["role"].as<std::string>("") : "";
    t.sha256 = absl::AsciiStrToLower(entry["sha256"] ? entry["sha256"].as<std::string>("") : "");
    if (t.name.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ".name: missing"));
    std::optional<Role> parsed = ParseRole(role);
    if (!parsed.has_value() || *parsed == Role::kWorker || *parsed == Role::kJob) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".role: '", role, "' is not admin, submitter or viewer (workers use "
                                   "certificates, jobs their attempt tokens)"));
    }
    t.role = *parsed;
    if (t.sha256.size() != 64 ||
        t.sha256.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ".sha256: not 64 hex digits (`substraxctl certs token` prints the entry)"));
    }
    tokens.push_back(std::move(t));
  }
  return tokens;
}

absl::StatusOr<std::string> LoadOrCreateKey(const std::string& path) {
  std::ifstream in(path);
  if (in) {
    std::string key;
    std::getline(in, key);
    key = std::string(absl::StripAsciiWhitespace(key));
    if (key.size() < 32) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": the rendezvous key is shorter than 32 characters; delete the file to draw "
                "a new one (running attempts then lose their rendezvous)"));
    }
    return key;
  }
  const std::string key = pki::RandomToken(32);
  if (absl::Status s = pki::WritePrivateFile(path, key + "\n"); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot write the rendezvous key ", path, ": ", s.message()));
  }
  return key;
}

std::string AttemptToken(absl::string_view key, const AttemptScope& scope) {
  return absl::StrCat(kAttemptTokenPrefix, ".", scope.job_id, ".", scope.attempt, ".",
                      scope.process_index, ".", AttemptTokenMac(key, scope));
}

std::optional<AttemptScope> VerifyAttemptToken(absl::string_view key, absl::string_view given) {
  if (key.empty()) return std::nullopt;
  absl::string_view token = given;
  // Read from both ends: the prefix first, then the MAC, the process and the attempt from the
  // end; what is left is the job id.
  if (!absl::ConsumePrefix(&token, kAttemptTokenPrefix) || !absl::ConsumePrefix(&token, ".")) {
    return std::nullopt;
  }
  auto take_last = [&token](absl::string_view* part) {
    const size_t dot = token.rfind('.');
    if (dot == absl::string_view::npos) return false;
    *part = token.substr(dot + 1);
    token = token.substr(0, dot);
    return true;
  };
  absl::string_view mac, process, attempt;  // (the MAC is checked with the whole token)
  AttemptScope scope;
  if (!take_last(&mac) || !take_last(&process) || !take_last(&attempt) || token.empty() ||
      !absl::SimpleAtoi(attempt, &scope.attempt) ||
      !absl::SimpleAtoi(process, &scope.process_index) || scope.attempt < 0 ||
      scope.process_index < 0) {
    return std::nullopt;
  }
  scope.job_id = std::string(token);
  // The whole token against the one made for the scope read: one spelling per scope ("01" or
  // "+1" for 1 is not it).
  if (!pki::ConstantTimeEquals(given, AttemptToken(key, scope))) return std::nullopt;
  return scope;
}

void Authenticator::SetAttemptKey(std::string key) {
  absl::MutexLock lock(&mu_);
  attempt_key_ = std::move(key);
}

absl::StatusOr<std::unique_ptr<Authenticator>> Authenticator::Create(bool insecure,
                                                                     std::string auth_config) {
  std::unique_ptr<Authenticator> auth(new Authenticator(insecure, std::move(auth_config)));
  if (absl::Status s = auth->MaybeReload(/*force=*/true); !s.ok()) return s;
  return auth;
}

absl::Status Authenticator::MaybeReload(bool force) {
  if (auth_config_.empty()) return absl::OkStatus();
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (!force && now - last_check_ < absl::Seconds(1)) return absl::OkStatus();
    last_check_ = now;
  }
  struct stat st;
  if (stat(auth_config_.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth-config ", auth_config_, ": cannot be read"));
  }
  // A file replaced within one timestamp tick (a Secret update renames a new file in) still
  // differs in its inode.
  const std::string mtime = absl::StrCat(st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                                         st.st_mtim.tv_nsec);
  {
    absl::MutexLock lock(&mu_);
    if (!force && mtime == config_version_) return absl::OkStatus();
  }
  std::ifstream in(auth_config_);
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<std::vector<TokenEntry>> tokens =
      in ? ParseAuthConfig(text.str(), "--auth-config " + auth_config_)
         : absl::InvalidArgumentError(
               absl::StrCat("--auth-config ", auth_config_, ": cannot be read"));
  absl::MutexLock lock(&mu_);
  config_version_ = mtime;
  if (!tokens.ok()) return tokens.status();
  tokens_ = *std::move(tokens);
  return absl::OkStatus();
}

absl::StatusOr<Caller> Authenticator::Authenticate(const PeerCredentials& peer) {
  if (insecure_) return Caller{"anonymous", 0, "insecure", /*unrestricted=*/true, std::nullopt};
  if (peer.authorization.has_value()) {
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(*peer.authorization, kBearer)) {
      return absl::UnauthenticatedError(
          "the authorization header is not `Bearer <token>`");
    }
    const absl::string_view token = absl::string_view(*peer.authorization).substr(kBearer.size());
    // (A configured token never has a '.': `substraxctl certs token` draws base64url.)
    if (absl::StartsWith(token, absl::StrCat(kAttemptTokenPrefix, "."))) {
      std::optional<AttemptScope> scope;
      {
        absl::MutexLock lock(&mu_);
        scope = VerifyAttemptToken(attempt_key_, token);
      }
      if (!scope.has_value()) {
        return absl::UnauthenticatedError(
            "the attempt token is not recognized (a job's token is valid only with the "
            "coordinator key it was made with)");
      }
      return Caller{scope->Describe(), R(Role::kJob), "attempt token", false, std::move(scope)};
    }
    if (absl::Status s = MaybeReload(/*force=*/false); !s.ok()) {
      std::cerr << "substrax-coordinator: keeping the tokens loaded before: " << s.message()
                << "\n";
    }
    const std::string digest = pki::Sha256Hex(token);
    absl::MutexLock lock(&mu_);
    for (const TokenEntry& t : tokens_) {
      if (pki::ConstantTimeEquals(digest, t.sha256)) {
        return Caller{t.name, R(t.role), "token", false, std::nullopt};
      }
    }
    return absl::UnauthenticatedError("the bearer token is not recognized");
  }
  if (peer.common_name.empty()) {
    return absl::UnauthenticatedError(
        "no client certificate and no bearer token: give substraxctl --tls-cert/--tls-key or "
        "--token-file (docs/security.md)");
  }
  pki::CertificateInfo subject;
  subject.organizations = SubjectOrganizations(peer.subject);
  RoleSet roles = 0;
  for (const std::string& name : pki::RolesOf(subject)) {
    if (std::optional<Role> r = ParseRole(name)) roles |= R(*r);
  }
  return Caller{peer.common_name, roles, "certificate", false, std::nullopt};
}

absl::StatusOr<Caller> Authenticator::Authorize(const PeerCredentials& peer,
                                                absl::string_view method) {
  // gRPC reports "/substrax.v1.JobService/SubmitJob"; the table and messages drop the slash.
  absl::ConsumePrefix(&method, "/");
  absl::StatusOr<Caller> caller = Authenticate(peer);
  if (!caller.ok()) return caller.status();
  for (const MethodRule& rule : MethodRules()) {
    if (rule.method != method) continue;
    if (caller->unrestricted || (caller->roles & rule.roles) != 0) return caller;
    return absl::PermissionDeniedError(absl::StrCat(
        method, " needs the role ", RoleSetNames(rule.roles), "; the caller is ",
        caller->Describe(),
        caller->roles == 0 ? "; a certificate carries its role as O=substrax:<role>" : ""));
  }
  return absl::PermissionDeniedError(absl::StrCat(
      method, " has no authorization rule, so nobody may call it (MethodRules in "
              "coordinator/auth.cc lists every rpc the coordinator serves)"));
}

}  // namespace substrax
