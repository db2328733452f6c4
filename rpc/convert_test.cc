// Both conversions of //rpc, as tables: every canonical code both ways, and times and durations
// around the epoch and zero, with the sign rules of each proto.
#include "gtest/gtest.h"
#include "rpc/grpc_status.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

TEST(GrpcStatusTest, EveryCodeAndMessageRoundTrips) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status status(static_cast<absl::StatusCode>(code), code == 0 ? "" : "why");
    const grpc::Status wire = ToGrpcStatus(status);
    EXPECT_EQ(static_cast<int>(wire.error_code()), code);
    EXPECT_EQ(FromGrpcStatus(wire), status) << code;
  }
}

TEST(GrpcStatusTest, WhatPrefixesTheMessageOfErrorsOnly) {
  EXPECT_TRUE(FromGrpcStatus(grpc::Status::OK, "get 'x'").ok());
  const absl::Status status =
      FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused"), "get 'x'");
  EXPECT_EQ(status, absl::UnavailableError("get 'x': connection refused"));
}

TEST(ProtoTimeTest, TimesRoundTripWithNonNegativeNanos) {
  const absl::Time cases[] = {absl::UnixEpoch(), absl::FromUnixNanos(1'700'000'000'123'456'789),
                              absl::FromUnixNanos(-1'500'000'000)};
  for (absl::Time t : cases) {
    const google::protobuf::Timestamp proto = ToProtoTime(t);
    EXPECT_GE(proto.nanos(), 0);
    EXPECT_LT(proto.nanos(), 1'000'000'000);
    EXPECT_EQ(FromProtoTime(proto), t);
  }
  EXPECT_EQ(ToProtoTime(absl::FromUnixNanos(-1'500'000'000)).seconds(), -2);
  EXPECT_TRUE(IsUnsetProtoTime(google::protobuf::Timestamp()));
  EXPECT_FALSE(IsUnsetProtoTime(ToProtoTime(absl::FromUnixSeconds(1))));
}

TEST(ProtoTimeTest, DurationsRoundTrip) {
  const absl::Duration cases[] = {absl::ZeroDuration(), absl::Milliseconds(1500),
                                  absl::Seconds(10), absl::Milliseconds(-250)};
  for (absl::Duration d : cases) {
    const google::protobuf::Duration proto = ToProtoDuration(d);
    EXPECT_EQ(FromProtoDuration(proto), d);
    EXPECT_FALSE(proto.seconds() > 0 && proto.nanos() < 0);
    EXPECT_FALSE(proto.seconds() < 0 && proto.nanos() > 0);
  }
  EXPECT_EQ(ToProtoDuration(absl::Milliseconds(-250)).nanos(), -250'000'000);
  EXPECT_EQ(ToProtoDuration(absl::Milliseconds(1500)).seconds(), 1);
  EXPECT_EQ(ToProtoDuration(absl::Milliseconds(1500)).nanos(), 500'000'000);
}

}  // namespace
}  // namespace substrax
