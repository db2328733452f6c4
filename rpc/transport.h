// How a gRPC connection is secured: mutual TLS from PEM files (the default everywhere), or
// plaintext behind an explicit --insecure (tests only; a warning is logged at start).
//
// Certificates and keys are files, re-read every `reload_interval` by gRPC's file watcher, so a
// rotated certificate (cert-manager renewing a Secret, `substraxctl certs issue` over the old
// files) is used by new connections without a restart. Servers request a client certificate
// and verify it against `ca_file` when one is given; a client without one may authenticate with
// a bearer token instead (the coordinator decides, coordinator/auth.h).
//
// Thread-safe: plain functions of their arguments.
#ifndef SUBSTRAX_RPC_TRANSPORT_H_
#define SUBSTRAX_RPC_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace substrax {

struct TransportOptions {
  // Plaintext and unauthenticated (tests only): the other fields are ignored.
  bool insecure = false;
  // PEM files. Server: `ca_file` verifies client certificates, `cert_file`/`key_file` are the
  // server's own. Client: `ca_file` verifies the server; `cert_file`/`key_file` are the client's
  // identity (optional for a client that authenticates with a token).
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
  // Client: a file holding a bearer token, sent as "authorization: Bearer <token>"; empty: none.
  std::string token_file;
  // Client: a bearer token itself (a job's attempt token, from its launch file), sent the same
  // way; used instead of token_file when set.
  std::string token;
  // Client: the name the server's certificate must carry (a DNS SAN); empty: the host of the
  // target address (an IP address must then be an IP SAN).
  std::string server_name;
  // How often certificate files are looked at again.
  absl::Duration reload_interval = absl::Seconds(60);
};

// Plaintext options (tests).
inline TransportOptions InsecureTransport() {
  TransportOptions options;
  options.insecure = true;
  return options;
}

// Checks the options before anything is served or dialled: every named file exists and is
// readable, PEM files hold what their flag says, a certificate comes with its key, and a server
// has a certificate, a key and a CA. Errors: INVALID_ARGUMENT naming the flag (`flag_prefix`,
// e.g. "--tls-") and file, and saying how to get credentials.
absl::Status ValidateTransport(const TransportOptions& options, bool server,
                               const std::string& flag_prefix = "--tls-");

// Server credentials: TLS requesting (not requiring) a client certificate and verifying any
// that is presented against the CA; or insecure ones.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TransportOptions& options);

// A channel to `target` with the options' credentials (and bearer token) and `args` (plus the
// server name override). Errors: those of ValidateTransport; INVALID_ARGUMENT for an empty
// token file.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& target,
                                                           const TransportOptions& options,
                                                           grpc::ChannelArguments args = {});

// The warning servers and daemons log when started with --insecure.
std::string InsecureWarning(const std::string& program);

}  // namespace substrax

#endif  // SUBSTRAX_RPC_TRANSPORT_H_
