// A job's process runs as the user the agent is told (--job-user), from a clean environment,
// and cannot read the worker's key: real binaries (a coordinator and an agent over mutual TLS,
// substraxctl), a user this test creates and removes, and an agent started with hostile
// variables in its own environment (BASH_ENV, LD_PRELOAD, PYTHONPATH, a secret). The program
// writes what it sees: its uid and groups, its whole environment, whether it can read the
// worker's key, list the agent's work dir and read its own launch file.
//
// Needs root (to create a user and switch to it): skipped otherwise, except under CI=true,
// where it fails.
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/credentials.h"
#include "tests/proc.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string Trimmed(const std::string& path) {
  return std::string(absl::StripAsciiWhitespace(ReadFile(path)));
}

// What the program writes into its first argument's directory.
constexpr char kProgram[] = R"(#!/bin/sh
out="$1"
id -u > "$out/uid.tmp" && mv "$out/uid.tmp" "$out/uid"
id -G > "$out/groups"
pwd > "$out/cwd"
env > "$out/env"
if cat "$2" > /dev/null 2>&1; then echo readable; else echo refused; fi > "$out/key"
if ls "$3" > /dev/null 2>&1; then echo listed; else echo refused; fi > "$out/work-dir"
if cat "$SUBSTRAX_LAUNCH" > /dev/null 2>&1; then echo readable; else echo refused; fi > "$out/launch"
cat "$SUBSTRAX_LAUNCH" > "$out/launch.json" 2>&1
touch "$out/done"
exit 3
)";

// Written where the agent's BASH_ENV points: a shell that read it would leave this mark.
constexpr char kBashEnv[] = "#!/bin/sh\ntouch \"$(dirname \"$0\")/bash-env-ran\"\n";

class JobUserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) {
      if (InCi()) {
        FAIL() << "this test needs root (it creates a user and runs a job as it); CI runs as root";
      }
      GTEST_SKIP() << "needs root: it creates a user and runs a job as it";
    }
    // Not under TEST_TMPDIR (/root/... is closed to other users): the job user must reach the
    // work dir and the programs.
    char pattern[] = "/tmp/substrax-job-user-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    chmod(dir_.c_str(), 0755);
    user_ = absl::StrCat("sxjob", getpid());
    CommandResult added =
        testing::Run({"/usr/sbin/useradd", "--system", "--no-create-home", "--home-dir",
                      "/nonexistent", "--shell", "/usr/sbin/nologin", user_},
                     absl::Seconds(30));
    ASSERT_EQ(added.exit_code, 0) << added.out << added.err;
    user_added_ = true;
    CommandResult uid = testing::Run({"/usr/bin/id", "-u", user_}, absl::Seconds(10));
    uid_ = std::string(absl::StripAsciiWhitespace(uid.out));

    pki_ = std::make_unique<TestPki>(dir_ + "/tls");
    admin_ = pki_->Issue("admin", "admin");
    worker_ = pki_->Issue("w-1", "worker");
    programs_ = dir_ + "/programs";
    out_ = dir_ + "/out";
    fs::create_directories(programs_);
    fs::create_directories(out_);
    chmod(out_.c_str(), 0777);  // the job user writes here
    std::ofstream(programs_ + "/probe.sh") << kProgram;
    chmod((programs_ + "/probe.sh").c_str(), 0755);
    std::ofstream(dir_ + "/bash-env.sh") << kBashEnv;
    chmod((dir_ + "/bash-env.sh").c_str(), 0755);
    StartCoordinator();
  }

  void TearDown() override {
    for (Process* p : {agent_.get(), coordinator_.get()}) {
      if (p != nullptr && p->Running()) {
        p->Signal(SIGTERM);
        p->Wait(absl::Seconds(30));
      }
    }
    if (!dir_.empty()) {
      EXPECT_TRUE(PollUntil([&] { return ProcessesMentioning(dir_).empty(); },
                            absl::Seconds(10)))
          << "processes outlived the test under " << dir_;
    }
    if (user_added_) {
      CommandResult removed = testing::Run({"/usr/sbin/userdel", user_}, absl::Seconds(30));
      EXPECT_EQ(removed.exit_code, 0) << removed.out << removed.err;
    }
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void StartCoordinator() {
    std::vector<std::string> argv = {Runfile("coordinator/substrax-coordinator"), "--listen",
                                     "127.0.0.1:0", "--metrics-listen", "", "--state-dir",
                                     dir_ + "/state", "--address-file", dir_ + "/address"};
    for (std::string& flag : pki_->CoordinatorFlags()) argv.push_back(std::move(flag));
    coordinator_ = std::make_unique<Process>(argv, dir_ + "/coordinator.log");
    ASSERT_TRUE(PollUntil([&] { return !Trimmed(dir_ + "/address").empty(); },
                          absl::Seconds(30)))
        << coordinator_->Log();
    address_ = Trimmed(dir_ + "/address");
  }

  // The agent's command line with --job-user `user`.
  std::vector<std::string> AgentArgv(const std::string& user) {
    std::vector<std::string> argv = {Runfile("agent/substrax-agent"), "--coordinator", address_,
                                     "--cpu-devices", "1", "--worker-id", "w-1", "--host",
                                     "host-a", "--work-dir", dir_ + "/work", "--programs-dir",
                                     programs_, "--job-user", user};
    for (std::string& flag : TestPki::Flags(worker_)) argv.push_back(std::move(flag));
    return argv;
  }

  CommandResult Ctl(std::vector<std::string> args) {
    std::vector<std::string> argv = {Runfile("client/substraxctl"), "--coordinator", address_};
    for (std::string& flag : TestPki::Flags(admin_)) argv.push_back(std::move(flag));
    argv.insert(argv.end(), args.begin(), args.end());
    return testing::Run(argv, absl::Seconds(60));
  }

  std::string WriteJob(const std::string& name, const std::string& env) {
    const std::string path = absl::StrCat(dir_, "/", name, ".yaml");
    std::ofstream(path) << "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: " << name
                        << "}\nspec:\n  program:\n    path: " << programs_
                        << "/probe.sh\n    args: [" << out_ << ", " << worker_.key_file << ", "
                        << dir_ << "/work]\n    env: " << env
                        << "\n  mesh: {data_parallel_size: 1}\n";
    return path;
  }

  std::string Logs() {
    std::string all = "--- coordinator ---\n" + coordinator_->Log();
    if (agent_ != nullptr) absl::StrAppend(&all, "\n--- agent ---\n", agent_->Log());
    return all;
  }

  std::string dir_, user_, uid_, programs_, out_, address_;
  bool user_added_ = false;
  std::unique_ptr<TestPki> pki_;
  TransportOptions admin_, worker_;
  std::unique_ptr<Process> coordinator_;
  std::unique_ptr<Process> agent_;
};

TEST_F(JobUserTest, AProgramRunsAsTheJobUserWithACleanEnvironmentAndNoWorkerKey) {
  // Hostile variables in the agent's own environment, and a secret of it: none reaches a job.
  agent_ = std::make_unique<Process>(
      AgentArgv(user_), dir_ + "/agent.log",
      std::vector<std::string>{absl::StrCat("BASH_ENV=", dir_, "/bash-env.sh"),
                               "ENV=" + dir_ + "/bash-env.sh",
                               "LD_PRELOAD=" + dir_ + "/no-such-library.so",
                               "PYTHONPATH=" + dir_ + "/python", "AGENT_SECRET=the-agents"});
  ASSERT_TRUE(PollUntil(
      [&] {
        return Ctl({"workers", "-o", "json"}).out.find("WORKER_STATE_ALIVE") != std::string::npos;
      },
      absl::Seconds(30)))
      << Logs();

  // Refused at submit, naming the variable (substraxctl checks the denied names as the
  // coordinator does; coordinator/cluster_submit_test has the coordinator's table).
  CommandResult refused = Ctl({"submit", WriteJob("hostile", "{LD_PRELOAD: /tmp/x.so}")});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.out + refused.err,
              HasSubstr("spec.program.env.LD_PRELOAD: denied: the dynamic loader"));

  CommandResult submitted = Ctl({"submit", WriteJob("probe", "{JOB_SETTING: mine}")});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err << Logs();
  ASSERT_TRUE(PollUntil([&] { return fs::exists(out_ + "/done"); }, absl::Seconds(60)))
      << Logs();

  EXPECT_EQ(Trimmed(out_ + "/uid"), uid_);
  EXPECT_THAT(" " + Trimmed(out_ + "/groups") + " ", Not(HasSubstr(" 0 ")));
  EXPECT_EQ(Trimmed(out_ + "/key"), "refused");
  EXPECT_EQ(Trimmed(out_ + "/work-dir"), "refused");
  EXPECT_EQ(Trimmed(out_ + "/launch"), "readable");
  // What the launch file hands it: its attempt's token, no worker certificate, key or token.
  // (The spec's args name the key, for the probe: only the transport is looked at.)
  const std::string launch = ReadFile(out_ + "/launch.json");
  const size_t transport_at = launch.find("\"transport\":{");
  ASSERT_NE(transport_at, std::string::npos) << launch;
  const std::string transport =
      launch.substr(transport_at, launch.find('}', transport_at) - transport_at);
  EXPECT_THAT(transport, HasSubstr("\"attempt_token\":\"sxa1."));
  for (const std::string& worker_file : {worker_.key_file, worker_.cert_file}) {
    EXPECT_THAT(transport, Not(HasSubstr(worker_file))) << transport;
  }
  EXPECT_THAT(launch, Not(HasSubstr("key_file")));
  EXPECT_THAT(launch, Not(HasSubstr("cert_file")));
  EXPECT_THAT(launch, Not(HasSubstr("token_file")));
  EXPECT_FALSE(fs::exists(dir_ + "/bash-env-ran"));

  // The whole environment: the documented base, the spec's variable, the launch file; and what
  // the shell itself adds (PWD).
  std::map<std::string, std::string> env;
  for (absl::string_view line : absl::StrSplit(ReadFile(out_ + "/env"), '\n', absl::SkipEmpty())) {
    const size_t equals = line.find('=');
    env[std::string(line.substr(0, equals))] =
        equals == absl::string_view::npos ? "" : std::string(line.substr(equals + 1));
  }
  const std::set<std::string> expected = {"PATH", "HOME", "USER", "LOGNAME", "LANG",
                                          "JOB_SETTING", "SUBSTRAX_LAUNCH", "PWD"};
  for (const auto& [name, value] : env) {
    EXPECT_TRUE(expected.count(name) == 1) << "the job saw " << name << "=" << value;
  }
  EXPECT_EQ(env["PATH"], "/usr/local/bin:/usr/bin:/bin");
  EXPECT_EQ(env["USER"], user_);
  EXPECT_EQ(env["HOME"], "/nonexistent");
  EXPECT_EQ(env["JOB_SETTING"], "mine");
  EXPECT_THAT(env["SUBSTRAX_LAUNCH"], HasSubstr(dir_ + "/work/"));
  EXPECT_THAT(env["SUBSTRAX_LAUNCH"], HasSubstr(".job/launch"));

  // The work dir: search only for the job user; the attempt's directory is its own, 0700.
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/work").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0711u);
  const std::string job_dir = fs::path(env["SUBSTRAX_LAUNCH"]).parent_path().string();
  ASSERT_EQ(stat(job_dir.c_str(), &st), 0);
  EXPECT_EQ(std::to_string(st.st_uid), uid_);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  // It starts there, not in the agent's working directory.
  EXPECT_EQ(Trimmed(out_ + "/cwd"), job_dir);
}

// A command job (spec.command) under --job-user: its launcher and its process run as the job
// user (the agent needs neither --allow-command-jobs nor anything else), cannot read the worker's
// key, get the contract and no launch file.
TEST_F(JobUserTest, ACommandRunsAsTheJobUserWithTheContractAndNoCredential) {
  // The launcher (`substrax-job command`) runs as the job user: its binary must be one the job
  // user may execute, as an installed one is (the test's runfiles are root's).
  const std::string job_binary = dir_ + "/substrax-job";
  fs::copy_file(Runfile("worker/substrax-job"), job_binary);
  chmod(job_binary.c_str(), 0755);
  std::vector<std::string> argv = AgentArgv(user_);
  argv.insert(argv.end(), {"--job-binary", job_binary});
  agent_ = std::make_unique<Process>(argv, dir_ + "/agent.log");
  ASSERT_TRUE(PollUntil(
      [&] {
        return Ctl({"workers", "-o", "json"}).out.find("WORKER_STATE_ALIVE") != std::string::npos;
      },
      absl::Seconds(30)))
      << Logs();
  const std::string path = dir_ + "/command.yaml";
  std::ofstream(path) << "apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: command}\n"
                      << "spec:\n  command:\n    argv: [" << programs_ << "/probe.sh, " << out_
                      << ", " << worker_.key_file << ", " << dir_
                      << "/work]\n  mesh: {data_parallel_size: 1}\n";
  CommandResult submitted = Ctl({"submit", path});
  ASSERT_EQ(submitted.exit_code, 0) << submitted.err << Logs();
  const std::vector<std::string> words =
      absl::StrSplit(absl::StripAsciiWhitespace(submitted.out), ' ');
  const std::string id = words.back();
  ASSERT_TRUE(PollUntil([&] { return fs::exists(out_ + "/done"); }, absl::Seconds(60)))
      << Logs();
  EXPECT_EQ(Trimmed(out_ + "/uid"), uid_);
  EXPECT_EQ(Trimmed(out_ + "/key"), "refused");
  EXPECT_EQ(Trimmed(out_ + "/work-dir"), "refused");
  const std::string env = ReadFile(out_ + "/env");
  EXPECT_THAT(env, Not(HasSubstr("SUBSTRAX_LAUNCH=")));
  EXPECT_THAT(env, Not(HasSubstr("sxa1.")));
  EXPECT_THAT(env, HasSubstr("\nRANK=0\n"));
  EXPECT_THAT(env, HasSubstr("\nSUBSTRAX_REPORT_FILE=" + dir_ + "/work/"));
  // The probe exits 3: the job fails naming its rank.
  ASSERT_TRUE(PollUntil(
      [&] {
        return Ctl({"get", id, "-o", "json"}).out.find("JOB_STATE_FAILED") != std::string::npos;
      },
      absl::Seconds(60)))
      << Logs();
  EXPECT_THAT(Ctl({"get", id, "-o", "json"}).out, HasSubstr("exited with status 3"));
}

TEST_F(JobUserTest, TheAgentRefusesToStartForAUserThatDoesNotExist) {
  CommandResult r = testing::Run(AgentArgv("no-such-user-substrax"), absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--job-user no-such-user-substrax: no such user on this host"));
  r = testing::Run(AgentArgv("root"), absl::Seconds(30));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--job-user root is root (uid 0)"));
}

}  // namespace
}  // namespace substrax::testing
