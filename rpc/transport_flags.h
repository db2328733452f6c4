// The command-line flags of TransportOptions, one spelling for every binary: the coordinator,
// the worker daemon (and the runners it starts) and substraxctl.
//
//   --tls-ca FILE --tls-cert FILE --tls-key FILE   PEM files (rpc/transport.h)
//   --tls-reload-interval DURATION                 how often they are re-read (default 60s)
//   --tls-server-name NAME                         clients: the name in the server's certificate
//   --token-file FILE                              substraxctl: a bearer token instead of a cert
//   --insecure                                     plaintext, unauthenticated (tests only)
#ifndef SUBSTRAX_RPC_TRANSPORT_FLAGS_H_
#define SUBSTRAX_RPC_TRANSPORT_FLAGS_H_

#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "rpc/transport.h"

namespace substrax {

enum class TransportRole {
  kServer,  // the coordinator
  kDaemon,  // a worker daemon: a client with its own certificate
  kClient,  // substraxctl: a certificate or a token
};

struct TransportFlags {
  TransportOptions options;
  std::string reload_interval = "60s";
};

// Adds the flags of `role` to `app`, writing into `flags`.
void AddTransportFlags(CLI::App* app, TransportFlags* flags, TransportRole role);

// After parsing: converts --tls-reload-interval. Errors: INVALID_ARGUMENT naming the flag.
absl::Status FinishTransportFlags(TransportFlags* flags);

// The flags that hand `options` on to a child process (a daemon's runners): file paths only,
// never a secret.
std::vector<std::string> TransportArguments(const TransportOptions& options);

}  // namespace substrax

#endif  // SUBSTRAX_RPC_TRANSPORT_FLAGS_H_
