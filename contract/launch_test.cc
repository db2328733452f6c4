#include "contract/launch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

std::string TempDir() {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp",
                                 "/launch_test.XXXXXX");
  return mkdtemp(dir.data()) ? dir : "";
}

v1::ProgramLaunch Launch() {
  v1::ProgramLaunch launch;
  launch.set_sdk_version_major(1);
  v1::Assignment* a = launch.mutable_assignment();
  a->set_job_id("mnist");
  a->set_attempt(2);
  a->set_process_index(1);
  a->set_num_processes(2);
  a->add_local_device_ids(2);
  a->add_local_device_ids(3);
  a->set_rendezvous_prefix("/jobs/mnist/2/");
  a->set_rendezvous_secret("s3cret");
  launch.set_coordinator("10.0.0.1:7070");
  launch.mutable_transport()->set_ca_file("/etc/substrax/ca.crt");
  launch.mutable_transport()->set_attempt_token("sxa1.mnist.2.1.0123456789abcdef");
  launch.set_result_path("/work/mnist-attempt-2-process-1.result");
  launch.set_started_path("/work/mnist-attempt-2-process-1.started");
  return launch;
}

TEST(LaunchFileTest, IsJsonWithTheProtoFieldNamesAndReadsBackWhole) {
  const std::string path = TempDir() + "/x.launch";
  ASSERT_TRUE(WriteLaunchFile(path, Launch()).ok());
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Any language reads it with a JSON parser, by the names of program.proto.
  EXPECT_TRUE(absl::StrContains(text, R"("job_id":"mnist")")) << text;
  EXPECT_TRUE(absl::StrContains(text, R"("result_path":"/work/mnist-attempt-2-process-1.result")"))
      << text;
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  absl::StatusOr<v1::ProgramLaunch> read = ReadLaunchFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->SerializeAsString(), Launch().SerializeAsString());
}

// The contract has no place for a worker's identity: the transport verifies the coordinator and
// carries the attempt's token, nothing else (docs/launch.md).
TEST(LaunchFileTest, TheTransportHoldsNoWorkerCredential) {
  const google::protobuf::Descriptor* transport = v1::TransportSettings::descriptor();
  std::vector<std::string> fields;
  for (int i = 0; i < transport->field_count(); ++i) fields.push_back(transport->field(i)->name());
  EXPECT_EQ(fields, std::vector<std::string>({"insecure", "ca_file", "server_name",
                                              "reload_interval", "attempt_token"}));
  const std::string text = EncodeLaunch(Launch());
  EXPECT_TRUE(absl::StrContains(text, R"("attempt_token":"sxa1.mnist.2.1.0123456789abcdef")"))
      << text;
  for (const char* field : {"cert_file", "key_file", "token_file"}) {
    EXPECT_FALSE(absl::StrContains(text, field)) << text;
  }
}

// A launch file of an earlier agent, which named the daemon's certificate and key, still reads;
// the SDK never sees those paths.
TEST(LaunchFileTest, AnEarlierAgentsCertificatePathsAreDropped) {
  const std::string path = TempDir() + "/earlier.launch";
  std::ofstream(path) << R"({"sdk_version_major": 1, "assignment": {"job_id": "j"},
                            "transport": {"ca_file": "/ca.pem", "cert_file": "/w.pem",
                                          "key_file": "/w.key"}})";
  absl::StatusOr<v1::ProgramLaunch> read = ReadLaunchFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->transport().ca_file(), "/ca.pem");
  EXPECT_FALSE(absl::StrContains(EncodeLaunch(*read), "/w.")) << EncodeLaunch(*read);
}

TEST(LaunchFileTest, FieldsOfANewerAgentAreIgnored) {
  const std::string path = TempDir() + "/newer.launch";
  std::ofstream(path) << R"({"sdk_version_major": 1, "assignment": {"job_id": "j"},
                            "a_field_of_release_9": {"x": 1}})";
  absl::StatusOr<v1::ProgramLaunch> read = ReadLaunchFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->assignment().job_id(), "j");
}

TEST(LaunchFileTest, AMissingOrForeignFileIsAnErrorNamingTheVariable) {
  const std::string dir = TempDir();
  absl::StatusOr<v1::ProgramLaunch> missing = ReadLaunchFile(dir + "/none");
  EXPECT_TRUE(absl::IsInvalidArgument(missing.status()));
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "SUBSTRAX_LAUNCH names " + dir))
      << missing.status();
  for (const char* contents : {"not json", "{}", R"({"coordinator": "x"})"}) {
    std::ofstream(dir + "/foreign") << contents;
    absl::StatusOr<v1::ProgramLaunch> foreign = ReadLaunchFile(dir + "/foreign");
    EXPECT_TRUE(absl::IsInvalidArgument(foreign.status())) << contents;
    EXPECT_TRUE(absl::StrContains(foreign.status().message(), "holds no launch")) << contents;
  }
}

TEST(LaunchFileTest, DescribeLaunchNamesThePartOfTheAttempt) {
  EXPECT_EQ(DescribeLaunch(Launch()),
            "job mnist attempt 2 process 1 of 2, devices 2,3, rendezvous /jobs/mnist/2/, result "
            "/work/mnist-attempt-2-process-1.result");
}

TEST(AttemptResultTest, RoundTripsWithTheLaunchsIdentity) {
  const std::string dir = TempDir();
  v1::ProgramLaunch launch = Launch();
  launch.set_result_path(dir + "/r.result");
  v1::ReportAttemptStatusRequest result;
  result.set_state(v1::RUNNER_STATE_SUCCEEDED);
  (*result.mutable_final_metrics())["test_accuracy"] = 0.9;
  WriteAttemptResult(launch, result);
  absl::StatusOr<v1::ReportAttemptStatusRequest> read = ReadAttemptResult(dir + "/r.result");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->job_id(), "mnist");
  EXPECT_EQ(read->attempt(), 2);
  EXPECT_EQ(read->process_index(), 1);
  EXPECT_EQ(read->final_metrics().at("test_accuracy"), 0.9);
  EXPECT_TRUE(absl::IsNotFound(ReadAttemptResult(dir + "/none").status()));
  std::ofstream(dir + "/bad") << "\xff\xff\xff";
  EXPECT_TRUE(absl::IsDataLoss(ReadAttemptResult(dir + "/bad").status()));
}

}  // namespace
}  // namespace substrax
