#include "agent/clock_sample.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"
#include "rpc/pki.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

TEST(ClockSampleTest, TheOffsetIsTheAgentsMiddleAgainstTheCoordinatorsTime) {
  const absl::Time t0 = absl::FromUnixSeconds(1796579000);
  // Sent at t0, answered 20 ms later; the coordinator's clock said t0 - 3 s + 10 ms: the agent
  // is 3 s ahead.
  const v1::ClockSample s =
      MeasureClock(t0, t0 + absl::Milliseconds(20), t0 - absl::Seconds(3) + absl::Milliseconds(10));
  EXPECT_EQ(FromProtoDuration(s.offset()), absl::Seconds(3));
  EXPECT_EQ(FromProtoDuration(s.round_trip()), absl::Milliseconds(20));
  // Behind: negative.
  EXPECT_EQ(FromProtoDuration(MeasureClock(t0, t0, t0 + absl::Minutes(2)).offset()),
            -absl::Minutes(2));
}

TEST(CertificateExpiryTest, ReadsNotAfterAndAReplacedFileWithinTheInterval) {
  const absl::Time now = absl::FromUnixSeconds(1796579000);
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/worker.crt";
  auto write = [&](absl::Duration valid_for) {
    absl::StatusOr<pki::KeyAndCert> ca =
        pki::CreateCertificateAuthority("ca", now - absl::Hours(1), now + absl::Hours(24 * 400));
    ASSERT_TRUE(ca.ok()) << ca.status();
    absl::StatusOr<pki::KeyAndCert> leaf = pki::IssueCertificate(
        *ca, pki::RequestFor("w-1", "worker", {}, {}, now - absl::Hours(1), now + valid_for));
    ASSERT_TRUE(leaf.ok()) << leaf.status();
    std::ofstream(path) << leaf->cert_pem;
  };
  write(absl::Hours(20));
  CertificateExpiry expiry(path, absl::Seconds(60));
  ASSERT_TRUE(expiry.NotAfter(now).has_value());
  EXPECT_EQ(*expiry.NotAfter(now), now + absl::Hours(20));
  write(absl::Hours(24 * 90));  // renewed: seen at the next read, within the interval
  EXPECT_EQ(*expiry.NotAfter(now + absl::Seconds(30)), now + absl::Hours(20));
  EXPECT_EQ(*expiry.NotAfter(now + absl::Seconds(61)), now + absl::Hours(24 * 90));
  std::ofstream(path) << "not a certificate";
  EXPECT_FALSE(expiry.NotAfter(now + absl::Seconds(200)).has_value());
  EXPECT_FALSE(CertificateExpiry("", absl::Seconds(1)).NotAfter(now).has_value());
}

}  // namespace
}  // namespace substrax
