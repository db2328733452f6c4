#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/format.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace substrax::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

template <typename T>
T Parse(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

const absl::Time kNow = absl::FromUnixSeconds(1714564800);  // 2024-05-01 12:00:00 UTC

// A doctor job over w-1, w-2, w-3 with links (latency in ms) 0-1, 0-2 and 1-2.
v1::Job Doctor(double l01, double l02, double l12, const std::string& error12 = "") {
  auto link = [](int peer, double ms, const std::string& error) {
    return absl::StrCat("links { peer: ", peer, " latency { nanos: ",
                        static_cast<int>(ms * 1e6), " } bytes_per_second: 1e9 error: '", error,
                        "' }");
  };
  return Parse<v1::Job>(absl::StrCat(
      R"pb(id: "doctor-7" state: JOB_STATE_SUCCEEDED
           spec { doctor { workers: [ "w-1", "w-2", "w-3" ]
                           untested { worker_id: "w-4" host: "d" reason: "busy: its device runs jobs (x-1)" }
                           untested { worker_id: "w-5" host: "e" reason: "unreachable: no heartbeat for 41 s" } } }
           doctor { process_index: 0 worker_id: "w-1" host: "a"
                    findings { check: "cpu" verdict: DOCTOR_VERDICT_OK seen: "x86-64-v3" }
                    findings { check: "data root /data" verdict: DOCTOR_VERDICT_PROBLEM
                               seen: "cannot list it: Permission denied" fix: "give read" } )pb",
      link(1, l01, ""), link(2, l02, ""), R"pb( }
           doctor { process_index: 1 worker_id: "w-2" host: "b" )pb",
      link(0, l01, ""), link(2, l12, error12), R"pb( }
           doctor { process_index: 2 worker_id: "w-3" host: "c" )pb",
      link(0, l02, ""), link(1, l12, error12), " }"));
}

v1::ListWorkersResponse Workers(int64_t w2_offset_ms, absl::Duration w3_cert_left) {
  return Parse<v1::ListWorkersResponse>(absl::StrCat(
      R"pb(workers { worker_id: "w-1" host: "a" state: WORKER_STATE_ALIVE
                     clock { offset { nanos: 200000 } round_trip { nanos: 400000 } } }
           workers { worker_id: "w-2" host: "b" state: WORKER_STATE_ALIVE
                     clock { offset { seconds: )pb",
      w2_offset_ms / 1000, " nanos: ", (w2_offset_ms % 1000) * 1000000,
      R"pb( } round_trip { nanos: 1000000 } } }
           workers { worker_id: "w-3" host: "c" state: WORKER_STATE_ALIVE
                     clock { offset { nanos: -300000 } round_trip { nanos: 400000 } }
                     certificate_not_after { seconds: )pb",
      absl::ToUnixSeconds(kNow + w3_cert_left), R"pb( } }
           workers { worker_id: "w-4" host: "d" state: WORKER_STATE_ALIVE }
           workers { worker_id: "w-5" host: "e" state: WORKER_STATE_DEAD })pb"));
}

const v1::DoctorFinding* Find(const v1::DoctorSummary& s, const std::string& worker,
                              const std::string& check) {
  for (const v1::DoctorReport& r : s.workers()) {
    if (r.worker_id() != worker) continue;
    for (const v1::DoctorFinding& f : r.findings()) {
      if (f.check().rfind(check, 0) == 0) return &f;
    }
  }
  return nullptr;
}

TEST(FormatDoctorTest, OneSlowLinkAmongThreeIsAProblemNamingItsEnds) {
  const v1::DoctorSummary s =
      SummarizeDoctor(Doctor(0.2, 0.25, 300), Workers(5, absl::Hours(24 * 90)), kNow);
  const v1::DoctorFinding* slow = Find(s, "w-2", "link to w-3 (host c)");
  ASSERT_NE(slow, nullptr);
  EXPECT_EQ(slow->verdict(), v1::DOCTOR_VERDICT_PROBLEM);
  EXPECT_THAT(slow->seen(), HasSubstr("latency 300.00 ms, 1.00 GB/s; 1200x the median latency "
                                      "of the 3 links (0.25 ms)"));
  EXPECT_THAT(slow->fix(), HasSubstr("check the network path between the two hosts"));
  // Each pair once, under its lower process.
  EXPECT_EQ(Find(s, "w-3", "link to"), nullptr);
  EXPECT_EQ(Find(s, "w-1", "link to w-2")->verdict(), v1::DOCTOR_VERDICT_OK);
  EXPECT_EQ(Find(s, "w-1", "link to w-3")->verdict(), v1::DOCTOR_VERDICT_OK);
  EXPECT_EQ(s.problems(), 2);  // the link and w-1's data root
  EXPECT_EQ(s.warnings(), 1);  // w-4's clock: never measured
}

TEST(FormatDoctorTest, ALinkThatFailedIsAProblemAndOneAloneIsJudgedByItsOwnLatency) {
  v1::DoctorSummary s = SummarizeDoctor(Doctor(0.2, 0.25, 0, "connect: timed out"),
                                        Workers(5, absl::Hours(24 * 90)), kNow);
  EXPECT_EQ(Find(s, "w-2", "link to w-3")->verdict(), v1::DOCTOR_VERDICT_PROBLEM);
  EXPECT_THAT(Find(s, "w-2", "link to w-3")->seen(), HasSubstr("not measured: connect: timed out"));
  EXPECT_THAT(Find(s, "w-2", "link to w-3")->fix(), HasSubstr("--listen-host"));

  v1::Job two = Parse<v1::Job>(R"pb(
    id: "doctor-8" state: JOB_STATE_SUCCEEDED spec { doctor { workers: [ "w-1", "w-2" ] } }
    doctor { process_index: 0 worker_id: "w-1" host: "a"
             links { peer: 1 latency { nanos: 30000000 } bytes_per_second: 1e9 } }
    doctor { process_index: 1 worker_id: "w-2" host: "b"
             links { peer: 0 latency { nanos: 30000000 } bytes_per_second: 1e9 } })pb");
  s = SummarizeDoctor(two, Workers(5, absl::Hours(24 * 90)), kNow);
  EXPECT_EQ(Find(s, "w-1", "link to w-2")->verdict(), v1::DOCTOR_VERDICT_WARNING);
  EXPECT_THAT(Find(s, "w-1", "link to w-2")->seen(), HasSubstr("more than 20.00 ms"));
  two.mutable_doctor(0)->mutable_links(0)->mutable_latency()->set_nanos(100000);
  two.mutable_doctor(0)->mutable_links(0)->set_bytes_per_second(10e6);
  s = SummarizeDoctor(two, Workers(5, absl::Hours(24 * 90)), kNow);
  EXPECT_THAT(Find(s, "w-1", "link to w-2")->seen(), HasSubstr("10 MB/s; below 50 MB/s"));
}

TEST(FormatDoctorTest, ClocksAndCertificatesAreJudgedForEveryAliveWorker) {
  v1::DoctorSummary s = SummarizeDoctor(Doctor(0.2, 0.2, 0.2), Workers(90000, absl::Hours(20)),
                                        kNow);
  const v1::DoctorFinding* clock = Find(s, "w-2", "clock");
  EXPECT_EQ(clock->verdict(), v1::DOCTOR_VERDICT_PROBLEM);
  EXPECT_EQ(clock->seen(), "90.0 s ahead of the coordinator's (within 0.50 ms)");
  EXPECT_THAT(clock->fix(), HasSubstr("synchronize the host's clock"));
  EXPECT_EQ(Find(s, "w-3", "clock")->seen(), "0.30 ms behind the coordinator's (within 0.20 ms)");
  EXPECT_EQ(Find(s, "w-3", "clock")->verdict(), v1::DOCTOR_VERDICT_OK);
  const v1::DoctorFinding* cert = Find(s, "w-3", "certificate");
  EXPECT_EQ(cert->verdict(), v1::DOCTOR_VERDICT_PROBLEM);
  EXPECT_EQ(cert->seen(), "expires in 20h00m (2024-05-02 08:00 UTC)");
  EXPECT_THAT(cert->fix(), HasSubstr("substraxctl certs issue --name w-3 --role worker"));
  // No certificate (plaintext): no row. An untested but alive worker still gets its clock.
  EXPECT_EQ(Find(s, "w-1", "certificate"), nullptr);
  EXPECT_EQ(Find(s, "w-4", "clock")->verdict(), v1::DOCTOR_VERDICT_WARNING);
  EXPECT_EQ(Find(s, "w-5", "clock"), nullptr);

  s = SummarizeDoctor(Doctor(0.2, 0.2, 0.2), Workers(300, absl::Hours(24 * 10)), kNow);
  EXPECT_EQ(Find(s, "w-2", "clock")->verdict(), v1::DOCTOR_VERDICT_WARNING);
  EXPECT_EQ(Find(s, "w-3", "certificate")->verdict(), v1::DOCTOR_VERDICT_WARNING);
  s = SummarizeDoctor(Doctor(0.2, 0.2, 0.2), Workers(50, -absl::Hours(1)), kNow);
  EXPECT_EQ(Find(s, "w-2", "clock")->verdict(), v1::DOCTOR_VERDICT_OK);
  EXPECT_THAT(Find(s, "w-3", "certificate")->seen(), HasSubstr("expired 1h00m ago"));
}

TEST(FormatDoctorTest, TheTableSaysWhatToDoAndWhatWasNotTested) {
  const v1::DoctorSummary s =
      SummarizeDoctor(Doctor(0.2, 0.25, 300), Workers(5, absl::Hours(24 * 90)), kNow);
  const std::string out = FormatDoctor(s, FormatOptions());
  EXPECT_THAT(out, HasSubstr("WORKER   HOST   CHECK"));
  EXPECT_THAT(out, HasSubstr("data root /data"));
  EXPECT_THAT(out, HasSubstr("What to do:\n  w-1 data root /data: give read\n"));
  EXPECT_THAT(out, HasSubstr("Not tested (no host checks or links):\n"
                             "  w-4 (host d): busy: its device runs jobs (x-1)\n"
                             "  w-5 (host e): unreachable: no heartbeat for 41 s\n"));
  EXPECT_THAT(out, HasSubstr("2 problems, 1 warning on 3 tested workers (doctor job doctor-7, "
                             "SUCCEEDED)"));
  EXPECT_THAT(out, Not(HasSubstr("\x1b[")));
}

TEST(FormatDoctorTest, AWorkerWithoutAReportSaysWhy) {
  v1::Job failed = Doctor(0.2, 0.2, 0.2);
  failed.set_state(v1::JOB_STATE_FAILED);
  failed.set_error("runner of process 2 on w-3 exited with status 1");
  failed.mutable_doctor()->RemoveLast();
  const v1::DoctorSummary s = SummarizeDoctor(failed, Workers(5, absl::Hours(2000)), kNow);
  const v1::DoctorFinding* none = Find(s, "w-3", "doctor process");
  ASSERT_NE(none, nullptr);
  EXPECT_EQ(none->verdict(), v1::DOCTOR_VERDICT_PROBLEM);
  EXPECT_THAT(none->seen(), HasSubstr("no report: the doctor job FAILED: runner of process 2"));
  EXPECT_THAT(none->fix(), HasSubstr("substraxctl logs doctor-7"));
}

}  // namespace
}  // namespace substrax::ctl
