// What an agent tells the coordinator about its host with every heartbeat, for `substraxctl
// doctor` (docs/diagnosis.md): its wall clock against the coordinator's, from one heartbeat, as
// NTP estimates it: the coordinator's time (HeartbeatResponse.server_time) against the middle of
// the agent's send and receive times; the round trip bounds the error (v1::ClockSample); and
// when its TLS certificate expires.
#ifndef SUBSTRAX_AGENT_CLOCK_SAMPLE_H_
#define SUBSTRAX_AGENT_CLOCK_SAMPLE_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/time/time.h"
#include "substrax/v1/coordinator_service.pb.h"

namespace substrax {

// `sent` and `received` on the agent's wall clock, `server` the coordinator's answer's time.
v1::ClockSample MeasureClock(absl::Time sent, absl::Time received, absl::Time server);

// The notAfter of the certificate in PEM file `cert_file`, read again at most every `every`
// (a reloaded certificate is seen within that). Thread-compatible.
class CertificateExpiry {
 public:
  CertificateExpiry(std::string cert_file, absl::Duration every)
      : cert_file_(std::move(cert_file)), every_(every) {}
  // nullopt without a file, or while it cannot be read or parsed.
  std::optional<absl::Time> NotAfter(absl::Time now);

 private:
  const std::string cert_file_;
  const absl::Duration every_;
  absl::Time read_at_ = absl::InfinitePast();
  std::optional<absl::Time> not_after_;
};

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_CLOCK_SAMPLE_H_
