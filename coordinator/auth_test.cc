#include "coordinator/auth.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "absl/time/clock.h"
#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "rpc/pki.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "substrax/v1/metrics_service.grpc.pb.h"

namespace substrax {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string WriteConfig(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path) << text;
  return path;
}

std::string TokenConfig(const std::string& name, const std::string& role,
                        const std::string& token) {
  return "tokens:\n- name: " + name + "\n  role: " + role + "\n  sha256: " +
         pki::Sha256Hex(token) + "\n";
}

PeerCredentials Cert(const std::string& cn, const std::string& role) {
  PeerCredentials p;
  p.common_name = cn;
  p.subject = role.empty() ? "CN=" + cn : "O=substrax:" + role + ",CN=" + cn;
  return p;
}

PeerCredentials Token(const std::string& token) {
  PeerCredentials p;
  p.authorization = "Bearer " + token;
  return p;
}

TEST(MethodRulesTest, EveryRpcOfEveryServiceHasARule) {
  std::set<std::string> ruled;
  for (const MethodRule& rule : MethodRules()) {
    EXPECT_TRUE(ruled.insert(rule.method).second) << "twice: " << rule.method;
    EXPECT_NE(rule.roles, 0) << rule.method;
  }
  std::set<std::string> served;
  for (const char* name : {v1::CoordinatorService::service_full_name(),
                           v1::JobService::service_full_name(),
                           v1::MetricsService::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(name);
    ASSERT_NE(service, nullptr) << name;
    for (int i = 0; i < service->method_count(); ++i) {
      served.insert(service->full_name() + "/" + service->method(i)->name());
    }
  }
  EXPECT_EQ(ruled, served);
}

TEST(SubjectTest, OrganizationsOfAnRfc2253Subject) {
  EXPECT_EQ(SubjectOrganizations("O=substrax:admin,CN=alice"),
            std::vector<std::string>{"substrax:admin"});
  EXPECT_EQ(SubjectOrganizations("CN=x,O=a\\,b+O=substrax:viewer"),
            (std::vector<std::string>{"a,b", "substrax:viewer"}));
  EXPECT_TRUE(SubjectOrganizations("CN=O=substrax:admin").empty());
}

TEST(AuthenticatorTest, CertificatesCarryTheirRoleInO) {
  auto auth = Authenticator::Create(false, "");
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<Caller> viewer =
      (*auth)->Authorize(Cert("bob", "viewer"), "substrax.v1.JobService/ListJobs");
  ASSERT_TRUE(viewer.ok()) << viewer.status();
  EXPECT_EQ(viewer->name, "bob");
  EXPECT_TRUE(viewer->Has(Role::kViewer));
  EXPECT_FALSE(viewer->Has(Role::kSubmitter));

  absl::StatusOr<Caller> submit =
      (*auth)->Authorize(Cert("bob", "viewer"), "substrax.v1.JobService/SubmitJob");
  EXPECT_EQ(submit.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(submit.status().message().find("admin, submitter"), std::string::npos)
      << submit.status();
  // A user's certificate is no worker's, and a worker's is no user's.
  EXPECT_EQ((*auth)
                ->Authorize(Cert("alice", "admin"), "substrax.v1.CoordinatorService/Heartbeat")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ((*auth)->Authorize(Cert("w-1", "worker"), "substrax.v1.JobService/GetJob")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  // No role at all (a server certificate used as a client's).
  absl::StatusOr<Caller> none =
      (*auth)->Authorize(Cert("substrax-coordinator", ""), "substrax.v1.JobService/GetJob");
  EXPECT_EQ(none.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(none.status().message().find("O=substrax:<role>"), std::string::npos);
}

TEST(AuthenticatorTest, NothingPresentedIsUnauthenticated) {
  auto auth = Authenticator::Create(false, "");
  ASSERT_TRUE(auth.ok());
  absl::StatusOr<Caller> c = (*auth)->Authorize({}, "substrax.v1.JobService/GetJob");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(c.status().message().find("no client certificate and no bearer token"),
            std::string::npos);
}

TEST(AuthenticatorTest, TokensAreMatchedByDigestAndNeverExplained) {
  const std::string path = WriteConfig("tokens.yaml", TokenConfig("carol", "submitter", "s3cret"));
  auto auth = Authenticator::Create(false, path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  absl::StatusOr<Caller> carol =
      (*auth)->Authorize(Token("s3cret"), "substrax.v1.JobService/SubmitJob");
  ASSERT_TRUE(carol.ok()) << carol.status();
  EXPECT_EQ(carol->name, "carol");
  EXPECT_EQ(carol->via, "token");

  absl::StatusOr<Caller> wrong = (*auth)->Authorize(Token("s3cres"), "substrax.v1.JobService/GetJob");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(wrong.status().message(), "the bearer token is not recognized");
  PeerCredentials basic;
  basic.authorization = "Basic abc";
  EXPECT_EQ((*auth)->Authorize(basic, "substrax.v1.JobService/GetJob").status().code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(AuthenticatorTest, TheConfigIsReadAgainWhenItChanges) {
  const std::string path = WriteConfig("reload.yaml", TokenConfig("dan", "viewer", "one"));
  auto auth = Authenticator::Create(false, path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  ASSERT_TRUE((*auth)->Authenticate(Token("one")).ok());
  // A new file (a new inode and mtime) as a Secret update would write it; looked at again at
  // most once a second, so poll with a deadline.
  WriteConfig("reload.yaml.new", TokenConfig("dan", "viewer", "two"));
  ASSERT_EQ(std::rename((path + ".new").c_str(), path.c_str()), 0);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!(*auth)->Authenticate(Token("two")).ok() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));  // polling, bounded by the deadline
  }
  EXPECT_TRUE((*auth)->Authenticate(Token("two")).ok());
  EXPECT_FALSE((*auth)->Authenticate(Token("one")).ok());
}

TEST(AuthenticatorTest, BadConfigsNameTheEntryAndField) {
  EXPECT_NE(ParseAuthConfig("tokens:\n- name: a\n  role: root\n  sha256: x\n", "f.yaml")
                .status()
                .message()
                .find("f.yaml: tokens[0].role: 'root'"),
            std::string::npos);
  EXPECT_NE(ParseAuthConfig("tokens:\n- name: a\n  role: viewer\n  sha256: abc\n", "f.yaml")
                .status()
                .message()
                .find("tokens[0].sha256: not 64 hex digits"),
            std::string::npos);
  EXPECT_NE(ParseAuthConfig("users: []\n", "f.yaml").status().message().find("unknown key"),
            std::string::npos);
  EXPECT_TRUE(ParseAuthConfig("", "f.yaml").ok());
  EXPECT_FALSE(Authenticator::Create(false, TempPath("missing.yaml")).ok());
}

TEST(AuthenticatorTest, InsecureLetsEveryoneThrough) {
  auto auth = Authenticator::Create(true, "");
  ASSERT_TRUE(auth.ok());
  absl::StatusOr<Caller> c = (*auth)->Authorize({}, "substrax.v1.JobService/CancelJob");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->unrestricted);
}

TEST(AuthenticatorTest, AMethodWithoutARuleIsRefused) {
  auto auth = Authenticator::Create(false, "");
  ASSERT_TRUE(auth.ok());
  EXPECT_EQ((*auth)->Authorize(Cert("alice", "admin"), "/substrax.v1.JobService/Nope")
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  // Not even with --insecure, which lifts every other check.
  auto insecure = Authenticator::Create(true, "");
  ASSERT_TRUE(insecure.ok());
  EXPECT_EQ((*insecure)->Authorize({}, "/grpc.health.v1.Health/Check").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AuthenticatorTest, TakesTheMethodAsGrpcReportsIt) {
  auto auth = Authenticator::Create(false, "");
  ASSERT_TRUE(auth.ok());
  EXPECT_TRUE((*auth)->Authorize(Cert("bob", "viewer"), "/substrax.v1.JobService/ListJobs").ok());
  absl::StatusOr<Caller> denied =
      (*auth)->Authorize(Cert("bob", "viewer"), "/substrax.v1.JobService/SubmitJob");
  EXPECT_EQ(denied.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(denied.status().message().find("substrax.v1.JobService/SubmitJob needs the role"), 0u)
      << denied.status().message();
}

constexpr char kKey[] = "0123456789abcdef0123456789abcdef";

std::unique_ptr<Authenticator> WithAttemptKey() {
  auto auth = Authenticator::Create(false, "");
  EXPECT_TRUE(auth.ok()) << auth.status();
  (*auth)->SetAttemptKey(kKey);
  return *std::move(auth);
}

TEST(AttemptTokenTest, ItsOwnScopeIsAcceptedAsAJobCaller) {
  const AttemptScope scope{"mnist-3", 2, 1};
  const std::string token = AttemptToken(kKey, scope);
  EXPECT_EQ(token.rfind("sxa1.mnist-3.2.1.", 0), 0u) << token;
  std::unique_ptr<Authenticator> auth = WithAttemptKey();
  absl::StatusOr<Caller> caller =
      auth->Authorize(Token(token), "substrax.v1.CoordinatorService/ReportSteps");
  ASSERT_TRUE(caller.ok()) << caller.status();
  EXPECT_TRUE(caller->Has(Role::kJob));
  EXPECT_FALSE(caller->Has(Role::kWorker));
  EXPECT_EQ(caller->via, "attempt token");
  ASSERT_TRUE(caller->attempt.has_value());
  EXPECT_EQ(caller->attempt->job_id, "mnist-3");
  EXPECT_EQ(caller->attempt->attempt, 2);
  EXPECT_EQ(caller->attempt->process_index, 1);
  EXPECT_EQ(caller->Describe(), "process 1 of job mnist-3 attempt 2 (job, by attempt token)");
  // A worker's or a user's caller has no attempt scope.
  absl::StatusOr<Caller> worker =
      auth->Authorize(Cert("w-1", "worker"), "substrax.v1.CoordinatorService/ReportSteps");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_FALSE(worker->attempt.has_value());
}

TEST(AttemptTokenTest, EachScopeHasItsOwnToken) {
  const AttemptScope scope{"mnist-3", 2, 1};
  const std::string token = AttemptToken(kKey, scope);
  for (const AttemptScope& other : {AttemptScope{"mnist-4", 2, 1}, AttemptScope{"mnist-3", 3, 1},
                                    AttemptScope{"mnist-3", 2, 0}}) {
    EXPECT_NE(AttemptToken(kKey, other), token) << other.Describe();
    std::optional<AttemptScope> verified = VerifyAttemptToken(kKey, AttemptToken(kKey, other));
    ASSERT_TRUE(verified.has_value()) << other.Describe();
    EXPECT_EQ(verified->Describe(), other.Describe());
  }
  // The MAC of one scope under another scope's name: refused.
  const std::string mac = token.substr(token.rfind('.') + 1);
  for (const char* forged : {"sxa1.mnist-4.2.1.", "sxa1.mnist-3.3.1.", "sxa1.mnist-3.2.0.",
                             "sxa1.mnist-3.2.01.", "sxa1.mnist-3.2.-1."}) {
    EXPECT_FALSE(VerifyAttemptToken(kKey, forged + mac).has_value()) << forged;
  }
  // Another coordinator's key; no key at all.
  EXPECT_FALSE(VerifyAttemptToken("another key of 32 characters....", token).has_value());
  EXPECT_FALSE(VerifyAttemptToken("", token).has_value());
  // Never the attempt's rendezvous secret, nor the other way round.
  EXPECT_NE(mac, pki::HmacSha256Hex(kKey, "mnist-3/2"));
}

TEST(AttemptTokenTest, AForgedOrTruncatedTokenIsUnauthenticated) {
  const std::string token = AttemptToken(kKey, AttemptScope{"mnist-3", 2, 1});
  std::string flipped = token;
  flipped.back() = flipped.back() == '0' ? '1' : '0';
  std::unique_ptr<Authenticator> auth = WithAttemptKey();
  for (const std::string& bad :
       {token.substr(0, token.size() - 1), token.substr(0, token.rfind('.')), flipped,
        std::string("sxa1."), std::string("sxa1...."), token + "0", token + ".1",
        AttemptToken("another key of 32 characters....", AttemptScope{"mnist-3", 2, 1})}) {
    absl::StatusOr<Caller> caller =
        auth->Authorize(Token(bad), "substrax.v1.CoordinatorService/ReportSteps");
    EXPECT_EQ(caller.status().code(), absl::StatusCode::kUnauthenticated) << bad;
    EXPECT_NE(caller.status().message().find("the attempt token is not recognized"),
              std::string::npos)
        << caller.status();
  }
  // Before the server sets the key, no attempt token is anyone's.
  auto keyless = Authenticator::Create(false, "");
  ASSERT_TRUE(keyless.ok());
  EXPECT_EQ((*keyless)->Authenticate(Token(token)).status().code(),
            absl::StatusCode::kUnauthenticated);
  // An auth config cannot hand out the job role (nor the worker's).
  EXPECT_NE(ParseAuthConfig(TokenConfig("j", "job", "t"), "f.yaml")
                .status()
                .message()
                .find("jobs their attempt tokens"),
            std::string::npos);
}

// Every rpc of MethodRules: a job's process may call its reports and its rendezvous, and
// nothing a worker daemon or a user calls.
TEST(AttemptTokenTest, AJobCallerIsRefusedEverythingButReportsAndRendezvous) {
  const std::set<std::string> job_rpcs = {
      "substrax.v1.CoordinatorService/ReportSteps",
      "substrax.v1.CoordinatorService/ReportCheckpoints",
      "substrax.v1.CoordinatorService/KeyValueSet",
      "substrax.v1.CoordinatorService/KeyValueGet",
      "substrax.v1.CoordinatorService/Barrier",
  };
  std::unique_ptr<Authenticator> auth = WithAttemptKey();
  const PeerCredentials job = Token(AttemptToken(kKey, AttemptScope{"mnist-3", 2, 0}));
  std::set<std::string> allowed;
  for (const MethodRule& rule : MethodRules()) {
    absl::StatusOr<Caller> caller = auth->Authorize(job, rule.method);
    if (caller.ok()) {
      allowed.insert(rule.method);
      continue;
    }
    EXPECT_EQ(caller.status().code(), absl::StatusCode::kPermissionDenied) << rule.method;
    EXPECT_NE(caller.status().message().find("process 0 of job mnist-3 attempt 2 (job, by "
                                             "attempt token)"),
              std::string::npos)
        << caller.status();
  }
  EXPECT_EQ(allowed, job_rpcs);
  // And the worker-only ones stay the worker's.
  for (const char* method : {"substrax.v1.CoordinatorService/RegisterWorker",
                             "substrax.v1.CoordinatorService/Heartbeat",
                             "substrax.v1.CoordinatorService/WatchAssignments",
                             "substrax.v1.CoordinatorService/ReportAttemptStatus",
                             "substrax.v1.CoordinatorService/ShipLogs"}) {
    EXPECT_TRUE(auth->Authorize(Cert("w-1", "worker"), method).ok()) << method;
    EXPECT_EQ(auth->Authorize(job, method).status().code(), absl::StatusCode::kPermissionDenied)
        << method;
  }
}

TEST(AuthenticatorTest, OnlyAdminsRunTheDoctor) {
  std::unique_ptr<Authenticator> auth = WithAttemptKey();
  constexpr char kMethod[] = "substrax.v1.JobService/RunDoctor";
  EXPECT_TRUE(auth->Authorize(Cert("ops", "admin"), kMethod).ok());
  for (const char* role : {"submitter", "viewer", "worker"}) {
    EXPECT_EQ(auth->Authorize(Cert("someone", role), kMethod).status().code(),
              absl::StatusCode::kPermissionDenied)
        << role;
  }
}

TEST(KeyTest, DrawnOnceAndKept) {
  const std::string path = TempPath("rendezvous.key");
  std::remove(path.c_str());
  absl::StatusOr<std::string> first = LoadOrCreateKey(path);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_GE(first->size(), 32u);
  absl::StatusOr<std::string> again = LoadOrCreateKey(path);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*first, *again);
  EXPECT_EQ(access(path.c_str(), R_OK), 0);
}

}  // namespace
}  // namespace substrax
