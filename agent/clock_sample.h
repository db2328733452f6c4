// An agent's wall clock against the coordinator's, from one heartbeat, as NTP estimates it: the
// coordinator's time (HeartbeatResponse.server_time) against the middle of the agent's send and
// receive times; the round trip bounds the error (v1::ClockSample). For `substraxctl doctor`
// (WORK IN PROGRESS, branch i38-doctor).
#ifndef SUBSTRAX_AGENT_CLOCK_SAMPLE_H_
#define SUBSTRAX_AGENT_CLOCK_SAMPLE_H_

#include "absl/time/time.h"
#include "substrax/v1/coordinator_service.pb.h"

namespace substrax {

// `sent` and `received` on the agent's wall clock, `server` the coordinator's answer's time.
v1::ClockSample MeasureClock(absl::Time sent, absl::Time received, absl::Time server);

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_CLOCK_SAMPLE_H_
