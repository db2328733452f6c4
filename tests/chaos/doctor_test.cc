// `substraxctl doctor` against a cluster of real processes (a coordinator and 5 agents of one
// CPU device each over mutual TLS), with a fault of each kind it checks:
//   - a data root no job process can list (mode 000, and the agents run without
//     CAP_DAC_OVERRIDE, as an agent that is not root would be: setpriv);
//   - one agent's clock 90 s ahead (libfaketime preloaded into it, from Debian's faketime);
//   - one agent's certificate expiring within a day;
//   - one slow link: the slow_link job failpoint makes every all-reduce between two of the
//     doctor's processes wait 300 ms (tc netem is not in every kernel);
//   - one agent killed (unreachable) and one whose device runs a job (busy).
// Each is named with what to do; the healthy parts are OK. Ends with the /proc check that no
// process outlived the test.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "substrax/v1/job_service.pb.h"
#include "tests/chaos/harness.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kLibFaketime[] = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

// The findings of `worker` whose check starts with `check`.
std::vector<v1::DoctorFinding> FindingsOf(const v1::DoctorSummary& s, const std::string& worker,
                                          const std::string& check) {
  std::vector<v1::DoctorFinding> out;
  for (const v1::DoctorReport& r : s.workers()) {
    if (r.worker_id() != worker) continue;
    for (const v1::DoctorFinding& f : r.findings()) {
      if (absl::StartsWith(f.check(), check)) out.push_back(f);
    }
  }
  return out;
}

TEST(DoctorTest, EachFaultIsNamedWithWhatToDo) {
  if (geteuid() != 0 || access(kLibFaketime, R_OK) != 0) {
    if (InCi()) FAIL() << "needs root and Debian's faketime (tools/install_deps.sh installs it)";
    GTEST_SKIP() << "needs root (to drop CAP_DAC_OVERRIDE from the agents) and faketime";
  }
  const std::string data = TempDir("doctor-data");
  const std::string ok_root = data + "/ok", locked_root = data + "/locked";
  ASSERT_EQ(mkdir(ok_root.c_str(), 0755), 0);
  ASSERT_EQ(mkdir(locked_root.c_str(), 0755), 0);
  ASSERT_EQ(chmod(locked_root.c_str(), 0), 0);

  ChaosClusterOptions options;
  options.workers = 5;
  options.cpu_devices_per_worker = 1;
  options.tls = true;
  options.default_worker_cert_valid_for = absl::Hours(24 * 90);
  options.worker_cert_valid_for[2] = absl::Hours(20);  // w-3
  const std::vector<std::string> no_dac_override = {
      "/usr/bin/setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--"};
  options.worker_wrapper = no_dac_override;
  options.worker_wrappers[1] = no_dac_override;  // w-2: its clock 90 s ahead
  options.worker_wrappers[1].insert(options.worker_wrappers[1].end(),
                                    {"/usr/bin/env", absl::StrCat("LD_PRELOAD=", kLibFaketime),
                                     "FAKETIME=+90s", "FAKETIME_DONT_FAKE_MONOTONIC=1"});
  options.worker_flags = {"--data-root", ok_root, "--data-root", locked_root,
                          "--job-env-pass", "SUBSTRAX_JOB_FAILPOINTS"};
  options.worker_env = {"SUBSTRAX_JOB_FAILPOINTS=slow_link:process=1:at=300:peer=2"};
  ChaosCluster cluster("doctor", options);
  ASSERT_TRUE(cluster.WaitForWorkers(5, absl::Seconds(60))) << cluster.Logs();

  // w-5 is killed (unreachable); a job holds one of the others' device (busy).
  cluster.worker(4).Signal(SIGKILL);
  cluster.worker(4).Wait(absl::Seconds(10));
  // Dead before the busy job is placed, so that the job cannot land on it.
  ASSERT_TRUE(PollUntil([&] { return !cluster.WaitForWorkers(5, absl::Seconds(1)); },
                        absl::Seconds(30)))
      << "w-5 still counts as alive";
  const std::string busy_job = cluster.Submit(SyntheticJob("busy", 1, 1000000));
  ASSERT_FALSE(absl::StartsWith(busy_job, "error")) << busy_job;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(busy_job);
        return job.has_value() && job->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(60)))
      << cluster.Logs();

  const CommandResult table = cluster.Ctl({"doctor", "--wait", "2m"});
  std::fprintf(stderr, "substraxctl doctor (exit %d):\n%s\n%s\n", table.exit_code,
               table.out.c_str(), table.err.c_str());
  EXPECT_EQ(table.exit_code, 1) << table.err;
  EXPECT_THAT(table.out, HasSubstr("PROBLEM"));
  EXPECT_THAT(table.out, HasSubstr("Not tested"));

  const CommandResult json = cluster.Ctl({"doctor", "--wait", "2m", "-o", "json"});
  EXPECT_EQ(json.exit_code, 1) << json.err;
  v1::DoctorSummary s;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.out, &s).ok()) << json.out;
  EXPECT_EQ(s.job_state(), v1::JOB_STATE_SUCCEEDED) << s.job_error();

  // Untested: the dead one and the busy one, each with why.
  std::map<std::string, std::string> untested;
  for (const v1::UntestedWorker& u : s.untested()) untested[u.worker_id()] = u.reason();
  ASSERT_EQ(untested.size(), 2u) << json.out;
  EXPECT_THAT(untested["w-5"], HasSubstr("unreachable: no heartbeat for"));
  std::string busy_worker;
  for (const auto& [id, reason] : untested) {
    if (absl::StartsWith(reason, "busy: its device runs jobs (busy-")) busy_worker = id;
  }
  EXPECT_NE(busy_worker, "") << json.out;

  std::set<std::string> tested;
  std::map<int, std::string> worker_of_process;
  for (const v1::DoctorReport& r : s.workers()) {
    if (r.process_index() < 0) continue;
    tested.insert(r.worker_id());
    worker_of_process[r.process_index()] = r.worker_id();
  }
  ASSERT_EQ(tested.size(), 3u) << json.out;
  for (const std::string& w : tested) {
    // The locked data root on every tested worker; the other is fine.
    const auto locked = FindingsOf(s, w, "data root " + locked_root);
    ASSERT_EQ(locked.size(), 1u) << w << json.out;
    EXPECT_EQ(locked[0].verdict(), v1::DOCTOR_VERDICT_PROBLEM);
    EXPECT_THAT(locked[0].seen(), HasSubstr("cannot list it: Permission denied"));
    EXPECT_THAT(locked[0].fix(), HasSubstr("read and execute permission"));
    const auto ok = FindingsOf(s, w, "data root " + ok_root);
    ASSERT_EQ(ok.size(), 1u) << w;
    EXPECT_EQ(ok[0].verdict(), v1::DOCTOR_VERDICT_OK) << ok[0].seen();
    ASSERT_EQ(FindingsOf(s, w, "cpu").size(), 1u);
    EXPECT_EQ(FindingsOf(s, w, "cpu")[0].verdict(), v1::DOCTOR_VERDICT_OK);
    ASSERT_EQ(FindingsOf(s, w, "work dir").size(), 1u);
  }
  // Clocks and certificates, of every alive worker (busy ones too).
  for (const std::string w : {"w-1", "w-2", "w-3", "w-4"}) {
    const auto clock = FindingsOf(s, w, "clock");
    ASSERT_EQ(clock.size(), 1u) << w << json.out;
    const auto cert = FindingsOf(s, w, "certificate");
    ASSERT_EQ(cert.size(), 1u) << w << json.out;
    if (w == std::string("w-2")) {
      EXPECT_EQ(clock[0].verdict(), v1::DOCTOR_VERDICT_PROBLEM) << clock[0].seen();
      EXPECT_THAT(clock[0].seen(), HasSubstr("ahead of the coordinator's"));
      EXPECT_THAT(clock[0].seen(), HasSubstr("s ahead"));
      EXPECT_THAT(clock[0].fix(), HasSubstr("synchronize the host's clock"));
    } else {
      EXPECT_EQ(clock[0].verdict(), v1::DOCTOR_VERDICT_OK) << w << ": " << clock[0].seen();
    }
    if (w == std::string("w-3")) {
      EXPECT_EQ(cert[0].verdict(), v1::DOCTOR_VERDICT_PROBLEM) << cert[0].seen();
      EXPECT_THAT(cert[0].seen(), HasSubstr("expires in 19h"));
      EXPECT_THAT(cert[0].fix(), HasSubstr("substraxctl certs issue --name w-3 --role worker"));
    } else {
      EXPECT_EQ(cert[0].verdict(), v1::DOCTOR_VERDICT_OK) << w << ": " << cert[0].seen();
    }
  }
  // Links: 3 pairs among the tested workers; only the slowed one (processes 1 and 2) is a
  // problem, and it names its other end.
  int links = 0, slow = 0;
  for (const v1::DoctorReport& r : s.workers()) {
    for (const v1::DoctorFinding& f : r.findings()) {
      if (!absl::StartsWith(f.check(), "link to ")) continue;
      ++links;
      if (f.verdict() == v1::DOCTOR_VERDICT_OK) continue;
      ++slow;
      EXPECT_EQ(f.verdict(), v1::DOCTOR_VERDICT_PROBLEM) << f.seen();
      EXPECT_EQ(r.worker_id(), worker_of_process[1]) << f.check();
      EXPECT_THAT(f.check(), HasSubstr(absl::StrCat("link to ", worker_of_process[2], " (host ")));
      EXPECT_THAT(f.seen(), HasSubstr("the median latency of the 3 links"));
      EXPECT_THAT(f.fix(), HasSubstr("check the network path between the two hosts"));
    }
  }
  EXPECT_EQ(links, 3) << json.out;
  EXPECT_EQ(slow, 1) << json.out;

  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
