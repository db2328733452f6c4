#include "rpc/proto_time.h"

#include <cstdint>

namespace substrax {
namespace {

// `whole` is `d` rounded to seconds (toward the past for a Timestamp, toward zero for a Duration).
template <typename Proto>
Proto SecondsAndNanos(absl::Duration d, absl::Duration whole) {
  Proto proto;
  proto.set_seconds(absl::ToInt64Seconds(whole));
  proto.set_nanos(static_cast<int32_t>(absl::ToInt64Nanoseconds(d - whole)));
  return proto;
}

}  // namespace

google::protobuf::Timestamp ToProtoTime(absl::Time t) {
  return SecondsAndNanos<google::protobuf::Timestamp>(
      t - absl::UnixEpoch(), absl::Floor(t - absl::UnixEpoch(), absl::Seconds(1)));
}

google::protobuf::Duration ToProtoDuration(absl::Duration d) {
  return SecondsAndNanos<google::protobuf::Duration>(d, absl::Trunc(d, absl::Seconds(1)));
}

absl::Time FromProtoTime(const google::protobuf::Timestamp& t) {
  return absl::FromUnixSeconds(t.seconds()) + absl::Nanoseconds(t.nanos());
}

absl::Duration FromProtoDuration(const google::protobuf::Duration& d) {
  return absl::Seconds(d.seconds()) + absl::Nanoseconds(d.nanos());
}

bool IsUnsetProtoTime(const google::protobuf::Timestamp& t) {
  return t.seconds() == 0 && t.nanos() == 0;
}

}  // namespace substrax
