// substraxctl certs: the certificate authority, certificates and bearer tokens of substrax's
// mutual TLS (docs/cli.md, "substraxctl certs"), on local files only: no RPC. The cryptography is
// rpc/pki.h (OpenSSL).
//
// Each command writes data to ctx.out and messages to ctx.err and returns the exit code
// (client/args.h): 0 ok; 1 an error with a file (missing, unreadable, not a certificate, would be
// overwritten) or the CA (the certificate would outlive it); 2 usage (a bad name, role, --days,
// DNS name or IP address, or a server certificate without --dns/--ip). Every error message names
// the file or flag and what to do. Relative paths are relative to ctx.working_directory.
// Times are shown in ctx.zone; "now" is ctx.clock.
//
// Thread-compatible: commands write files and the context's streams.
#ifndef SUBSTRAX_CLIENT_CERTS_COMMAND_H_
#define SUBSTRAX_CLIENT_CERTS_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/commands.h"

namespace substrax::ctl {

// How long before "now" certificates begin, so that a peer whose clock is a little behind
// accepts a certificate issued a moment ago.
inline constexpr absl::Duration kCertificateBackdate = absl::Minutes(5);

// certs init.
struct CertsInitFlags {
  // --dir: where ca.crt (0644) and ca.key (0600) go; created (0700) if missing. Required.
  std::string dir;
  // --days: how long the CA is valid, 1 to 36500.
  int days = 3650;
  // --name: the CA's subject and issuer CN.
  std::string name = "substrax-ca";
  // --force: replace an existing ca.crt/ca.key (every certificate the old CA issued stops
  // verifying).
  bool force = false;
};
// Creates a CA: DIR/ca.key and DIR/ca.crt; prints what it wrote and when the CA expires.
// Exit 1 if either file exists (without --force) or cannot be written; 2 for a bad flag.
int CertsInitCommand(const CommandContext& ctx, const CertsInitFlags& flags);

// certs issue.
struct CertsIssueFlags {
  // --ca-dir: the directory of `certs init` (ca.crt, ca.key). Required.
  std::string ca_dir;
  // --out-dir: where NAME.crt (0644), NAME.key (0600) and ca.crt (0644) go; created (0700) if
  // missing. Required.
  std::string out_dir;
  // --name: the identity, the certificate's CN (CheckIdentityName). Required.
  std::string name;
  // --role: admin, submitter, viewer, worker (client certificates: clientAuth, O=substrax:ROLE)
  // or server (serverAuth, subjectAltNames from --dns and --ip, at least one). Required.
  std::string role;
  // --dns, --ip: the subjectAltNames of a server certificate.
  std::vector<std::string> dns;
  std::vector<std::string> ip;
  // --days: how long the certificate is valid, 1 to 36500, and not past the CA's expiry.
  int days = 365;
  // --force: replace an existing OUT/NAME.crt or OUT/NAME.key.
  bool force = false;
};
// Issues a certificate and key signed by the CA in ca_dir; prints the files it wrote and the
// certificate's expiry. Exit 1 when the CA cannot be read or is not a CA, when the certificate
// would outlive the CA, when NAME.crt/NAME.key exist (without --force) or a file cannot be
// written; 2 for a bad flag.
int CertsIssueCommand(const CommandContext& ctx, const CertsIssueFlags& flags);

// certs token --name NAME --role admin|submitter|viewer: prints a new random bearer token alone on
// a line of ctx.out (shown only this once), and on ctx.err the YAML entry for the coordinator's
// --auth-config file, which holds only the token's SHA-256. Exit 2 for a bad name or role.
int CertsTokenCommand(const CommandContext& ctx, const std::string& name,
                      const std::string& role);

// certs show FILE: the first certificate of FILE: subject CN, roles, usages, subjectAltNames,
// issuer, validity, serial, and whether it is valid now, expired or not yet valid. Exit 0 also for
// an expired certificate; 1 when FILE cannot be read or holds no certificate.
int CertsShowCommand(const CommandContext& ctx, const std::string& path);

// An identity (a certificate's CN, a token's name): 1 to 63 characters of lowercase letters,
// digits, '-' and '.', starting and ending with a letter or digit (a DNS-1123 label, dots
// allowed). Errors: INVALID_ARGUMENT saying what is wrong.
absl::Status CheckIdentityName(absl::string_view name);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_CERTS_COMMAND_H_
