// The credentials of a `substraxctl local up` cluster, in <state dir>/tls: a CA of its own
// (kept over restarts of the cluster), and certificates issued at each start for the
// coordinator (127.0.0.1, localhost), each worker (CN = its worker id, O = substrax:worker)
// and an admin user (CN = admin, O = substrax:admin) that substraxctl uses by default.
// Keys are written 0600.
#ifndef SUBSTRAX_CLIENT_LOCAL_CREDENTIALS_H_
#define SUBSTRAX_CLIENT_LOCAL_CREDENTIALS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "rpc/transport.h"

namespace substrax::ctl {

// The identities of a local cluster's credentials.
inline constexpr char kLocalCoordinatorIdentity[] = "coordinator";
inline constexpr char kLocalAdminIdentity[] = "admin";

// Creates `tls_dir` and what is described above (the CA only when missing). Errors:
// UNAVAILABLE (a file cannot be written), INVALID_ARGUMENT (an existing CA cannot be read).
absl::Status IssueLocalCredentials(const std::string& tls_dir,
                                   const std::vector<std::string>& workers);

// The credentials of `identity` (kLocalCoordinatorIdentity, a worker id, kLocalAdminIdentity).
TransportOptions LocalTransport(const std::string& tls_dir, const std::string& identity);

}  // namespace substrax::ctl

#endif  // SUBSTRAX_CLIENT_LOCAL_CREDENTIALS_H_
