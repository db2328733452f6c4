#include "agent/clock_sample.h"

#include <fstream>
#include <sstream>

#include "rpc/pki.h"
#include "rpc/proto_time.h"

namespace substrax {

v1::ClockSample MeasureClock(absl::Time sent, absl::Time received, absl::Time server) {
  const absl::Duration round_trip = received - sent;
  v1::ClockSample sample;
  *sample.mutable_offset() = ToProtoDuration((sent + round_trip / 2) - server);
  *sample.mutable_round_trip() = ToProtoDuration(round_trip);
  return sample;
}

std::optional<absl::Time> CertificateExpiry::NotAfter(absl::Time now) {
  if (cert_file_.empty()) return std::nullopt;
  if (now - read_at_ < every_) return not_after_;
  read_at_ = now;
  std::ifstream in(cert_file_);
  std::stringstream pem;
  pem << in.rdbuf();
  absl::StatusOr<pki::CertificateInfo> info = pki::ParseCertificate(pem.str());
  not_after_ = info.ok() ? std::optional<absl::Time>(info->not_after) : std::nullopt;
  return not_after_;
}

}  // namespace substrax
