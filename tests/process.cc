#include "tests/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace substrax::testing {
namespace {

int DecodeStatus(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

pid_t Spawn(const std::vector<std::string>& argv, const std::string& out_path,
            const std::string& err_path, const std::vector<std::string>& env) {
  std::vector<std::string> args = argv;
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::vector<std::string> envs = env;
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // nothing outlives the test
    setpgid(0, 0);
    const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = err_path == out_path ? out : open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, STDOUT_FILENO);
    dup2(err, STDERR_FILENO);
    for (std::string& e : envs) putenv(e.data());
    execv(cargs[0], cargs.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> InsecureFlags() { return {"--insecure"}; }

bool InCi() {
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string(ci) == "true";
}

std::string Runfile(const std::string& path) {
  // `bazel test` and `bazel run` start in the runfiles tree; a binary started by hand
  // (bazel-bin/bench/worker_fleet) finds it beside itself, in <binary>.runfiles/substrax.
  if (std::filesystem::exists(path)) return std::filesystem::absolute(path).string();
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::filesystem::path beside = self.string() + ".runfiles/substrax/" + path;
    if (std::filesystem::exists(beside)) return beside.string();
  }
  return std::filesystem::absolute(path).string();
}

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base ? base : "/tmp", "/", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

Process::Process(std::vector<std::string> argv, std::string log_path, std::vector<std::string> env)
    : log_path_(std::move(log_path)) {
  pid_ = Spawn(argv, log_path_, log_path_, env);
}

Process::~Process() {
  if (Running()) {
    kill(pid_, SIGKILL);
    Wait(absl::Seconds(10));
  }
}

void Process::Signal(int signal) {
  if (!status_.has_value()) kill(pid_, signal);
}

bool Process::Running() {
  if (status_.has_value()) return false;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = DecodeStatus(status);
    return false;
  }
  return true;
}

std::optional<int> Process::Wait(absl::Duration timeout) {
  PollUntil([this] { return !Running(); }, timeout);
  return status_;
}

std::string Process::Log() const { return ReadFile(log_path_); }

CommandResult Run(const std::vector<std::string>& argv, absl::Duration timeout,
                  const std::vector<std::string>& env) {
  static int counter = 0;
  const std::string base = TempDir(absl::StrCat("cmd-", getpid(), "-", counter++));
  const std::string out = base + "/out", err = base + "/err";
  const pid_t pid = Spawn(argv, out, err, env);
  CommandResult result;
  int status = 0;
  const bool done = PollUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; }, timeout);
  if (!done) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  } else {
    result.exit_code = DecodeStatus(status);
  }
  result.out = ReadFile(out);
  result.err = ReadFile(err);
  return result;
}

}  // namespace substrax::testing
