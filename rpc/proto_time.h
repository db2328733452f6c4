// Conversions between protobuf's well-known time types (google.protobuf.Timestamp and
// google.protobuf.Duration) and absl::Time / absl::Duration. The one place in substrax that does
// them: the coordinator, the worker daemon and the CLI all call these. No gRPC here, so the
// coordinator's pure state machine may use it.
#ifndef SUBSTRAX_RPC_PROTO_TIME_H_
#define SUBSTRAX_RPC_PROTO_TIME_H_

#include "absl/time/time.h"
#include "google/protobuf/duration.pb.h"
#include "google/protobuf/timestamp.pb.h"

namespace substrax {

// As the protos define them: a Timestamp has whole seconds toward the past and nanos in
// [0, 1e9); a Duration has seconds and nanos of the same sign. Both round-trip exactly (to the
// nanosecond) through the From* functions.
google::protobuf::Timestamp ToProtoTime(absl::Time t);
google::protobuf::Duration ToProtoDuration(absl::Duration d);

absl::Time FromProtoTime(const google::protobuf::Timestamp& t);
absl::Duration FromProtoDuration(const google::protobuf::Duration& d);

// True for the zero Timestamp (1970-01-01T00:00:00Z), which an unset field reads as.
bool IsUnsetProtoTime(const google::protobuf::Timestamp& t);

}  // namespace substrax

#endif  // SUBSTRAX_RPC_PROTO_TIME_H_
