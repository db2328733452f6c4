#include "rpc/transport.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace substrax {
namespace {

// Credential files are small; anything larger is not one.
constexpr std::streamsize kMaxCredentialFileBytes = 1 << 20;

constexpr char kHowToGet[] =
    "; `substraxctl certs` issues credentials (docs/security.md), `substraxctl local up` makes "
    "its own";

absl::StatusOr<std::string> ReadCredentialFile(const std::string& flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": cannot be read (missing, or not readable by this user)"));
  }
  std::string text(static_cast<size_t>(kMaxCredentialFileBytes) + 1, '\0');
  in.read(text.data(), kMaxCredentialFileBytes + 1);
  text.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<std::streamsize>(text.size()) > kMaxCredentialFileBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": larger than 1 MiB; not a PEM credential file"));
  }
  return text;
}

// Checks that `path` (given by `flag`) holds a PEM block of `kind` ("CERTIFICATE",
// "PRIVATE KEY").
absl::Status CheckPem(const std::string& flag, const std::string& path, const std::string& kind) {
  absl::StatusOr<std::string> text = ReadCredentialFile(flag, path);
  if (!text.ok()) return text.status();
  if (!absl::StrContains(*text, "-----BEGIN ") || !absl::StrContains(*text, kind + "-----")) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", path, ": not a PEM file with a ", kind, kHowToGet));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateTransport(const TransportOptions& options, bool server,
                               const std::string& flag_prefix) {
  if (options.insecure) return absl::OkStatus();
  const std::string ca = flag_prefix + "ca", cert = flag_prefix + "cert", key = flag_prefix + "key";
  if (options.ca_file.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        ca, " is required: the CA certificate that ",
        server ? "client certificates" : "the coordinator's certificate", " must be signed by",
        kHowToGet, " (--insecure for plaintext, tests only)"));
  }
  if (server && (options.cert_file.empty() || options.key_file.empty())) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert, " and ", key, " are required: the server's certificate and key",
                     kHowToGet, " (--insecure for plaintext, tests only)"));
  }
  if (options.cert_file.empty() != options.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(cert, " and ", key, " go together: give both or neither"));
  }
  if (absl::Status s = CheckPem(ca, options.ca_file, "CERTIFICATE"); !s.ok()) return s;
  if (!options.cert_file.empty()) {
    if (absl::Status s = CheckPem(cert, options.cert_file, "CERTIFICATE"); !s.ok()) return s;
    if (absl::Status s = CheckPem(key, options.key_file, "PRIVATE KEY"); !s.ok()) return s;
  }
  if (!options.token_file.empty()) {
    absl::StatusOr<std::string> token = ReadCredentialFile("--token-file", options.token_file);
    if (!token.ok()) return token.status();
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportOptions& options) {
  if (options.insecure) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.ca_file,
      std::max<int64_t>(1, absl::ToInt64Seconds(options.reload_interval)));
  grpc::experimental::TlsServerCredentialsOptions tls(provider);
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  // Requested, and verified when presented; a caller without one may still bring a bearer
  // token, and the coordinator refuses a call that has neither (UNAUTHENTICATED).
  tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(tls);
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TransportOptions& options,
                                                           grpc::ChannelArguments args) {
  if (options.insecure) {
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  }
  if (absl::Status s = ValidateTransport(options, /*server=*/false); !s.ok()) return s;
  std::shared_ptr<grpc::experimental::CertificateProviderInterface> provider;
  const int64_t refresh = std::max<int64_t>(1, absl::ToInt64Seconds(options.reload_interval));
  if (options.cert_file.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options.ca_file, refresh);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        options.key_file, options.cert_file, options.ca_file, refresh);
  }
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(provider);
  tls.watch_root_certs();
  if (!options.cert_file.empty()) tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  tls.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::experimental::TlsCredentials(tls);
  if (!options.token.empty()) {
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::AccessTokenCredentials(options.token));
  } else if (!options.token_file.empty()) {
    absl::StatusOr<std::string> text = ReadCredentialFile("--token-file", options.token_file);
    if (!text.ok()) return text.status();
    const std::string token(absl::StripAsciiWhitespace(*text));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--token-file ", options.token_file, ": the file is empty"));
    }
    credentials = grpc::CompositeChannelCredentials(credentials,
                                                    grpc::AccessTokenCredentials(token));
  }
  if (!options.server_name.empty()) {
    args.SetSslTargetNameOverride(options.server_name);
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

std::string InsecureWarning(const std::string& program) {
  return absl::StrCat(program,
                      ": WARNING: --insecure: plaintext gRPC without authentication; anyone who "
                      "reaches this process can act as any user or worker. For tests only.");
}

}  // namespace substrax
