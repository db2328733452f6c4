#include "tests/credentials.h"

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/transport_flags.h"

namespace substrax::testing {
namespace {

template <typename T>
T OrDie(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) {
    std::cerr << "TestPki: " << what << ": " << value.status() << "\n";
    std::abort();
  }
  return *std::move(value);
}

void WriteOrDie(const std::string& path, const std::string& text, bool secret) {
  absl::Status s = secret ? pki::WritePrivateFile(path, text) : pki::WritePublicFile(path, text);
  if (!s.ok()) {
    std::cerr << "TestPki: " << s << "\n";
    std::abort();
  }
}

}  // namespace

TestPki::TestPki(std::string dir, const std::string& ca_name) : dir_(std::move(dir)) {
  std::filesystem::create_directories(dir_);
  const absl::Time now = absl::Now();
  ca_ = OrDie(pki::CreateCertificateAuthority(ca_name, now - absl::Hours(1), now + absl::Hours(24 * 365)),
              "the CA");
  ca_file_ = dir_ + "/ca.crt";
  WriteOrDie(ca_file_, ca_.cert_pem, false);
  const pki::KeyAndCert pair = OrDie(
      pki::IssueCertificate(ca_, pki::RequestFor(pki::kCoordinatorCommonName, "server",
                                                 {"localhost"}, {"127.0.0.1"},
                                                 now - absl::Hours(1), now + absl::Hours(24))),
      "the server certificate");
  WriteOrDie(dir_ + "/coordinator.crt", pair.cert_pem, false);
  WriteOrDie(dir_ + "/coordinator.key", pair.key_pem, true);
}

std::vector<std::string> TestPki::CoordinatorFlags() const {
  return {"--tls-ca=" + ca_file_, "--tls-cert=" + dir_ + "/coordinator.crt",
          "--tls-key=" + dir_ + "/coordinator.key"};
}

TransportOptions TestPki::Issue(const std::string& name, const std::string& role,
                                absl::Time not_before, absl::Time not_after) {
  const absl::Time now = absl::Now();
  const pki::KeyAndCert pair = OrDie(
      pki::IssueCertificate(
          ca_, pki::RequestFor(
                   name, role, {}, {},
                   not_before == absl::InfinitePast() ? now - absl::Hours(1) : not_before,
                   not_after == absl::InfinitePast() ? now + absl::Hours(24) : not_after)),
      "a client certificate");
  TransportOptions options;
  options.ca_file = ca_file_;
  options.cert_file = absl::StrCat(dir_, "/", name, ".crt");
  options.key_file = absl::StrCat(dir_, "/", name, ".key");
  WriteOrDie(options.cert_file, pair.cert_pem, false);
  WriteOrDie(options.key_file, pair.key_pem, true);
  return options;
}

std::vector<std::string> TestPki::Flags(const TransportOptions& options) {
  std::vector<std::string> flags = TransportArguments(options);
  if (!options.token_file.empty()) flags.push_back("--token-file=" + options.token_file);
  return flags;
}

}  // namespace substrax::testing
