#include "agent/command_launch.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/test_files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// An agent that runs command jobs as its own user, with one programs dir and one environment.
LaunchSettings Settings(const std::string& programs, const std::string& env_dir) {
  LaunchSettings s;
  s.worker_id = "w1";
  s.host = "h1";
  s.programs_dirs = {programs};
  s.python_envs = {{"venv", env_dir}};
  s.allow_command_jobs = true;
  s.job_binary = "/usr/bin/substrax-job";
  s.command_port_first = 29500;
  s.command_port_last = 29599;
  s.stop_grace = absl::Seconds(7);
  s.agent_cuda_visible_devices = {"2", "3"};
  return s;
}

v1::Assignment CommandAssignment(std::vector<std::string> argv, const std::string& python_env) {
  v1::Assignment a;
  a.set_job_id("cmd-1");
  a.set_attempt(1);
  v1::CommandSpec* c = a.mutable_spec()->mutable_command();
  for (const std::string& arg : argv) c->add_argv(arg);
  c->set_python_env(python_env);
  (*c->mutable_env())["OMP_NUM_THREADS"] = "1";
  return a;
}

struct Dirs {
  std::string programs, env;
};

Dirs MakeDirs(const std::string& name) {
  const std::string dir = TempDir(name);
  Dirs d{dir + "/programs", dir + "/venv"};
  fs::create_directories(d.programs);
  fs::create_directories(d.env + "/bin");
  WriteScript(d.programs + "/train.sh");
  WriteScript(d.env + "/bin/torchrun");
  WriteScript(d.env + "/bin/not-executable", 0644);
  // A venv's interpreter is a link out of the environment: followed.
  fs::create_symlink("/bin/sh", d.env + "/bin/python");
  return d;
}

TEST(CommandLaunchTest, PythonEnvFlagsAreNamedDirectoriesWithABin) {
  const Dirs d = MakeDirs("python_env_flags");
  absl::StatusOr<std::pair<std::string, std::string>> ok =
      ParsePythonEnv(absl::StrCat("jax=", d.env, "/"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->first, "jax");
  EXPECT_EQ(ok->second, d.env);
  EXPECT_TRUE(ParsePythonEnv("system=/usr").ok());
  for (const std::string& bad : {std::string("jax"), std::string("=/usr"),
                                 std::string("a/b=/usr"), std::string("jax=relative"),
                                 absl::StrCat("jax=", d.programs)}) {
    absl::StatusOr<std::pair<std::string, std::string>> r = ParsePythonEnv(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
    EXPECT_THAT(r.status().message(), HasSubstr("--python-env")) << bad;
  }
  EXPECT_THAT(ParsePythonEnv(absl::StrCat("jax=", d.programs)).status().message(),
              HasSubstr("/bin is not a directory"));
}

TEST(CommandLaunchTest, AnAgentRunsCommandsOnlyAsAJobUserOrWhenAllowed) {
  const Dirs d = MakeDirs("runs_commands");
  LaunchSettings s = Settings(d.programs, d.env);
  const v1::Assignment a = CommandAssignment({d.programs + "/train.sh"}, "");
  EXPECT_TRUE(CheckRunsCommands(s, a).ok());
  s.allow_command_jobs = false;
  absl::Status refused = CheckRunsCommands(s, a);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused));
  EXPECT_THAT(refused.message(), HasSubstr("job cmd-1 is a command job, but the agent on host h1 "
                                           "(worker w1) runs no command jobs"));
  EXPECT_THAT(refused.message(), HasSubstr("--job-user USER"));
  EXPECT_THAT(refused.message(), HasSubstr("--allow-command-jobs"));
  const AttemptFiles files = FilesOfAttempt(TempDir("runs_commands_work"), a, true);
  EXPECT_TRUE(absl::IsFailedPrecondition(BuildCommand(s, a, files).status()));
  EXPECT_TRUE(absl::IsFailedPrecondition(PrepareCommandLaunch(s, a, files).status()));
  s.switch_user = true;  // --job-user
  EXPECT_TRUE(CheckRunsCommands(s, a).ok());
}

TEST(CommandLaunchTest, TheExecutableComesFromTheProgramsDirsOrTheNamedEnvironment) {
  const Dirs d = MakeDirs("executable");
  const LaunchSettings s = Settings(d.programs, d.env);
  v1::CommandSpec c;
  c.add_argv(d.programs + "/train.sh");
  absl::StatusOr<std::string> path = ResolveCommandExecutable(s, c);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, fs::canonical(d.programs + "/train.sh").string());

  c.set_argv(0, "/bin/true");
  EXPECT_THAT(ResolveCommandExecutable(s, c).status().message(),
              HasSubstr("spec.command.argv[0]: program /bin/true is not under a programs dir"));

  c.set_python_env("venv");
  c.set_argv(0, "torchrun");
  path = ResolveCommandExecutable(s, c);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, d.env + "/bin/torchrun");
  c.set_argv(0, "python");  // a link to /bin/sh: the environment's own, followed
  path = ResolveCommandExecutable(s, c);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, d.env + "/bin/python");

  c.set_argv(0, "absent");
  EXPECT_THAT(ResolveCommandExecutable(s, c).status().message(),
              HasSubstr("spec.command.argv[0] 'absent' not found in python_env venv on host h1"));
  c.set_argv(0, "not-executable");
  EXPECT_THAT(ResolveCommandExecutable(s, c).status().message(),
              HasSubstr("is not an executable file"));
  c.set_argv(0, "../bin/torchrun");
  EXPECT_THAT(ResolveCommandExecutable(s, c).status().message(),
              HasSubstr("argv[0] is a plain name of a file in the environment's bin/"));
  c.set_argv(0, "python");
  c.set_python_env("conda");
  absl::Status unknown = ResolveCommandExecutable(s, c).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(unknown));
  EXPECT_THAT(unknown.message(), HasSubstr("spec.command.python_env 'conda' is not registered on "
                                           "host h1 (worker w1); this worker's --python-env: "
                                           "venv=" + d.env));
}

TEST(CommandLaunchTest, TheLaunchStartsTheLauncherWithTheCommandPartAndTheSpecEnv) {
  const Dirs d = MakeDirs("launcher");
  const LaunchSettings s = Settings(d.programs, d.env);
  v1::Assignment a = CommandAssignment({"torchrun", "train.py"}, "venv");
  const AttemptFiles files = FilesOfAttempt(TempDir("launcher_work"), a, /*own_dir=*/true);
  absl::StatusOr<v1::CommandLaunch> launch = PrepareCommandLaunch(s, a, files);
  ASSERT_TRUE(launch.ok()) << launch.status();
  EXPECT_EQ(launch->executable(), d.env + "/bin/torchrun");
  EXPECT_EQ(launch->working_dir(), files.job_dir);
  EXPECT_EQ(launch->attempt_dir(), files.job_dir);
  EXPECT_EQ(launch->port_range_first(), 29500);
  EXPECT_EQ(launch->port_range_last(), 29599);
  EXPECT_THAT(launch->agent_cuda_visible_devices(), ElementsAre("2", "3"));
  EXPECT_EQ(FromProtoDuration(launch->stop_grace()), absl::Seconds(7));
  a.mutable_spec()->mutable_command()->set_working_dir("/srv/job");
  EXPECT_EQ(PrepareCommandLaunch(s, a, files)->working_dir(), "/srv/job");
  // Without a directory of its own, no command process starts.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      PrepareCommandLaunch(s, a, FilesOfAttempt(TempDir("launcher_flat"), a)).status()));

  ASSERT_TRUE(WriteAttemptFiles(s, a, files, &*launch).ok());
  absl::StatusOr<ChildCommand> command = BuildCommand(s, a, files);
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(command->binary, "/usr/bin/substrax-job");
  EXPECT_THAT(command->argv, ElementsAre("substrax-job", "command"));
  EXPECT_THAT(command->env, ::testing::Contains("OMP_NUM_THREADS=1"));
  EXPECT_THAT(command->env, ::testing::Contains("SUBSTRAX_LAUNCH=" + files.launch));

  // A variable the coordinator should have refused is refused again here.
  (*a.mutable_spec()->mutable_command()->mutable_env())["LD_PRELOAD"] = "/x.so";
  absl::Status refused = BuildCommand(s, a, files).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(refused));
  EXPECT_THAT(refused.message(), HasSubstr("spec.command.env.LD_PRELOAD refused on host h1"));
}

}  // namespace
}  // namespace substrax
