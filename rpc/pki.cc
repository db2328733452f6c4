#include "rpc/pki.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/obj_mac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <utility>

#include "base/files.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace substrax::pki {
namespace {

// OpenSSL objects own what they point to; each gets its free function as deleter.
template <typename T, void (*Free)(T*)>
struct OpenSslDeleter {
  void operator()(T* p) const { Free(p); }
};
template <typename T, void (*Free)(T*)>
using OpenSslPtr = std::unique_ptr<T, OpenSslDeleter<T, Free>>;

using BioPtr = OpenSslPtr<BIO, BIO_free_all>;
using BignumPtr = OpenSslPtr<BIGNUM, BN_free>;
using ExtensionPtr = OpenSslPtr<X509_EXTENSION, X509_EXTENSION_free>;
using KeyCtxPtr = OpenSslPtr<EVP_PKEY_CTX, EVP_PKEY_CTX_free>;
using KeyPtr = OpenSslPtr<EVP_PKEY, EVP_PKEY_free>;
using X509Ptr = OpenSslPtr<X509, X509_free>;

void FreeGeneralNames(GENERAL_NAMES* names) { GENERAL_NAMES_free(names); }
using GeneralNamesPtr = OpenSslPtr<GENERAL_NAMES, FreeGeneralNames>;

// X.509's upper bound for a CN or an O (RFC 5280, ub-common-name, ub-organization-name).
constexpr size_t kMaxNameLength = 64;

// The OpenSSL error queue as text, emptied. A failed OpenSSL call leaves its reasons there.
std::string DrainErrors() {
  std::vector<std::string> reasons;
  while (unsigned long code = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(code, buf, sizeof(buf));
    reasons.emplace_back(buf);
  }
  return reasons.empty() ? "no OpenSSL error recorded" : absl::StrJoin(reasons, "; ");
}

absl::Status OpenSslError(absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, " failed: ", DrainErrors()));
}

// For the few calls that cannot fail in a working OpenSSL (digests, the CSPRNG) behind functions
// that return no status: no digest or secret is better than a wrong one.
[[noreturn]] void DieOnOpenSslError(const char* what) {
  std::fprintf(stderr, "substrax: %s failed: %s\n", what, DrainErrors().c_str());
  std::abort();
}

absl::StatusOr<KeyPtr> NewP256Key() {
  KeyCtxPtr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_EC, nullptr));
  if (ctx == nullptr || EVP_PKEY_keygen_init(ctx.get()) <= 0 ||
      EVP_PKEY_CTX_set_ec_paramgen_curve_nid(ctx.get(), NID_X9_62_prime256v1) <= 0) {
    return OpenSslError("setting up P-256 key generation");
  }
  EVP_PKEY* key = nullptr;
  if (EVP_PKEY_keygen(ctx.get(), &key) <= 0) return OpenSslError("generating a P-256 key");
  return KeyPtr(key);
}

absl::StatusOr<std::string> BioContents(BIO* bio) {
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  if (size < 0) return OpenSslError("reading a memory BIO");
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<KeyAndCert> ToPem(EVP_PKEY* key, X509* cert) {
  BioPtr key_bio(BIO_new(BIO_s_mem()));
  BioPtr cert_bio(BIO_new(BIO_s_mem()));
  if (key_bio == nullptr || cert_bio == nullptr ||
      PEM_write_bio_PrivateKey(key_bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1 ||
      PEM_write_bio_X509(cert_bio.get(), cert) != 1) {
    return OpenSslError("writing PEM");
  }
  KeyAndCert out;
  absl::StatusOr<std::string> key_pem = BioContents(key_bio.get());
  if (!key_pem.ok()) return key_pem.status();
  absl::StatusOr<std::string> cert_pem = BioContents(cert_bio.get());
  if (!cert_pem.ok()) return cert_pem.status();
  out.key_pem = *std::move(key_pem);
  out.cert_pem = *std::move(cert_pem);
  return out;
}

absl::Status CheckValidity(absl::Time not_before, absl::Time not_after) {
  for (absl::Time t : {not_before, not_after}) {
    if (t == absl::InfinitePast() || t == absl::InfiniteFuture()) {
      return absl::InvalidArgumentError(
          "a certificate's not_before and not_after must both be set to finite times");
    }
  }
  if (not_after <= not_before) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a certificate's validity must end after it begins (not_before ",
        absl::FormatTime(not_before, absl::UTCTimeZone()), ", not_after ",
        absl::FormatTime(not_after, absl::UTCTimeZone()), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckName(absl::string_view field, absl::string_view value) {
  if (value.empty() || value.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat("a certificate's ", field, " must have 1 to ",
                                                   kMaxNameLength, " characters, not ",
                                                   value.size(), " (\"", value, "\")"));
  }
  return absl::OkStatus();
}

// A DNS name for a subjectAltName: labels of letters, digits and '-', joined by '.', the first
// label may be '*'. Rejecting anything else keeps odd bytes out of certificates.
absl::Status CheckDnsName(absl::string_view name) {
  std::vector<absl::string_view> labels = absl::StrSplit(name, '.');
  bool ok = !name.empty() && name.size() <= 253;
  for (size_t i = 0; ok && i < labels.size(); ++i) {
    const absl::string_view label = labels[i];
    if (label == "*" && i == 0 && labels.size() > 1) continue;
    ok = !label.empty() && label.size() <= 63 && label.front() != '-' && label.back() != '-';
    for (char c : label) ok = ok && (absl::ascii_isalnum(c) || c == '-');
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", name, "\" is not a DNS name for a certificate: use labels of letters, digits and "
        "'-' joined by '.' (optionally starting with \"*.\")"));
  }
  return absl::OkStatus();
}

absl::Status CheckIpAddress(const std::string& ip) {
  ASN1_OCTET_STRING* address = a2i_IPADDRESS(ip.c_str());
  if (address != nullptr) {
    ASN1_OCTET_STRING_free(address);
    return absl::OkStatus();
  }
  ERR_clear_error();
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", ip, "\" is not an IP address for a certificate: give IPv4 (10.0.0.5) or IPv6 "
      "(fd00::5) in text form, without a port or prefix length"));
}

absl::Status SetValidity(X509* cert, absl::Time not_before, absl::Time not_after) {
  if (ASN1_TIME_set(X509_getm_notBefore(cert), absl::ToTimeT(not_before)) == nullptr ||
      ASN1_TIME_set(X509_getm_notAfter(cert), absl::ToTimeT(not_after)) == nullptr) {
    return OpenSslError("setting the certificate's validity");
  }
  return absl::OkStatus();
}

absl::Status AddNameEntry(X509_NAME* name, const char* field, const std::string& value) {
  if (X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(value.data()),
                                 static_cast<int>(value.size()), -1, 0) != 1) {
    return OpenSslError(absl::StrCat("adding ", field, "=", value, " to a certificate name"));
  }
  return absl::OkStatus();
}

// Adds an extension written in OpenSSL's configuration syntax (fixed strings only: no user input
// goes through this parser). `issuer` is the signing certificate (the certificate itself for a
// self-signed one), for authorityKeyIdentifier.
absl::Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  ExtensionPtr ext(X509V3_EXT_nconf_nid(nullptr, &ctx, nid, value));
  if (ext == nullptr || X509_add_ext(cert, ext.get(), -1) != 1) {
    return OpenSslError(absl::StrCat("adding the extension ", OBJ_nid2sn(nid), " = ", value));
  }
  return absl::OkStatus();
}

absl::Status AddSubjectAltNames(X509* cert, const std::vector<std::string>& dns_names,
                                const std::vector<std::string>& ip_addresses) {
  if (dns_names.empty() && ip_addresses.empty()) return absl::OkStatus();
  GeneralNamesPtr names(GENERAL_NAMES_new());
  if (names == nullptr) return OpenSslError("allocating subjectAltNames");
  for (const std::string& dns : dns_names) {
    ASN1_IA5STRING* text = ASN1_IA5STRING_new();
    GENERAL_NAME* name = GENERAL_NAME_new();
    if (text == nullptr || name == nullptr ||
        ASN1_STRING_set(text, dns.data(), static_cast<int>(dns.size())) != 1) {
      ASN1_IA5STRING_free(text);
      GENERAL_NAME_free(name);
      return OpenSslError("building a DNS subjectAltName");
    }
    GENERAL_NAME_set0_value(name, GEN_DNS, text);
    if (sk_GENERAL_NAME_push(names.get(), name) == 0) {
      GENERAL_NAME_free(name);
      return OpenSslError("adding a DNS subjectAltName");
    }
  }
  for (const std::string& ip : ip_addresses) {
    ASN1_OCTET_STRING* address = a2i_IPADDRESS(ip.c_str());
    if (address == nullptr) return CheckIpAddress(ip);
    GENERAL_NAME* name = GENERAL_NAME_new();
    if (name == nullptr) {
      ASN1_OCTET_STRING_free(address);
      return OpenSslError("building an IP subjectAltName");
    }
    GENERAL_NAME_set0_value(name, GEN_IPADD, address);
    if (sk_GENERAL_NAME_push(names.get(), name) == 0) {
      GENERAL_NAME_free(name);
      return OpenSslError("adding an IP subjectAltName");
    }
  }
  if (X509_add1_ext_i2d(cert, NID_subject_alt_name, names.get(), 0, X509V3_ADD_DEFAULT) != 1) {
    return OpenSslError("adding subjectAltNames");
  }
  return absl::OkStatus();
}

// A random positive 128-bit serial (RFC 5280 wants positive and at most 20 octets; the CA/B
// Forum at least 64 random bits).
absl::Status SetRandomSerial(X509* cert) {
  unsigned char bytes[16];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return OpenSslError("drawing a serial number");
  bytes[0] &= 0x7f;  // DER INTEGERs are signed; keep the high bit clear so it stays 16 octets
  bytes[0] |= 0x01;  // ... and never zero
  BignumPtr serial(BN_bin2bn(bytes, sizeof(bytes), nullptr));
  if (serial == nullptr ||
      BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert)) == nullptr) {
    return OpenSslError("setting the serial number");
  }
  return absl::OkStatus();
}

// A certificate for `key` with `subject`'s validity and serial, not yet extended or signed.
absl::StatusOr<X509Ptr> NewCertificate(EVP_PKEY* key, absl::Time not_before,
                                       absl::Time not_after) {
  X509Ptr cert(X509_new());
  if (cert == nullptr || X509_set_version(cert.get(), 2) != 1 ||  // 2 means X.509 v3
      X509_set_pubkey(cert.get(), key) != 1) {
    return OpenSslError("creating a certificate");
  }
  if (absl::Status s = SetRandomSerial(cert.get()); !s.ok()) return s;
  if (absl::Status s = SetValidity(cert.get(), not_before, not_after); !s.ok()) return s;
  return cert;
}

absl::StatusOr<X509Ptr> ReadCertificate(absl::string_view pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  X509Ptr cert(bio == nullptr ? nullptr
                              : PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no PEM certificate (\"-----BEGIN CERTIFICATE-----\") could be read: ", DrainErrors()));
  }
  return cert;
}

absl::StatusOr<KeyPtr> ReadPrivateKey(absl::string_view pem) {
  BioPtr bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  KeyPtr key(bio == nullptr ? nullptr
                            : PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no unencrypted PEM private key could be read: ", DrainErrors()));
  }
  return key;
}

absl::Status Sign(X509* cert, EVP_PKEY* key) {
  if (X509_sign(cert, key, EVP_sha256()) <= 0) return OpenSslError("signing the certificate");
  return absl::OkStatus();
}

std::string NameEntry(const X509_NAME* name, int nid, int* last) {
  *last = X509_NAME_get_index_by_NID(name, nid, *last);
  if (*last < 0) return "";
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, *last));
  unsigned char* utf8 = nullptr;
  const int size = ASN1_STRING_to_UTF8(&utf8, data);
  if (size < 0) return "";
  std::string out(reinterpret_cast<char*>(utf8), static_cast<size_t>(size));
  OPENSSL_free(utf8);
  return out;
}

std::string FirstNameEntry(const X509_NAME* name, int nid) {
  int last = -1;
  return NameEntry(name, nid, &last);
}

absl::StatusOr<absl::Time> ToTime(const ASN1_TIME* time) {
  struct tm tm = {};
  if (time == nullptr || ASN1_TIME_to_tm(time, &tm) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate's validity does not parse: ", DrainErrors()));
  }
  return absl::FromTimeT(timegm(&tm));
}

std::string IpToText(const ASN1_OCTET_STRING* ip) {
  char text[INET6_ADDRSTRLEN] = {};
  const int family = ip->length == 4 ? AF_INET : ip->length == 16 ? AF_INET6 : 0;
  if (family == 0 || inet_ntop(family, ip->data, text, sizeof(text)) == nullptr) {
    return absl::StrCat("<", ip->length, "-byte address>");
  }
  return text;
}

std::string Hex(const unsigned char* data, size_t size) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(data), size));
}

// base/files.h's atomic write (the file gets `mode` before a byte of a key is written), with
// what to check when it fails.
absl::Status WriteFileChecked(const std::string& path, absl::string_view content, mode_t mode) {
  const absl::Status written = WriteFileAtomically(path, content, mode);
  if (written.ok()) return written;
  return absl::FailedPreconditionError(absl::StrCat(
      written.message(), "; check that its directory exists and is writable"));
}

}  // namespace

absl::StatusOr<KeyAndCert> CreateCertificateAuthority(const std::string& common_name,
                                                      absl::Time not_before,
                                                      absl::Time not_after) {
  if (absl::Status s = CheckName("CN", common_name); !s.ok()) return s;
  if (absl::Status s = CheckValidity(not_before, not_after); !s.ok()) return s;
  ERR_clear_error();
  absl::StatusOr<KeyPtr> key = NewP256Key();
  if (!key.ok()) return key.status();
  absl::StatusOr<X509Ptr> cert = NewCertificate(key->get(), not_before, not_after);
  if (!cert.ok()) return cert.status();
  X509* x = cert->get();
  if (absl::Status s = AddNameEntry(X509_get_subject_name(x), "CN", common_name); !s.ok()) {
    return s;
  }
  if (X509_set_issuer_name(x, X509_get_subject_name(x)) != 1) {
    return OpenSslError("setting the CA's issuer name");
  }
  for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE"},
                            std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                            std::pair{NID_subject_key_identifier, "hash"}}) {
    if (absl::Status s = AddExtension(x, x, nid, value); !s.ok()) return s;
  }
  if (absl::Status s = Sign(x, key->get()); !s.ok()) return s;
  return ToPem(key->get(), x);
}

absl::Status ValidateCertificateRequest(const CertificateRequest& request) {
  if (absl::Status s = CheckName("CN", request.common_name); !s.ok()) return s;
  for (const std::string& o : request.organizations) {
    if (absl::Status s = CheckName("O", o); !s.ok()) return s;
  }
  for (const std::string& dns : request.dns_names) {
    if (absl::Status s = CheckDnsName(dns); !s.ok()) return s;
  }
  for (const std::string& ip : request.ip_addresses) {
    if (absl::Status s = CheckIpAddress(ip); !s.ok()) return s;
  }
  if (!request.server_auth && !request.client_auth) {
    return absl::InvalidArgumentError(
        "a certificate request needs server_auth, client_auth or both");
  }
  return CheckValidity(request.not_before, request.not_after);
}

CertificateRequest RequestFor(const std::string& name, const std::string& role,
                              std::vector<std::string> dns_names,
                              std::vector<std::string> ip_addresses, absl::Time not_before,
                              absl::Time not_after) {
  CertificateRequest request;
  request.common_name = name;
  const bool server = role == "server";
  if (!server && !role.empty()) request.organizations = {absl::StrCat(kRolePrefix, role)};
  request.dns_names = std::move(dns_names);
  request.ip_addresses = std::move(ip_addresses);
  request.server_auth = server;
  request.client_auth = !server;
  request.not_before = not_before;
  request.not_after = not_after;
  return request;
}

absl::StatusOr<KeyAndCert> IssueCertificate(const KeyAndCert& ca,
                                            const CertificateRequest& request) {
  if (absl::Status s = ValidateCertificateRequest(request); !s.ok()) return s;
  ERR_clear_error();

  absl::StatusOr<X509Ptr> ca_cert = ReadCertificate(ca.cert_pem);
  if (!ca_cert.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CA certificate: ", ca_cert.status().message()));
  }
  absl::StatusOr<KeyPtr> ca_key = ReadPrivateKey(ca.key_pem);
  if (!ca_key.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("the CA key: ", ca_key.status().message()));
  }
  if (X509_check_private_key(ca_cert->get(), ca_key->get()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "the CA key is not the key of the CA certificate: the two files come from different "
        "CAs; use the ca.key written with this ca.crt");
  }
  if (X509_check_ca(ca_cert->get()) == 0) {
    return absl::InvalidArgumentError(
        "the CA certificate is not a CA (no basicConstraints CA:TRUE): give the certificate "
        "that `substraxctl certs init` wrote");
  }
  absl::StatusOr<absl::Time> ca_not_after = ToTime(X509_get0_notAfter(ca_cert->get()));
  if (!ca_not_after.ok()) return ca_not_after.status();
  if (request.not_after > *ca_not_after) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the certificate would expire at ",
        absl::FormatTime(request.not_after, absl::UTCTimeZone()), ", after its CA (",
        absl::FormatTime(*ca_not_after, absl::UTCTimeZone()),
        "), and would stop verifying with it: issue it for fewer days or renew the CA"));
  }

  absl::StatusOr<KeyPtr> key = NewP256Key();
  if (!key.ok()) return key.status();
  absl::StatusOr<X509Ptr> cert = NewCertificate(key->get(), request.not_before, request.not_after);
  if (!cert.ok()) return cert.status();
  X509* x = cert->get();
  X509_NAME* subject = X509_get_subject_name(x);
  for (const std::string& o : request.organizations) {
    if (absl::Status s = AddNameEntry(subject, "O", o); !s.ok()) return s;
  }
  if (absl::Status s = AddNameEntry(subject, "CN", request.common_name); !s.ok()) return s;
  if (X509_set_issuer_name(x, X509_get_subject_name(ca_cert->get())) != 1) {
    return OpenSslError("setting the issuer name");
  }
  std::vector<std::string> usages;
  if (request.server_auth) usages.push_back("serverAuth");
  if (request.client_auth) usages.push_back("clientAuth");
  const std::string eku = absl::StrJoin(usages, ",");
  for (auto [nid, value] :
       {std::pair{NID_basic_constraints, "critical,CA:FALSE"},
        std::pair{NID_key_usage, "critical,digitalSignature,keyEncipherment"},
        std::pair{NID_ext_key_usage, eku.c_str()},
        std::pair{NID_subject_key_identifier, "hash"},
        std::pair{NID_authority_key_identifier, "keyid:always"}}) {
    if (absl::Status s = AddExtension(x, ca_cert->get(), nid, value); !s.ok()) return s;
  }
  if (absl::Status s = AddSubjectAltNames(x, request.dns_names, request.ip_addresses); !s.ok()) {
    return s;
  }
  if (absl::Status s = Sign(x, ca_key->get()); !s.ok()) return s;
  return ToPem(key->get(), x);
}

absl::StatusOr<CertificateInfo> ParseCertificate(absl::string_view cert_pem) {
  ERR_clear_error();
  absl::StatusOr<X509Ptr> cert = ReadCertificate(cert_pem);
  if (!cert.ok()) return cert.status();
  X509* x = cert->get();
  CertificateInfo info;
  const X509_NAME* subject = X509_get_subject_name(x);
  info.common_name = FirstNameEntry(subject, NID_commonName);
  for (int last = -1;;) {
    std::string o = NameEntry(subject, NID_organizationName, &last);
    if (last < 0) break;
    info.organizations.push_back(std::move(o));
  }
  info.issuer_common_name = FirstNameEntry(X509_get_issuer_name(x), NID_commonName);

  GeneralNamesPtr names(static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(x, NID_subject_alt_name, nullptr, nullptr)));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names.get()); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names.get(), i);
    if (name->type == GEN_DNS) {
      const ASN1_IA5STRING* dns = name->d.dNSName;
      info.dns_names.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(dns)),
                                  static_cast<size_t>(ASN1_STRING_length(dns)));
    } else if (name->type == GEN_IPADD) {
      info.ip_addresses.push_back(IpToText(name->d.iPAddress));
    }
  }

  absl::StatusOr<absl::Time> not_before = ToTime(X509_get0_notBefore(x));
  if (!not_before.ok()) return not_before.status();
  absl::StatusOr<absl::Time> not_after = ToTime(X509_get0_notAfter(x));
  if (!not_after.ok()) return not_after.status();
  info.not_before = *not_before;
  info.not_after = *not_after;

  BignumPtr serial(ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), nullptr));
  if (serial == nullptr) return OpenSslError("reading the serial number");
  char* serial_text = BN_bn2hex(serial.get());
  if (serial_text == nullptr) return OpenSslError("formatting the serial number");
  info.serial_hex = absl::AsciiStrToLower(serial_text);
  OPENSSL_free(serial_text);

  // X509_get_extension_flags computes (and caches) the extensions' flags for these queries.
  const uint32_t flags = X509_get_extension_flags(x);
  info.is_ca = (flags & EXFLAG_CA) != 0;
  const uint32_t eku = X509_get_extended_key_usage(x);
  info.server_auth = (flags & EXFLAG_XKUSAGE) != 0 && (eku & XKU_SSL_SERVER) != 0;
  info.client_auth = (flags & EXFLAG_XKUSAGE) != 0 && (eku & XKU_SSL_CLIENT) != 0;
  ERR_clear_error();
  return info;
}

std::vector<std::string> RolesOf(const CertificateInfo& info) {
  std::vector<std::string> roles;
  for (const std::string& o : info.organizations) {
    if (absl::StartsWith(o, kRolePrefix)) roles.push_back(o.substr(sizeof(kRolePrefix) - 1));
  }
  return roles;
}

std::string Sha256Hex(absl::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), digest, &size, EVP_sha256(), nullptr) != 1) {
    DieOnOpenSslError("SHA-256");
  }
  return Hex(digest, size);
}

std::string HmacSha256Hex(absl::string_view key, absl::string_view data) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  // HMAC() reads a null key as "reuse the previous key"; an empty key must still be a key.
  static const char kEmpty[1] = {};
  if (HMAC(EVP_sha256(), key.empty() ? kEmpty : key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), mac,
           &size) == nullptr) {
    DieOnOpenSslError("HMAC-SHA256");
  }
  return Hex(mac, size);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RandomToken(int bytes) {
  std::string raw(static_cast<size_t>(bytes > 0 ? bytes : 1), '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(raw.size())) !=
      1) {
    DieOnOpenSslError("the random number generator (RAND_bytes)");
  }
  return absl::WebSafeBase64Escape(raw);
}

absl::Status WritePrivateFile(const std::string& path, absl::string_view content) {
  return WriteFileChecked(path, content, 0600);
}

absl::Status WritePublicFile(const std::string& path, absl::string_view content) {
  return WriteFileChecked(path, content, 0644);
}

}  // namespace substrax::pki
