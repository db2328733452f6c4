// Moved to rpc/health_server.h (//rpc:health_server). This forwarding header stays only until
// agent/daemon.h, another owner's file in flight, includes the new path; then delete it.
#ifndef SUBSTRAX_PROTO_HEALTH_SERVER_H_
#define SUBSTRAX_PROTO_HEALTH_SERVER_H_

#include "rpc/health_server.h"

#endif  // SUBSTRAX_PROTO_HEALTH_SERVER_H_
