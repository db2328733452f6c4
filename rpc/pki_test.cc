#include "rpc/pki.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <sys/stat.h>

#include <cstdlib>
#include <functional>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"

namespace substrax::pki {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Whole seconds: certificates keep no fractions.
absl::Time Now() { return absl::FromUnixSeconds(absl::ToUnixSeconds(absl::Now())); }

KeyAndCert MakeCa(const std::string& name, absl::Time not_before, absl::Time not_after) {
  absl::StatusOr<KeyAndCert> ca = CreateCertificateAuthority(name, not_before, not_after);
  EXPECT_TRUE(ca.ok()) << ca.status();
  return ca.ok() ? *ca : KeyAndCert{};
}

CertificateRequest ClientRequest(const std::string& name, const std::string& role) {
  CertificateRequest request;
  request.common_name = name;
  request.organizations = {absl::StrCat(kRolePrefix, role)};
  request.not_before = Now() - absl::Hours(1);
  request.not_after = Now() + absl::Hours(24);
  return request;
}

CertificateRequest ServerRequest() {
  CertificateRequest request;
  request.common_name = kCoordinatorCommonName;
  request.dns_names = {"localhost"};
  request.ip_addresses = {"127.0.0.1", "::1"};
  request.server_auth = true;
  request.client_auth = false;
  request.not_before = Now() - absl::Hours(1);
  request.not_after = Now() + absl::Hours(24);
  return request;
}

KeyAndCert Issue(const KeyAndCert& ca, const CertificateRequest& request) {
  absl::StatusOr<KeyAndCert> cert = IssueCertificate(ca, request);
  EXPECT_TRUE(cert.ok()) << cert.status();
  return cert.ok() ? *cert : KeyAndCert{};
}

class PkiTest : public ::testing::Test {
 protected:
  const absl::Time now_ = Now();
  const KeyAndCert ca_ = MakeCa("test-ca", now_ - absl::Hours(48), now_ + absl::Hours(24 * 365));
};

TEST_F(PkiTest, CertificateAuthorityIsSelfSignedCa) {
  EXPECT_THAT(ca_.key_pem, HasSubstr("-----BEGIN PRIVATE KEY-----"));
  absl::StatusOr<CertificateInfo> info = ParseCertificate(ca_.cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "test-ca");
  EXPECT_EQ(info->issuer_common_name, "test-ca");
  EXPECT_TRUE(info->is_ca);
  EXPECT_EQ(info->not_before, now_ - absl::Hours(48));
  EXPECT_EQ(info->not_after, now_ + absl::Hours(24 * 365));
}

TEST_F(PkiTest, ClientCertificateCarriesIdentityAndRole) {
  const KeyAndCert cert = Issue(ca_, ClientRequest("alice", "admin"));
  absl::StatusOr<CertificateInfo> info = ParseCertificate(cert.cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "alice");
  EXPECT_THAT(info->organizations, ElementsAre("substrax:admin"));
  EXPECT_THAT(RolesOf(*info), ElementsAre("admin"));
  EXPECT_EQ(info->issuer_common_name, "test-ca");
  EXPECT_FALSE(info->is_ca);
  EXPECT_TRUE(info->client_auth);
  EXPECT_FALSE(info->server_auth);
  EXPECT_THAT(info->dns_names, IsEmpty());
  EXPECT_THAT(info->ip_addresses, IsEmpty());
}

TEST_F(PkiTest, ServerCertificateHasSubjectAltNames) {
  const KeyAndCert cert = Issue(ca_, ServerRequest());
  absl::StatusOr<CertificateInfo> info = ParseCertificate(cert.cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "substrax-coordinator");
  EXPECT_THAT(info->dns_names, ElementsAre("localhost"));
  EXPECT_THAT(info->ip_addresses, ElementsAre("127.0.0.1", "::1"));
  EXPECT_TRUE(info->server_auth);
  EXPECT_FALSE(info->client_auth);
  EXPECT_THAT(RolesOf(*info), IsEmpty());
}

TEST_F(PkiTest, SerialsAreRandom128BitNumbers) {
  const CertificateRequest request = ClientRequest("bob", "viewer");
  absl::StatusOr<CertificateInfo> a = ParseCertificate(Issue(ca_, request).cert_pem);
  absl::StatusOr<CertificateInfo> b = ParseCertificate(Issue(ca_, request).cert_pem);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->serial_hex, b->serial_hex);
  for (const std::string& serial : {a->serial_hex, b->serial_hex}) {
    EXPECT_GE(serial.size(), 31u) << serial;  // 16 octets, high bit clear, low bit of the first set
    EXPECT_LE(serial.size(), 32u) << serial;
  }
}

TEST_F(PkiTest, ParseTakesTheFirstCertificateOfAChain) {
  const KeyAndCert cert = Issue(ca_, ClientRequest("carol", "submitter"));
  absl::StatusOr<CertificateInfo> info = ParseCertificate(cert.cert_pem + ca_.cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "carol");
  // A key before the certificate is skipped too.
  info = ParseCertificate(cert.key_pem + cert.cert_pem);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->common_name, "carol");
}

TEST_F(PkiTest, ParseRejectsWhatIsNotACertificate) {
  for (const std::string& text : {std::string(""), std::string("hello"), ca_.key_pem,
                                  std::string("-----BEGIN CERTIFICATE-----\nAAAA\n"
                                              "-----END CERTIFICATE-----\n")}) {
    absl::StatusOr<CertificateInfo> info = ParseCertificate(text);
    EXPECT_EQ(info.status().code(), absl::StatusCode::kInvalidArgument) << text;
  }
}

TEST_F(PkiTest, BadRequestsAreInvalidArguments) {
  struct Case {
    const char* what;
    std::function<void(CertificateRequest&)> change;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"empty CN", [](auto& r) { r.common_name = ""; }, "CN must have 1 to 64"},
      {"long CN", [](auto& r) { r.common_name = std::string(65, 'a'); }, "CN must have 1 to 64"},
      {"empty O", [](auto& r) { r.organizations = {""}; }, "O must have 1 to 64"},
      {"DNS with comma", [](auto& r) { r.dns_names = {"a.com,IP:1.2.3.4"}; }, "not a DNS name"},
      {"DNS empty label", [](auto& r) { r.dns_names = {"a..com"}; }, "not a DNS name"},
      {"DNS inner wildcard", [](auto& r) { r.dns_names = {"a.*.com"}; }, "not a DNS name"},
      {"bad IP", [](auto& r) { r.ip_addresses = {"1.2.3"}; }, "not an IP address"},
      {"IP with port", [](auto& r) { r.ip_addresses = {"10.0.0.1:7070"}; }, "not an IP address"},
      {"no usage", [](auto& r) { r.client_auth = r.server_auth = false; }, "server_auth"},
      {"unset time", [](auto& r) { r.not_before = absl::InfinitePast(); }, "finite"},
      {"backwards", [](auto& r) { r.not_after = r.not_before; }, "must end after it begins"},
  };
  for (const Case& c : cases) {
    CertificateRequest request = ClientRequest("dave", "viewer");
    c.change(request);
    absl::StatusOr<KeyAndCert> cert = IssueCertificate(ca_, request);
    EXPECT_EQ(cert.status().code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(cert.status().message(), HasSubstr(c.message)) << c.what;
  }
  CertificateRequest wildcard = ServerRequest();
  wildcard.dns_names = {"*.example.com", "coordinator-0.substrax.svc"};
  EXPECT_TRUE(IssueCertificate(ca_, wildcard).ok());
}

TEST_F(PkiTest, CertificateMustNotOutliveItsCa) {
  CertificateRequest request = ClientRequest("erin", "worker");
  request.not_after = now_ + absl::Hours(24 * 366);
  absl::StatusOr<KeyAndCert> cert = IssueCertificate(ca_, request);
  EXPECT_EQ(cert.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(cert.status().message(), HasSubstr("fewer days or renew the CA"));
}

TEST_F(PkiTest, BadCaIsRejected) {
  const KeyAndCert other = MakeCa("other-ca", now_ - absl::Hours(1), now_ + absl::Hours(48));
  const CertificateRequest request = ClientRequest("frank", "viewer");

  absl::StatusOr<KeyAndCert> mixed = IssueCertificate({other.key_pem, ca_.cert_pem}, request);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mixed.status().message(), HasSubstr("not the key of the CA certificate"));

  const KeyAndCert leaf = Issue(ca_, request);
  absl::StatusOr<KeyAndCert> from_leaf = IssueCertificate(leaf, request);
  EXPECT_EQ(from_leaf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(from_leaf.status().message(), HasSubstr("is not a CA"));

  absl::StatusOr<KeyAndCert> no_key = IssueCertificate({"", ca_.cert_pem}, request);
  EXPECT_EQ(no_key.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_key.status().message(), HasSubstr("the CA key"));

  absl::StatusOr<KeyAndCert> no_cert = IssueCertificate({ca_.key_pem, "x"}, request);
  EXPECT_EQ(no_cert.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_cert.status().message(), HasSubstr("the CA certificate"));
}

TEST(CreateCertificateAuthorityTest, RejectsBadArguments) {
  const absl::Time now = Now();
  EXPECT_EQ(CreateCertificateAuthority("", now, now + absl::Hours(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCertificateAuthority("ca", now, now).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateCertificateAuthority("ca", now, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(DigestTest, KnownAnswers) {
  // FIPS 180-2 appendix B.1 and RFC 4231 test case 2.
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(HmacSha256Hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(HmacSha256Hex("", "").size(), 64u);
}

TEST(ConstantTimeEqualsTest, ComparesContentAndLength) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
}

TEST(RandomTokenTest, UrlSafeAndFresh) {
  const std::string a = RandomToken();
  const std::string b = RandomToken();
  EXPECT_EQ(a.size(), 43u);  // 32 bytes in base64url, unpadded
  EXPECT_NE(a, b);
  for (char c : a + b) {
    EXPECT_TRUE(absl::ascii_isalnum(c) || c == '-' || c == '_') << a << " " << b;
  }
  EXPECT_EQ(RandomToken(16).size(), 22u);
}

class FileTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) {
    return absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  static mode_t Mode(const std::string& path) {
    struct stat st;
    EXPECT_EQ(stat(path.c_str(), &st), 0) << path;
    return st.st_mode & 07777;
  }
};

TEST_F(FileTest, PrivateAndPublicModesDoNotDependOnUmask) {
  const mode_t old_umask = umask(0);
  const std::string key = Path("key.pem");
  const std::string cert = Path("cert.pem");
  ASSERT_TRUE(WritePrivateFile(key, "first").ok());
  ASSERT_TRUE(WritePrivateFile(key, "second").ok());  // replaces
  ASSERT_TRUE(WritePublicFile(cert, "public").ok());
  umask(077);
  const std::string cert2 = Path("cert2.pem");
  ASSERT_TRUE(WritePublicFile(cert2, "public").ok());
  umask(old_umask);
  EXPECT_EQ(Read(key), "second");
  EXPECT_EQ(Mode(key), 0600u);
  EXPECT_EQ(Mode(cert), 0644u);
  EXPECT_EQ(Mode(cert2), 0644u);
}

TEST_F(FileTest, MissingDirectoryNamesTheFile) {
  const std::string path = Path("no-such-dir/ca.key");
  absl::Status status = WritePrivateFile(path, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(path));
  EXPECT_THAT(status.message(), HasSubstr("check that its directory exists"));
}

// grpc.health.v1 that records the client certificate's CN the server saw.
class RecordingHealthService final : public grpc::health::v1::Health::Service {
 public:
  grpc::Status Check(grpc::ServerContext* context, const grpc::health::v1::HealthCheckRequest*,
                     grpc::health::v1::HealthCheckResponse* response) override {
    std::vector<std::string> names;
    for (const grpc::string_ref& cn :
         context->auth_context()->FindPropertyValues("x509_common_name")) {
      names.emplace_back(cn.data(), cn.size());
    }
    absl::MutexLock lock(&mu_);
    common_names_ = std::move(names);
    response->set_status(grpc::health::v1::HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }

  std::vector<std::string> common_names() {
    absl::MutexLock lock(&mu_);
    return common_names_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> common_names_ ABSL_GUARDED_BY(mu_);
};

// A real gRPC server with mutual TLS on a free loopback port, trusting ca_ for clients.
class MutualTlsTest : public PkiTest {
 protected:
  void SetUp() override {
    const KeyAndCert server = Issue(ca_, ServerRequest());
    auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
        ca_.cert_pem, std::vector<grpc::experimental::IdentityKeyCertPair>{
                          {server.key_pem, server.cert_pem}});
    grpc::experimental::TlsServerCredentialsOptions options(provider);
    options.watch_root_certs();
    options.watch_identity_key_cert_pairs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::experimental::TlsServerCredentials(options),
                             &port_);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  }

  // A health check over a channel with `identity` (none when its key is empty) that trusts `root`.
  grpc::Status Check(const KeyAndCert& identity, const std::string& root) {
    std::vector<grpc::experimental::IdentityKeyCertPair> pairs;
    if (!identity.key_pem.empty()) pairs.push_back({identity.key_pem, identity.cert_pem});
    grpc::experimental::TlsChannelCredentialsOptions options;
    options.set_certificate_provider(
        std::make_shared<grpc::experimental::StaticDataCertificateProvider>(root, pairs));
    options.watch_root_certs();
    if (!pairs.empty()) options.watch_identity_key_cert_pairs();
    options.set_certificate_verifier(
        std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_),
                                       grpc::experimental::TlsCredentials(options));
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    grpc::health::v1::HealthCheckRequest request;
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = stub->Check(&context, request, &response);
    if (status.ok()) {
      EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
    }
    return status;
  }

  RecordingHealthService health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(MutualTlsTest, ClientOfTheSameCaConnectsAndIsNamed) {
  grpc::Status status = Check(Issue(ca_, ClientRequest("alice", "submitter")), ca_.cert_pem);
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_THAT(health_.common_names(), ElementsAre("alice"));
}

TEST_F(MutualTlsTest, ClientOfAnotherCaIsRefused) {
  const KeyAndCert other = MakeCa("other-ca", now_ - absl::Hours(1), now_ + absl::Hours(48));
  grpc::Status status = Check(Issue(other, ClientRequest("mallory", "admin")), ca_.cert_pem);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(health_.common_names(), IsEmpty());
}

TEST_F(MutualTlsTest, ExpiredClientIsRefused) {
  CertificateRequest request = ClientRequest("alice", "submitter");
  request.not_before = now_ - absl::Hours(47);
  request.not_after = now_ - absl::Hours(1);
  grpc::Status status = Check(Issue(ca_, request), ca_.cert_pem);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
  EXPECT_THAT(health_.common_names(), IsEmpty());
}

TEST_F(MutualTlsTest, ClientWithoutCertificateIsRefused) {
  grpc::Status status = Check(KeyAndCert{}, ca_.cert_pem);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

TEST_F(MutualTlsTest, ClientRefusesServerOfAnotherCa) {
  const KeyAndCert other = MakeCa("other-ca", now_ - absl::Hours(1), now_ + absl::Hours(48));
  grpc::Status status = Check(Issue(ca_, ClientRequest("alice", "viewer")), other.cert_pem);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
}

}  // namespace
}  // namespace substrax::pki
