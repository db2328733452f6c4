#include "tests/proc.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace substrax::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

std::string CommandLine(pid_t pid) {
  std::string cmdline = ReadAll(absl::StrCat("/proc/", pid, "/cmdline"));
  for (char& c : cmdline) {
    if (c == '\0') c = ' ';
  }
  return cmdline;
}

char ProcessState(pid_t pid) {
  const std::string stat = ReadAll(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
}

pid_t ProcessGroup(pid_t pid) {
  const std::string stat = ReadAll(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  // After the command: state, ppid, pgrp.
  std::istringstream fields(stat.substr(paren + 2));
  std::string state;
  pid_t ppid = 0, pgrp = 0;
  fields >> state >> ppid >> pgrp;
  return pgrp;
}

std::string LaunchFileOf(pid_t pid) {
  const std::string environ = ReadAll(absl::StrCat("/proc/", pid, "/environ"));
  static constexpr char kPrefix[] = "SUBSTRAX_LAUNCH=";
  for (size_t at = 0; at < environ.size();) {
    const size_t end = std::min(environ.find('\0', at), environ.size());
    if (environ.compare(at, sizeof(kPrefix) - 1, kPrefix) == 0) {
      return environ.substr(at + sizeof(kPrefix) - 1, end - at - (sizeof(kPrefix) - 1));
    }
    at = end + 1;
  }
  return "";
}

std::vector<pid_t> AllPids() {
  std::vector<pid_t> pids;
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return pids;
  while (dirent* entry = readdir(proc)) {
    int pid = 0;
    if (absl::SimpleAtoi(entry->d_name, &pid) && pid != getpid()) pids.push_back(pid);
  }
  closedir(proc);
  return pids;
}

std::vector<pid_t> ProcessesMentioning(const std::string& dir) {
  std::vector<pid_t> found;
  for (pid_t pid : AllPids()) {
    // Zombies (already ended, not yet reaped) do not count: they hold nothing.
    const bool names_dir =
        absl::StrContains(CommandLine(pid), dir) || absl::StartsWith(LaunchFileOf(pid), dir);
    if (names_dir && ProcessState(pid) != 'Z') found.push_back(pid);
  }
  return found;
}

std::vector<RunnerProcess> RunnersUnder(const std::string& dir) {
  std::vector<RunnerProcess> runners;
  for (pid_t pid : AllPids()) {
    // A job process leads its process group (the agent makes it so); its own children inherit
    // its SUBSTRAX_LAUNCH but not the lead.
    const std::string launch = LaunchFileOf(pid);
    if (!absl::StartsWith(launch, dir) || ProcessGroup(pid) != pid) continue;
    const char state = ProcessState(pid);
    if (state == 'Z' || state == '?') continue;
    RunnerProcess r;
    r.pid = pid;
    r.launch = launch;
    r.stopped = state == 'T';
    runners.push_back(r);
  }
  return runners;
}

}  // namespace substrax::testing
