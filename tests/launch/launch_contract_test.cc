// One launch contract: the built-in trainer (`substrax-job run`), an SDK program and a plain
// executable are started through the agent's one launch path (WriteAttemptFiles, BuildCommand,
// StartChild: what the agent does for every attempt), and each writes back what it read: the
// job, attempt, process, devices, rendezvous scope and result location. The test compares each
// field with the assignment it launched.
//
// No coordinator runs: the launch names an address nobody listens on. The built-in trainer and
// the SDK program read their launch and log it before they need the coordinator; the trainer
// then fails to rendezvous within the launch's collective timeout and says so in its result file,
// at the launch's result path.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/launch.h"
#include "contract/launch.h"
#include "core/job_spec.h"
#include "core/job_spec_builder.h"
#include "gtest/gtest.h"
#include "substrax/device.h"
#include "substrax/device_mesh_manager.h"
#include "tests/proc.h"
#include "tests/process.h"
#include "tests/testing/poll.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : "/tmp") / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Process `process` of a job of two processes with two CPU devices each, on two hosts.
v1::Assignment Assignment(const std::string& job, int attempt, int process, v1::JobSpec spec) {
  std::vector<Device> devices = MakeUniformCluster(2, 2);
  for (Device& d : devices) d.worker_id = d.host;
  absl::StatusOr<Mesh> mesh = DeviceMeshManager::CreateDataParallelMesh(devices);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  v1::Assignment a;
  a.set_job_id(job);
  a.set_attempt(attempt);
  a.set_process_index(process);
  a.set_num_processes(2);
  for (const Device& d : devices) {
    if (d.host == devices[2 * process].host) a.add_local_device_ids(d.id);
  }
  *a.mutable_mesh() = mesh->ToProto();
  *a.mutable_spec() = std::move(spec);
  a.set_rendezvous_prefix(absl::StrCat("/jobs/", job, "/", attempt, "/"));
  a.set_rendezvous_secret("secret-of-" + job);
  return a;
}

// What a process wrote back: the fields of its line "job J attempt A process P of N, devices D,
// rendezvous R, result F" after `prefix`.
std::map<std::string, std::string> WrittenBack(const std::string& log, const std::string& prefix) {
  std::map<std::string, std::string> fields;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::ConsumePrefix(&line, prefix)) continue;
    std::vector<std::string> words = absl::StrSplit(line, absl::ByAnyChar(" ,"), absl::SkipEmpty());
    for (size_t i = 0; i + 1 < words.size(); ++i) {
      if (words[i] == "job" || words[i] == "attempt" || words[i] == "process" || words[i] == "of" ||
          words[i] == "rendezvous" || words[i] == "result") {
        fields[words[i]] = words[i + 1];
      }
    }
    // Devices are "devices 2,3": split by the commas above, so read them from the line.
    const size_t at = line.find("devices ");
    if (at != absl::string_view::npos) {
      const absl::string_view rest = line.substr(at + 8);
      fields["devices"] = std::string(rest.substr(0, rest.find(' ')));
      if (absl::EndsWith(fields["devices"], ",")) fields["devices"].pop_back();
    }
    return fields;
  }
  return fields;
}

class LaunchContractTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir("launch_contract");
    programs_ = dir_ + "/programs";
    fs::create_directories(programs_);
    for (const char* name : {"sdk_echo", "plain_echo.py"}) {
      fs::copy_file(testing::Runfile(absl::StrCat("tests/launch/", name)),
                    absl::StrCat(programs_, "/", name));
      fs::permissions(absl::StrCat(programs_, "/", name), fs::perms::owner_all);
    }
    settings_.worker_id = "w-1";
    settings_.host = "host-1";
    settings_.coordinator = "127.0.0.1:1";  // nobody listens: nothing here needs it
    settings_.transport.insecure = true;
    settings_.listen_host = "127.0.0.1";
    settings_.collective_timeout = absl::Seconds(2);
    settings_.programs_dirs = {programs_};
    settings_.job_binary = testing::Runfile("worker/substrax-job");
  }

  // No process this test started (or one of theirs) outlived it: none names its directory on
  // its command line or in its SUBSTRAX_LAUNCH.
  void TearDown() override {
    EXPECT_TRUE(testing::PollUntil(
        [&] { return testing::ProcessesMentioning(dir_).empty(); },
        absl::Now() + absl::Seconds(10), "the test's processes to end"));
  }

  // Launches `assignment` as the agent does and waits for its process; returns its log.
  std::string LaunchAndWait(const v1::Assignment& assignment, AttemptFiles* files) {
    *files = FilesOfAttempt(dir_, assignment);
    EXPECT_TRUE(WriteAttemptFiles(settings_, assignment, *files).ok());
    absl::StatusOr<ChildCommand> command = BuildCommand(settings_, assignment, *files);
    EXPECT_TRUE(command.ok()) << command.status();
    if (!command.ok()) return "";
    const int log = open(files->log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    absl::StatusOr<pid_t> pid = StartChild(*command, log);
    close(log);
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (!pid.ok()) return "";
    const std::optional<int> status = testing::WaitOrKill(*pid, absl::Now() + absl::Seconds(60));
    EXPECT_TRUE(status.has_value())
        << "the process of " << assignment.job_id() << " did not end within 60 s";
    return ReadFile(files->log);
  }

  // Compares what a process wrote back with the assignment, field by field.
  void ExpectReadAsLaunched(const std::map<std::string, std::string>& read, const v1::Assignment& a,
                            const AttemptFiles& files, const std::string& log) {
    const std::map<std::string, std::string> launched = {
        {"job", a.job_id()},
        {"attempt", absl::StrCat(a.attempt())},
        {"process", absl::StrCat(a.process_index())},
        {"of", absl::StrCat(a.num_processes())},
        {"devices", absl::StrJoin(a.local_device_ids(), ",")},
        {"rendezvous", a.rendezvous_prefix()},
        {"result", files.result},
    };
    for (const auto& [field, want] : launched) {
      auto it = read.find(field);
      EXPECT_TRUE(it != read.end() && it->second == want)
          << a.job_id() << ": " << field << " read as '"
          << (it == read.end() ? "(missing)" : it->second) << "', launched as '" << want
          << "'; log:\n"
          << log;
    }
  }

  std::string dir_;
  std::string programs_;
  LaunchSettings settings_;
};

TEST_F(LaunchContractTest, BuiltInTrainerSdkProgramAndPlainExecutableReadTheSameLaunch) {
  v1::JobSpec builtin_spec = testing::JobSpecBuilder("builtin").DataParallel(4).Proto();
  ApplyJobSpecDefaults(&builtin_spec);
  const v1::Assignment builtin = Assignment("builtin-1", 3, 1, builtin_spec);
  const v1::Assignment sdk = Assignment(
      "sdk-1", 0, 0,
      testing::JobSpecBuilder("sdk").Program("{path: " + programs_ + "/sdk_echo}").Proto());
  const v1::Assignment plain = Assignment(
      "plain-1", 2, 1,
      testing::JobSpecBuilder("plain").Program("{path: " + programs_ + "/plain_echo.py}").Proto());

  // The built-in trainer: `substrax-job run`, nothing on its command line but the mode.
  AttemptFiles files;
  std::string log = LaunchAndWait(builtin, &files);
  ExpectReadAsLaunched(WrittenBack(log, "substrax: "), builtin, files, log);
  // It wrote how it ended where the launch said, as its own attempt: it could not rendezvous.
  absl::StatusOr<v1::ReportAttemptStatusRequest> result = ReadAttemptResult(files.result);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << log;
  EXPECT_EQ(result->job_id(), builtin.job_id());
  EXPECT_EQ(result->attempt(), builtin.attempt());
  EXPECT_EQ(result->process_index(), builtin.process_index());
  EXPECT_EQ(result->state(), v1::RUNNER_STATE_FAILED) << log;
  EXPECT_TRUE(fs::exists(files.started)) << "the trainer joined its job through Init";

  // An SDK program: substrax::Init logs the launch; the Program API says the same.
  log = LaunchAndWait(sdk, &files);
  ExpectReadAsLaunched(WrittenBack(log, "substrax: "), sdk, files, log);
  EXPECT_TRUE(absl::StrContains(log, "program process 0 of 2, devices 0,1")) << log;
  result = ReadAttemptResult(files.result);
  ASSERT_TRUE(result.ok()) << result.status() << "\n" << log;
  EXPECT_EQ(result->job_id(), sdk.job_id());
  EXPECT_EQ(result->state(), v1::RUNNER_STATE_SUCCEEDED) << log;
  EXPECT_TRUE(fs::exists(files.started));

  // A plain executable: the JSON launch file and nothing else.
  log = LaunchAndWait(plain, &files);
  ExpectReadAsLaunched(WrittenBack(log, "plain: "), plain, files, log);
  EXPECT_TRUE(fs::exists(files.started)) << log;
}

TEST_F(LaunchContractTest, TheJobBinaryRefusesToRunWithoutALaunch) {
  const std::string log_path = dir_ + "/no-launch.log";
  ChildCommand command;
  command.binary = settings_.job_binary;
  command.argv = {"substrax-job", "run"};
  command.env = {"PATH=/usr/bin:/bin"};
  const int log = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  absl::StatusOr<pid_t> pid = StartChild(command, log);
  close(log);
  ASSERT_TRUE(pid.ok()) << pid.status();
  const std::optional<int> status = testing::WaitOrKill(*pid, absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(*status, 2);
  EXPECT_TRUE(absl::StrContains(ReadFile(log_path), "SUBSTRAX_LAUNCH is not set"))
      << ReadFile(log_path);
}

}  // namespace
}  // namespace substrax
