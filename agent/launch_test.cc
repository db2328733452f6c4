#include "agent/launch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "contract/launch.h"
#include "agent/test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

LaunchSettings Settings(const std::string& programs_dir) {
  LaunchSettings settings;
  settings.worker_id = "w1";
  settings.host = "h1";
  settings.coordinator = "127.0.0.1:7070";
  settings.transport.ca_file = "/etc/ca.pem";
  settings.transport.cert_file = "/etc/w1.pem";
  settings.transport.key_file = "/etc/w1.key";
  settings.transport.token_file = "/etc/w1.token";
  settings.transport.server_name = "coordinator.example";
  settings.transport.reload_interval = absl::Seconds(30);
  settings.listen_host = "10.0.0.1";
  settings.collective_timeout = absl::Seconds(20);
  settings.data_roots = {"/data"};
  settings.checkpoint_roots = {"/ckpt"};
  if (!programs_dir.empty()) settings.programs_dirs = {programs_dir};
  settings.job_binary = "/usr/bin/substrax-job";
  return settings;
}

v1::Assignment ProgramAssignment(const std::string& path) {
  v1::Assignment a;
  a.set_job_id("prog-1");
  a.set_attempt(2);
  a.set_process_index(1);
  a.set_rendezvous_secret("rendezvous-secret");
  a.set_attempt_token("sxa1.prog-1.2.1.0123456789abcdef");
  a.mutable_spec()->mutable_program()->set_path(path);
  a.mutable_spec()->mutable_program()->add_args("--lr");
  a.mutable_spec()->mutable_program()->add_args("0.1");
  (*a.mutable_spec()->mutable_program()->mutable_env())["JOB_VAR"] = "mine";
  return a;
}

TEST(LaunchTest, TheLaunchFileNamesEverythingTheProcessNeeds) {
  const std::string dir = TempDir("launch_file");
  const v1::Assignment a = ProgramAssignment("/opt/p/train");
  const AttemptFiles files = FilesOfAttempt(dir, a);
  EXPECT_EQ(files.launch, dir + "/prog-1-attempt-2-process-1.launch");
  EXPECT_EQ(files.started, dir + "/prog-1-attempt-2-process-1.started");
  std::ofstream(files.started) << "";  // stale, from an earlier daemon
  std::ofstream(files.result) << "stale";
  ASSERT_TRUE(WriteAttemptFiles(Settings("/opt/p"), a, files).ok());
  EXPECT_FALSE(fs::exists(files.started));
  EXPECT_FALSE(fs::exists(files.result));
  absl::StatusOr<v1::ProgramLaunch> read = ReadLaunchFile(files.launch);
  ASSERT_TRUE(read.ok()) << read.status();
  const v1::ProgramLaunch& launch = *read;
  // It holds the attempt's rendezvous secret: its owner's only.
  EXPECT_EQ(fs::status(files.launch).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(launch.sdk_version_major(), 1);
  EXPECT_EQ(launch.assignment().job_id(), "prog-1");
  EXPECT_EQ(launch.coordinator(), "127.0.0.1:7070");
  EXPECT_EQ(launch.transport().ca_file(), "/etc/ca.pem");
  EXPECT_EQ(launch.transport().server_name(), "coordinator.example");
  EXPECT_EQ(launch.transport().attempt_token(), "sxa1.prog-1.2.1.0123456789abcdef");
  EXPECT_EQ(launch.assignment().rendezvous_secret(), "rendezvous-secret");
  EXPECT_FALSE(launch.transport().insecure());
  EXPECT_EQ(FromProtoDuration(launch.transport().reload_interval()), absl::Seconds(30));
  EXPECT_EQ(launch.listen_host(), "10.0.0.1");
  EXPECT_EQ(FromProtoDuration(launch.collective_timeout()), absl::Seconds(20));
  EXPECT_THAT(launch.data_roots(), ElementsAre("/data"));
  EXPECT_THAT(launch.checkpoint_roots(), ElementsAre("/ckpt"));
  EXPECT_EQ(launch.result_path(), files.result);
  EXPECT_EQ(launch.started_path(), files.started);
  EXPECT_EQ(launch.activity_path(), files.activity);
  EXPECT_EQ(files.activity, dir + "/prog-1-attempt-2-process-1.activity");
  EXPECT_FALSE(fs::exists(dir + "/prog-1-attempt-2-process-1.assignment"));
}

TEST(LaunchTest, AJobBoundToItsOwnerGetsTheOwnersDirectoryOfEachRootAsItsRoots) {
  LaunchSettings settings = Settings("/opt/p");
  settings.checkpoint_roots = {"/ckpt", "/scratch"};
  v1::Assignment a = ProgramAssignment("/opt/p/train");
  const AttemptFiles files = FilesOfAttempt("/work", a);
  EXPECT_THAT(MakeProgramLaunch(settings, a, files).checkpoint_roots(),
              ElementsAre("/ckpt", "/scratch"));
  a.set_checkpoint_owner_directory("alice");
  EXPECT_THAT(MakeProgramLaunch(settings, a, files).checkpoint_roots(),
              ElementsAre("/ckpt/alice", "/scratch/alice"));
  // A name that would leave the roots (the coordinator never sends one) gets no root at all.
  for (const char* bad : {"..", "../bob", "a/b"}) {
    a.set_checkpoint_owner_directory(bad);
    EXPECT_THAT(MakeProgramLaunch(settings, a, files).checkpoint_roots(), ::testing::IsEmpty())
        << bad;
  }
}

// The process gets what verifies the coordinator and its attempt's own token, never the
// daemon's identity: no certificate, key or token file of the worker, in any field.
TEST(LaunchTest, TheLaunchFileHoldsNoWorkerCredential) {
  const std::string dir = TempDir("launch_no_worker_identity");
  const v1::Assignment a = ProgramAssignment("/opt/p/train");
  const AttemptFiles files = FilesOfAttempt(dir, a);
  ASSERT_TRUE(WriteAttemptFiles(Settings("/opt/p"), a, files).ok());
  std::ifstream in(files.launch);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* daemons : {"/etc/w1.pem", "/etc/w1.key", "/etc/w1.token", "cert_file",
                              "key_file", "token_file"}) {
    EXPECT_FALSE(absl::StrContains(text, daemons)) << daemons << " in " << text;
  }
  // The attempt token is there once, in the transport.
  absl::StatusOr<v1::ProgramLaunch> launch = ReadLaunchFile(files.launch);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->transport().attempt_token(), a.attempt_token());
  EXPECT_EQ(launch->assignment().attempt_token(), "");
}

TEST(LaunchTest, AProgramRunsWithItsArgumentsAndEnvironmentAndTheLaunchFile) {
  const std::string dir = TempDir("program_command");
  WriteScript(dir + "/train");
  const v1::Assignment a = ProgramAssignment(dir + "/train");
  const AttemptFiles files = FilesOfAttempt(dir, a);
  setenv("JOB_VAR", "the daemon's", 1);
  setenv("BASH_ENV", "/tmp/the-daemons-bash-env", 1);
  setenv("OPENBLAS_NUM_THREADS", "3", 1);
  LaunchSettings settings = Settings(dir);
  settings.job_user.name = "trainer";
  settings.job_user.home = "/home/trainer";
  settings.job_env_pass = {"OPENBLAS_NUM_THREADS", "NOT_SET_IN_THE_AGENT"};
  absl::StatusOr<ChildCommand> command = BuildCommand(settings, a, files);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->binary, fs::canonical(dir + "/train").string());
  EXPECT_THAT(command->argv, ElementsAre(dir + "/train", "--lr", "0.1"));
  // The fixed base, what the operator passes, the spec's, the launch: nothing else of the
  // agent's own environment.
  EXPECT_THAT(command->env,
              ElementsAre("PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/home/trainer",
                          "USER=trainer", "LOGNAME=trainer", "LANG=C.UTF-8",
                          "OPENBLAS_NUM_THREADS=3", "JOB_VAR=mine",
                          "SUBSTRAX_LAUNCH=" + files.launch));
  EXPECT_FALSE(command->credentials.has_value());

  // The built-in trainer: `substrax-job run` and nothing else; its launch comes the same way.
  v1::Assignment builtin = a;
  builtin.mutable_spec()->clear_program();
  command = BuildCommand(settings, builtin, files);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->binary, "/usr/bin/substrax-job");
  EXPECT_THAT(command->argv, ElementsAre("substrax-job", "run"));
  EXPECT_THAT(command->env, ::testing::Not(::testing::Contains(HasSubstr("BASH_ENV"))));
  EXPECT_THAT(command->env, ::testing::Not(::testing::Contains(HasSubstr("JOB_VAR"))));
  EXPECT_EQ(command->env.back(), "SUBSTRAX_LAUNCH=" + files.launch);
  unsetenv("BASH_ENV");
}

// An assignment the coordinator never validated (an old or impostor coordinator): the agent
// starts nothing with a start-up variable or one it sets itself.
TEST(LaunchTest, TheAgentRefusesVariablesNoJobMaySet) {
  const std::string dir = TempDir("refused_env");
  WriteScript(dir + "/train");
  for (const char* name : {"LD_PRELOAD", "BASH_ENV", "PYTHONPATH", "PATH", "NODE_OPTIONS",
                           "SUBSTRAX_LAUNCH", "HOME", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR",
                           "NCCL_NET_PLUGIN", "BAD-NAME"}) {
    v1::Assignment a = ProgramAssignment(dir + "/train");
    (*a.mutable_spec()->mutable_program()->mutable_env())[name] = "/tmp/x";
    absl::StatusOr<ChildCommand> command = BuildCommand(Settings(dir), a, FilesOfAttempt(dir, a));
    EXPECT_EQ(command.status().code(), absl::StatusCode::kFailedPrecondition) << name;
    EXPECT_THAT(std::string(command.status().message()),
                HasSubstr(absl::StrCat("job prog-1 attempt 2: spec.program.env.", name,
                                       " refused on host h1 (worker w1): ")))
        << name;
  }
  v1::Assignment a = ProgramAssignment(dir + "/train");
  (*a.mutable_spec()->mutable_program()->mutable_env())["LD_PRELOAD"] = "/tmp/x.so";
  EXPECT_THAT(std::string(BuildCommand(Settings(dir), a, FilesOfAttempt(dir, a))
                              .status()
                              .message()),
              HasSubstr("denied: the dynamic loader"));
}

TEST(LaunchTest, ChildEnvironmentTakesOnlyThePassedVariablesAndTheLastValueOfEach) {
  char a[] = "A=1", b[] = "B=2", c[] = "C", e[] = "E=x=y";
  char* environment[] = {a, b, c, e, nullptr};
  EXPECT_THAT(ChildEnvironment({{"Z", "0"}, {"B", "base"}}, environment, {"B", "C", "E", "Q"},
                               {{"B", "3"}, {"D", "4"}, {"B", "5"}}),
              ElementsAre("Z=0", "B=5", "E=x=y", "D=4"));
  EXPECT_THAT(ChildEnvironment({}, environment, {}, {}), ::testing::IsEmpty());
}

// With a job user, the process's files lie in a directory of its own, 0700, given to it.
TEST(LaunchTest, AJobUsersFilesLieInItsOwnDirectory) {
  const std::string dir = TempDir("job_dir");
  const v1::Assignment a = ProgramAssignment("/opt/p/train");
  const AttemptFiles files = FilesOfAttempt(dir, a, /*own_dir=*/true);
  EXPECT_EQ(files.job_dir, dir + "/prog-1-attempt-2-process-1.job");
  EXPECT_EQ(files.launch, files.job_dir + "/launch");
  EXPECT_EQ(files.result, files.job_dir + "/result");
  EXPECT_EQ(files.started, files.job_dir + "/started");
  EXPECT_EQ(files.log, dir + "/prog-1-attempt-2-process-1.log");
  // Left by an earlier process: a link named like the launch file is not written through.
  fs::create_directories(files.job_dir);
  std::ofstream(dir + "/target") << "agent's";
  fs::create_symlink(dir + "/target", files.launch);
  LaunchSettings settings = Settings("/opt/p");
  settings.switch_user = true;
  settings.job_user = CurrentUser();  // chown to oneself works for anyone
  ASSERT_TRUE(WriteAttemptFiles(settings, a, files).ok());
  EXPECT_EQ(fs::status(files.job_dir).permissions() & fs::perms::all, fs::perms::owner_all);
  EXPECT_FALSE(fs::is_symlink(files.launch));
  EXPECT_TRUE(ReadLaunchFile(files.launch).ok());
  std::ifstream target(dir + "/target");
  std::string contents;
  std::getline(target, contents);
  EXPECT_EQ(contents, "agent's");
  // The built-in trainer's command runs as the job user, from that directory.
  v1::Assignment builtin = a;
  builtin.mutable_spec()->clear_program();
  absl::StatusOr<ChildCommand> command = BuildCommand(settings, builtin, files);
  ASSERT_TRUE(command.ok()) << command.status();
  ASSERT_TRUE(command->credentials.has_value());
  EXPECT_EQ(command->credentials->uid, settings.job_user.uid);
  EXPECT_EQ(command->credentials->working_dir, files.job_dir);
  EXPECT_THAT(command->env, ::testing::Contains("SUBSTRAX_LAUNCH=" + files.job_dir + "/launch"));
}

TEST(LaunchTest, ResolveJobUserRefusesUnknownUsersAndRoot) {
  absl::StatusOr<JobUser> unknown = ResolveJobUser("no-such-user-substrax");
  if (geteuid() != 0) {
    // Not root: refused before the user is even looked up.
    EXPECT_EQ(unknown.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(unknown.status().message()),
                HasSubstr("cannot run jobs as another user: it lacks CAP_CHOWN"));
    return;
  }
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("--job-user no-such-user-substrax: no such user on this host"));
  EXPECT_THAT(std::string(ResolveJobUser("root").status().message()),
              HasSubstr("is root (uid 0)"));
  absl::StatusOr<JobUser> nobody = ResolveJobUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  EXPECT_NE(nobody->uid, 0u);
  EXPECT_THAT(nobody->groups, ::testing::Contains(nobody->gid));
}

// The credential switch happens in the child: it runs as the job user, or not at all.
TEST(LaunchTest, StartChildRunsTheChildAsTheJobUser) {
  if (geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  absl::StatusOr<JobUser> nobody = ResolveJobUser("nobody");
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  const std::string dir = TempDir("child_user");
  const std::string log = dir + "/out.log";
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ChildCommand command;
  command.binary = "/bin/sh";
  command.argv = {"sh", "-c", "echo \"$(id -u) $(id -g) $(id -G) in $(pwd)\""};
  command.env = {"PATH=/usr/bin:/bin"};
  command.credentials =
      ChildCredentials{nobody->uid, nobody->gid, nobody->groups, nobody->name, "/"};
  absl::StatusOr<pid_t> pid = StartChild(command, fd);
  close(fd);
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  EXPECT_THAT(line, ::testing::StartsWith(absl::StrCat(nobody->uid, " ", nobody->gid, " ")));
  EXPECT_THAT(line, ::testing::Not(HasSubstr(" 0 ")));
  EXPECT_THAT(line, ::testing::EndsWith(" in /"));
}

TEST(LaunchTest, ProgramChecksNameThePathTheHostAndTheReason) {
  const std::string dir = TempDir("program_checks");
  const std::string programs = dir + "/programs";
  fs::create_directories(programs);
  const LaunchSettings settings = Settings(programs);

  absl::StatusOr<std::string> missing = CheckProgram(settings, programs + "/train");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(missing.status().message(),
            absl::StrCat("program ", programs, "/train not found on host h1 (worker w1): No such "
                         "file or directory; programs run from --programs-dir ", programs));

  WriteScript(dir + "/outside");
  fs::create_symlink(dir + "/outside", programs + "/escape");
  absl::StatusOr<std::string> escape = CheckProgram(settings, programs + "/escape");
  EXPECT_THAT(std::string(escape.status().message()),
              HasSubstr(absl::StrCat("resolves to ", dir, "/outside on host h1 (worker w1), "
                                     "outside every programs dir")));

  // A relative symlink that stays inside is followed.
  WriteScript(programs + "/real");
  fs::create_symlink("real", programs + "/inside");
  EXPECT_TRUE(CheckProgram(settings, programs + "/inside").ok());

  fs::create_directories(programs + "/subdir");
  EXPECT_THAT(std::string(CheckProgram(settings, programs + "/subdir").status().message()),
              HasSubstr("is not a regular file (a directory)"));

  WriteScript(programs + "/plain", 0644);
  if (geteuid() != 0) {  // root may execute anything with an x bit; 0644 has none either way
    EXPECT_THAT(std::string(CheckProgram(settings, programs + "/plain").status().message()),
                HasSubstr("is not executable by the worker daemon: Permission denied"));
  }

  EXPECT_THAT(std::string(CheckProgram(settings, "/usr/bin/env").status().message()),
              HasSubstr("program /usr/bin/env is not under a programs dir on host h1 (worker w1)"));
  EXPECT_THAT(std::string(CheckProgram(Settings(""), "/usr/bin/env").status().message()),
              HasSubstr("this worker has no --programs-dir, so it runs no programs"));
}

TEST(LaunchTest, StartChildRunsTheCommandWithItsEnvironmentIntoTheLog) {
  const std::string dir = TempDir("start_child");
  const std::string log = dir + "/out.log";
  const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ChildCommand command;
  command.binary = "/bin/sh";
  command.argv = {"sh", "-c", "echo \"$GREETING $0\"; exit 7"};
  command.env = {"GREETING=hello"};
  absl::StatusOr<pid_t> pid = StartChild(command, fd);
  close(fd);
  ASSERT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 7);
  std::ifstream in(log);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "hello sh");
}

}  // namespace
}  // namespace substrax
