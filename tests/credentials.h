// Credentials for tests that start real processes: a CA, the coordinator's server certificate
// (127.0.0.1, localhost) and client certificates issued on demand, as PEM files under one
// directory; and the command-line flags that hand them to a binary.
#ifndef SUBSTRAX_TESTS_CREDENTIALS_H_
#define SUBSTRAX_TESTS_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "rpc/pki.h"
#include "rpc/transport.h"

namespace substrax::testing {

class TestPki {
 public:
  // Creates the CA and the coordinator's certificate in `dir` (created); aborts the test
  // binary when OpenSSL fails (nothing could run without them).
  explicit TestPki(std::string dir, const std::string& ca_name = "substrax-test-ca");

  // --tls-ca/--tls-cert/--tls-key of the coordinator.
  std::vector<std::string> CoordinatorFlags() const;
  // A certificate for `name` with `role` ("admin", "submitter", "viewer", "worker"; "" for
  // none) valid from `not_before` to `not_after` (default: an hour ago to a day from now), and
  // its transport options. Issuing the same name twice overwrites the files.
  TransportOptions Issue(const std::string& name, const std::string& role,
                         absl::Time not_before = absl::InfinitePast(),
                         absl::Time not_after = absl::InfinitePast());
  // The flags of Issue's options (for a daemon or substraxctl).
  static std::vector<std::string> Flags(const TransportOptions& options);

  const std::string& dir() const { return dir_; }
  const std::string& ca_file() const { return ca_file_; }

 private:
  std::string dir_;
  std::string ca_file_;
  pki::KeyAndCert ca_;
};

}  // namespace substrax::testing

#endif  // SUBSTRAX_TESTS_CREDENTIALS_H_
