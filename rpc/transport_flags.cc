#include "rpc/transport_flags.h"

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace substrax {

void AddTransportFlags(CLI::App* app, TransportFlags* flags, TransportRole role) {
  TransportOptions& o = flags->options;
  const bool server = role == TransportRole::kServer;
  app->add_option("--tls-ca", o.ca_file,
                  server ? "PEM CA certificate that client certificates must be signed by"
                         : "PEM CA certificate that the coordinator's certificate must be "
                           "signed by");
  app->add_option("--tls-cert", o.cert_file,
                  server ? "PEM certificate of this server"
                         : "PEM client certificate (its CN is the identity, its O the role)");
  app->add_option("--tls-key", o.key_file, "PEM private key of --tls-cert");
  app->add_option("--tls-reload-interval", flags->reload_interval,
                  "How often the certificate files are re-read (rotation without restart)")
      ->capture_default_str();
  if (!server) {
    app->add_option("--tls-server-name", o.server_name,
                    "Name the coordinator's certificate must carry (default: the host of the "
                    "coordinator address)");
  }
  if (role == TransportRole::kClient) {
    app->add_option("--token-file", o.token_file,
                    "File with a bearer token (instead of --tls-cert/--tls-key)");
  }
  app->add_flag("--insecure", o.insecure,
                "Plaintext gRPC without authentication: for tests only");
}

absl::Status FinishTransportFlags(TransportFlags* flags) {
  absl::Duration d;
  if (!absl::ParseDuration(flags->reload_interval, &d) || d < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-reload-interval: '", flags->reload_interval,
                     "' is not a duration of at least 1s such as 60s"));
  }
  flags->options.reload_interval = d;
  return absl::OkStatus();
}

std::vector<std::string> TransportArguments(const TransportOptions& options) {
  if (options.insecure) return {"--insecure"};
  std::vector<std::string> args = {
      absl::StrCat("--tls-ca=", options.ca_file),
      absl::StrCat("--tls-reload-interval=", absl::FormatDuration(options.reload_interval))};
  if (!options.cert_file.empty()) {
    args.push_back(absl::StrCat("--tls-cert=", options.cert_file));
    args.push_back(absl::StrCat("--tls-key=", options.key_file));
  }
  if (!options.server_name.empty()) {
    args.push_back(absl::StrCat("--tls-server-name=", options.server_name));
  }
  return args;
}

}  // namespace substrax
