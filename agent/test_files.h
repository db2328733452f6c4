// Files for the agent's unit tests: a fresh directory under TEST_TMPDIR, a script.
#ifndef SUBSTRAX_AGENT_TEST_FILES_H_
#define SUBSTRAX_AGENT_TEST_FILES_H_

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace substrax {

// A fresh, empty directory `name` under TEST_TMPDIR (or /tmp).
inline std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::filesystem::path dir = std::filesystem::path(base ? base : "/tmp") / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// A shell script at `path` that exits 0, with `mode`.
inline void WriteScript(const std::string& path, mode_t mode = 0755) {
  std::ofstream(path) << "#!/bin/sh\nexit 0\n";
  chmod(path.c_str(), mode);
}

}  // namespace substrax

#endif  // SUBSTRAX_AGENT_TEST_FILES_H_
