// The public-key infrastructure of substrax's mutual TLS: a certificate authority, the
// certificates it issues to users, workers and the coordinator, their inspection, and the digests
// and random secrets behind bearer tokens. Everything cryptographic is OpenSSL's (EVP, X509, HMAC,
// RAND); nothing here is hand-written crypto.
//
// Identities (docs/cli.md, "substraxctl certs"): a certificate's subject CN is the identity (a user
// name, a worker id, or `substrax-coordinator` for the coordinator's server certificate); its
// subject O entries carry roles as `substrax:<role>` (admin, submitter, viewer, worker). The
// coordinator's certificate names its DNS names and IP addresses as subjectAltNames.
//
// Keys are ECDSA P-256, written as unencrypted PKCS#8 PEM ("BEGIN PRIVATE KEY"); certificates are
// X.509 v3 signed with ECDSA-SHA256. A CA certificate has basicConstraints CA:TRUE (critical),
// keyUsage keyCertSign+cRLSign (critical) and a subjectKeyIdentifier; a leaf has CA:FALSE,
// keyUsage digitalSignature+keyEncipherment (critical), the extendedKeyUsage requested, both key
// identifiers and a random 128-bit serial. gRPC's TLS (grpc 1.51 over OpenSSL) accepts them
// (rpc/pki_test.cc checks it against a real server).
//
// Thread-safety: every function is thread-safe (no shared state; OpenSSL 3 initialises itself).
#ifndef SUBSTRAX_RPC_PKI_H_
#define SUBSTRAX_RPC_PKI_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace substrax::pki {

// The subject O prefix of a role: "substrax:admin" and so on.
inline constexpr char kRolePrefix[] = "substrax:";
// The CN of the coordinator's server certificate.
inline constexpr char kCoordinatorCommonName[] = "substrax-coordinator";

// A private key and its certificate, both PEM.
struct KeyAndCert {
  std::string key_pem;
  std::string cert_pem;
};

// What IssueCertificate puts in a leaf certificate.
struct CertificateRequest {
  // Subject CN: the identity. 1 to 64 characters (X.509's upper bound).
  std::string common_name;
  // Subject O entries, in order, e.g. {"substrax:admin"}. Each 1 to 64 characters.
  std::vector<std::string> organizations;
  // subjectAltName DNS names ("localhost", "coordinator.example.com", "*.example.com").
  std::vector<std::string> dns_names;
  // subjectAltName IP addresses, IPv4 or IPv6 in text form ("127.0.0.1", "::1").
  std::vector<std::string> ip_addresses;
  // extendedKeyUsage serverAuth: the certificate may serve TLS.
  bool server_auth = false;
  // extendedKeyUsage clientAuth: the certificate may authenticate a TLS client.
  bool client_auth = true;
  // Validity, explicit so that tests can make certificates that are expired or not yet valid.
  // Whole seconds (sub-second parts are dropped).
  absl::Time not_before = absl::InfinitePast();
  absl::Time not_after = absl::InfinitePast();
};

// The request of substrax's certificate for `name` with `role`: "server" is a server's
// (serverAuth, the SANs given); any other role a client's (clientAuth, subject O
// substrax:<role>; no O when `role` is empty). Validity from `not_before` to `not_after`.
CertificateRequest RequestFor(const std::string& name, const std::string& role,
                              std::vector<std::string> dns_names,
                              std::vector<std::string> ip_addresses, absl::Time not_before,
                              absl::Time not_after);

// A new self-signed CA: a fresh P-256 key and a certificate with subject and issuer CN
// `common_name`, valid from `not_before` to `not_after`.
// Errors: INVALID_ARGUMENT for an empty or over-64-character name, or a validity that is
// infinite or does not end after it begins; INTERNAL when OpenSSL fails (its error queue is in
// the message).
absl::StatusOr<KeyAndCert> CreateCertificateAuthority(const std::string& common_name,
                                                      absl::Time not_before,
                                                      absl::Time not_after);

// Whether IssueCertificate would accept `request` (it checks the same first), so that a caller
// can tell a bad request from a bad CA.
// Errors: INVALID_ARGUMENT naming the field: an empty or over-64-character CN or O; a DNS name
// other than labels of letters, digits and '-' joined by '.' (the first label may be '*'); an IP
// address that does not parse; neither server_auth nor client_auth; a validity that is not set or
// does not end after it begins.
absl::Status ValidateCertificateRequest(const CertificateRequest& request);

// A new leaf certificate and a fresh P-256 key for `request`, signed by `ca`.
// Errors: INVALID_ARGUMENT for a bad request (as ValidateCertificateRequest), or a `ca` whose key
// or certificate does not parse, whose key is not the certificate's, or whose certificate is not
// a CA; FAILED_PRECONDITION when the certificate would outlive the CA
// (request.not_after after the CA's notAfter: renew the CA, or issue for fewer days); INTERNAL
// when OpenSSL fails.
absl::StatusOr<KeyAndCert> IssueCertificate(const KeyAndCert& ca,
                                            const CertificateRequest& request);

// What a certificate says, as ParseCertificate reads it.
struct CertificateInfo {
  std::string common_name;                 // subject CN ("" if none)
  std::vector<std::string> organizations;  // subject O entries, in order
  std::vector<std::string> dns_names;      // subjectAltName DNS entries
  std::vector<std::string> ip_addresses;   // subjectAltName IP entries, as text
  absl::Time not_before;
  absl::Time not_after;
  std::string serial_hex;          // lowercase hex, no leading zeros
  std::string issuer_common_name;  // issuer CN ("" if none)
  bool is_ca = false;              // basicConstraints CA:TRUE
  bool server_auth = false;        // extendedKeyUsage serverAuth
  bool client_auth = false;        // extendedKeyUsage clientAuth
};

// The first certificate of a PEM chain (a leaf file, or a leaf followed by intermediates).
// Errors: INVALID_ARGUMENT when there is no PEM certificate in `cert_pem` or it does not parse.
absl::StatusOr<CertificateInfo> ParseCertificate(absl::string_view cert_pem);

// The roles of a certificate: its O entries that start with kRolePrefix, without the prefix
// ({"substrax:admin", "acme"} -> {"admin"}).
std::vector<std::string> RolesOf(const CertificateInfo& info);

// SHA-256 of `data`, 64 lowercase hex digits. How the coordinator stores bearer tokens.
std::string Sha256Hex(absl::string_view data);
// HMAC-SHA256 of `data` under `key`, 64 lowercase hex digits.
std::string HmacSha256Hex(absl::string_view key, absl::string_view data);
// Whether a and b are equal, in time that depends only on their length (CRYPTO_memcmp), for
// comparing secrets and digests. False when the lengths differ.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);
// `bytes` random bytes from OpenSSL's CSPRNG (RAND_bytes), base64url without padding (URL-,
// header- and shell-safe: letters, digits, '-', '_'); 32 bytes give 43 characters. For bearer
// tokens and shared secrets. Aborts the process if the CSPRNG fails: a weak secret is worse than
// none. `bytes` must be 1 or more.
std::string RandomToken(int bytes = 32);

// Write `content` to `path` atomically: a temporary file in the same directory, created with the
// final mode (0600 private: keys, 0644 public: certificates) regardless of umask, fsync'd, then
// renamed over `path`, so a reader never sees a partial file and a key is never readable by
// others, not even for a moment. The directory must exist.
// Errors: FAILED_PRECONDITION naming the file and errno's text (no such directory, permission
// denied, disk full).
absl::Status WritePrivateFile(const std::string& path, absl::string_view content);
absl::Status WritePublicFile(const std::string& path, absl::string_view content);

}  // namespace substrax::pki

#endif  // SUBSTRAX_RPC_PKI_H_
