// gRPC keepalive for long-lived channels (worker daemons, runners) and the server side that
// accepts their pings. A connection that went half-open (a peer's host vanished, a middlebox
// dropped the flow) is noticed within kKeepaliveTime + kKeepaliveTimeout instead of the
// kernel's TCP timeout (minutes to hours), so streams break and reconnect, and leases decide.
#ifndef SUBSTRAX_RPC_KEEPALIVE_H_
#define SUBSTRAX_RPC_KEEPALIVE_H_

#include "grpcpp/grpcpp.h"

namespace substrax {

// A ping after this much silence on a connection...
inline constexpr int kKeepaliveTimeMs = 5000;
// ...must be answered within this, or the connection is closed.
inline constexpr int kKeepaliveTimeoutMs = 5000;
// The longest wait between two attempts to reconnect.
inline constexpr int kMaxReconnectBackoffMs = 500;

// Channel arguments for a client channel that must notice a dead connection: pings every
// kKeepaliveTimeMs, even without calls in flight; and reconnects at least every
// kMaxReconnectBackoffMs while the server is away (gRPC's default backoff grows to 2 minutes,
// longer than any lease: a restarted coordinator would declare its workers dead before they
// even tried again). And no BDP probe: gRPC would ping the coordinator after answers arrive to
// size its receive window, which the small messages on these channels never need, and at 10,000
// agents those pings cost the coordinator a fifth of its CPU.
grpc::ChannelArguments KeepaliveChannelArguments();
// Lets a server accept the clients' pings (by default it would answer them with GOAWAY
// "too_many_pings") and ping its own clients the same way.
void EnableKeepalive(grpc::ServerBuilder& builder);

}  // namespace substrax

#endif  // SUBSTRAX_RPC_KEEPALIVE_H_
