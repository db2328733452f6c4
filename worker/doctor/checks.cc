#include "worker/doctor/checks.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "contract/cpu_features.h"

namespace substrax::doctor {
namespace {

std::string Bytes(int64_t bytes) {
  const double gib = static_cast<double>(bytes) / (int64_t{1} << 30);
  return gib >= 1 ? absl::StrCat(static_cast<int64_t>(gib), " GiB")
                  : absl::StrCat(bytes >> 20, " MiB");
}

Finding Problem(const std::string& check, std::string seen, std::string fix) {
  return Finding{check, Verdict::kProblem, std::move(seen), std::move(fix)};
}

}  // namespace

Finding CheckCpu() {
  const absl::Status s = CheckCpuKernels();
  if (s.ok()) return Finding{"cpu", Verdict::kOk, CpuKernelsTarget(), ""};
  return Problem("cpu", std::string(s.message()),
                 "run jobs on hosts whose CPUs have the features named, or build for this CPU");
}

Finding CheckDataRoot(const std::string& root) {
  const std::string check = absl::StrCat("data root ", root);
  DIR* dir = opendir(root.c_str());
  if (dir == nullptr) {
    const int error = errno;
    return Problem(check, absl::StrCat("cannot list it: ", std::strerror(error)),
                   error == EACCES
                       ? "give the agent's user (or --job-user) read and execute permission"
                       : "create it or mount the data there, or remove it from --data-root");
  }
  int entries = 0;
  while (readdir(dir) != nullptr) ++entries;
  closedir(dir);
  return Finding{check, Verdict::kOk, absl::StrCat("readable, ", entries - 2, " entries"), ""};
}

Finding CheckWritableDir(const std::string& what, const std::string& dir,
                         const SpaceLimits& limits) {
  const std::string check = absl::StrCat(what, " ", dir);
  const std::string probe = absl::StrCat(dir, "/.substrax-doctor-", getpid());
  const int fd = open(probe.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int error = errno;
    return Problem(check, absl::StrCat("cannot create a file in it: ", std::strerror(error)),
                   error == EACCES || error == EROFS
                       ? "make it writable by the agent's user (or --job-user), or mount it "
                         "read-write"
                       : "create it, or remove it from the agent's flags");
  }
  const char kText[] = "substrax doctor";
  char back[sizeof(kText)] = {};
  const bool round_trip = write(fd, kText, sizeof(kText)) == static_cast<ssize_t>(sizeof(kText)) &&
                          pread(fd, back, sizeof(back), 0) == static_cast<ssize_t>(sizeof(back)) &&
                          std::memcmp(kText, back, sizeof(kText)) == 0;
  close(fd);
  unlink(probe.c_str());
  if (!round_trip) {
    return Problem(check, "a file written there does not read back",
                   "check the file system (full, or failing)");
  }
  struct statvfs fs;
  if (statvfs(dir.c_str(), &fs) != 0) {
    return Finding{check, Verdict::kWarning, "writable; free space unknown",
                   absl::StrCat("statvfs failed: ", std::strerror(errno))};
  }
  const int64_t free_bytes = static_cast<int64_t>(fs.f_bavail) * fs.f_frsize;
  const int64_t total = static_cast<int64_t>(fs.f_blocks) * fs.f_frsize;
  const std::string seen =
      absl::StrCat("writable, ", Bytes(free_bytes), " free of ", Bytes(total));
  if (free_bytes < limits.problem_below_bytes) {
    return Problem(check, seen, "free space there: checkpoints and logs will fail to write");
  }
  if (free_bytes < limits.warn_below_bytes) {
    return Finding{check, Verdict::kWarning, seen, "free space there before it runs out"};
  }
  return Finding{check, Verdict::kOk, seen, ""};
}

std::vector<Finding> CheckHost(const std::vector<std::string>& data_roots,
                               const std::vector<std::string>& checkpoint_roots,
                               const std::string& work_dir, const SpaceLimits& limits) {
  std::vector<Finding> findings = {CheckCpu()};
  for (const std::string& root : data_roots) findings.push_back(CheckDataRoot(root));
  for (const std::string& root : checkpoint_roots) {
    findings.push_back(CheckWritableDir("checkpoint root", root, limits));
  }
  if (!work_dir.empty()) findings.push_back(CheckWritableDir("work dir", work_dir, limits));
  return findings;
}

}  // namespace substrax::doctor
