#include "client/local_credentials.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/pki.h"

namespace substrax::ctl {
namespace {

// Local certificates live as long as a long-running local cluster might; the CA longer.
constexpr absl::Duration kLeafValidity = absl::Hours(24 * 365);
constexpr absl::Duration kCaValidity = absl::Hours(24 * 365 * 10);
// Tolerates clocks a little apart, as between a container and its host.
constexpr absl::Duration kBackdate = absl::Hours(1);

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::Status WritePair(const std::string& tls_dir, const std::string& name,
                       const pki::KeyAndCert& pair) {
  if (absl::Status s = pki::WritePrivateFile(absl::StrCat(tls_dir, "/", name, ".key"),
                                             pair.key_pem);
      !s.ok()) {
    return s;
  }
  return pki::WritePublicFile(absl::StrCat(tls_dir, "/", name, ".crt"), pair.cert_pem);
}

}  // namespace

absl::Status IssueLocalCredentials(const std::string& tls_dir,
                                   const std::vector<std::string>& workers) {
  std::error_code ec;
  std::filesystem::create_directories(tls_dir, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("cannot create ", tls_dir, ": ", ec.message()));
  }
  std::filesystem::permissions(tls_dir, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::replace, ec);
  const absl::Time now = absl::Now();
  pki::KeyAndCert ca;
  const std::string ca_cert = tls_dir + "/ca.crt", ca_key = tls_dir + "/ca.key";
  if (std::filesystem::exists(ca_cert) && std::filesystem::exists(ca_key)) {
    absl::StatusOr<std::string> cert = ReadFile(ca_cert), key = ReadFile(ca_key);
    if (!cert.ok()) return cert.status();
    if (!key.ok()) return key.status();
    ca = {*key, *cert};
  } else {
    absl::StatusOr<pki::KeyAndCert> made =
        pki::CreateCertificateAuthority("substrax-local-ca", now - kBackdate, now + kCaValidity);
    if (!made.ok()) return made.status();
    ca = *std::move(made);
    if (absl::Status s = WritePair(tls_dir, "ca", ca); !s.ok()) return s;
  }
  struct Leaf {
    std::string file;  // NAME of NAME.crt, NAME.key
    pki::CertificateRequest request;
  };
  std::vector<Leaf> leaves = {
      {kLocalCoordinatorIdentity,
       pki::RequestFor(pki::kCoordinatorCommonName, "server", {"localhost"}, {"127.0.0.1", "::1"},
                       now - kBackdate, now + kLeafValidity)},
      {kLocalAdminIdentity, pki::RequestFor(kLocalAdminIdentity, "admin", {}, {}, now - kBackdate,
                                            now + kLeafValidity)}};
  for (const std::string& w : workers) {
    leaves.push_back(
        {w, pki::RequestFor(w, "worker", {}, {}, now - kBackdate, now + kLeafValidity)});
  }
  for (const Leaf& leaf : leaves) {
    absl::StatusOr<pki::KeyAndCert> issued = pki::IssueCertificate(ca, leaf.request);
    if (!issued.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("cannot issue the local certificate of ",
                                                     leaf.file, " with the CA in ", tls_dir,
                                                     ": ", issued.status().message()));
    }
    if (absl::Status s = WritePair(tls_dir, leaf.file, *issued); !s.ok()) return s;
  }
  return absl::OkStatus();
}

TransportOptions LocalTransport(const std::string& tls_dir, const std::string& identity) {
  TransportOptions options;
  options.ca_file = tls_dir + "/ca.crt";
  options.cert_file = absl::StrCat(tls_dir, "/", identity, ".crt");
  options.key_file = absl::StrCat(tls_dir, "/", identity, ".key");
  return options;
}

}  // namespace substrax::ctl
