#include "agent/clock_sample.h"

#include "rpc/proto_time.h"

namespace substrax {

v1::ClockSample MeasureClock(absl::Time sent, absl::Time received, absl::Time server) {
  const absl::Duration round_trip = received - sent;
  v1::ClockSample sample;
  *sample.mutable_offset() = ToProtoDuration((sent + round_trip / 2) - server);
  *sample.mutable_round_trip() = ToProtoDuration(round_trip);
  return sample;
}

}  // namespace substrax
