#include "coordinator/state_dir.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace substrax {

// The file at `path` (not following a symlink) belongs to this process's user.
bool OwnedByMe(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0 && st.st_uid == geteuid();
}

absl::Status MakePrivateDirectory(const std::string& directory, const std::string& what) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  // A directory of another user (a volume's mount point that Kubernetes' fsGroup made
  // group-writable) keeps its mode: only its owner could change it, and the files in it are
  // private anyway.
  if (!ec && OwnedByMe(directory)) {
    std::filesystem::permissions(directory, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat(what, ": cannot create directory ", directory,
                                               " (mode 0700): ", ec.message(),
                                               "; check --state-dir and its permissions"));
  }
  return absl::OkStatus();
}

absl::Status MakePrivateFile(const std::string& path, bool create, const std::string& what) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0),
                      0600);
  if (fd < 0 && errno == ENOENT && !create) return absl::OkStatus();
  if (fd < 0 || fchmod(fd, 0600) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::UnavailableError(absl::StrCat(what, ": cannot make ", path, " private (0600): ",
                                               std::strerror(error),
                                               "; check --state-dir and its permissions"));
  }
  close(fd);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StateDirLock>> StateDirLock::Acquire(const std::string& directory) {
  SUBSTRAX_RETURN_IF_ERROR(MakePrivateDirectory(directory, "--state-dir"));
  const std::string path = (std::filesystem::path(directory) / kFileName).string();
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat("--state-dir ", directory, ": cannot open ", path,
                                               ": ", std::strerror(errno),
                                               "; check the directory's permissions"));
  }
  std::unique_ptr<StateDirLock> lock(new StateDirLock(fd));
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error != EWOULDBLOCK) {
      return absl::UnavailableError(absl::StrCat("--state-dir ", directory, ": cannot lock ",
                                                 path, ": ", std::strerror(error)));
    }
    char buffer[32] = {};
    const ssize_t n = pread(fd, buffer, sizeof(buffer) - 1, 0);
    const std::string pid(absl::StripAsciiWhitespace(
        absl::string_view(buffer, n > 0 ? static_cast<size_t>(n) : 0)));
    return absl::FailedPreconditionError(absl::StrCat(
        "--state-dir ", directory, " is in use by another coordinator (",
        pid.empty() ? "pid unknown" : absl::StrCat("pid ", pid), ", which holds the lock on ",
        path, "): stop that one first, or give this one another --state-dir"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (ftruncate(fd, 0) != 0 ||
      pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return absl::UnavailableError(absl::StrCat("--state-dir ", directory, ": cannot write ",
                                               path, ": ", std::strerror(errno)));
  }
  // Narrow what an older coordinator left readable (the database, its -wal and -shm, keys).
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(directory, ec)) {
    if (entry.is_symlink(ec) || !entry.is_regular_file(ec)) continue;
    if (!OwnedByMe(entry.path().string())) continue;  // not ours to change (nor ours at all)
    SUBSTRAX_RETURN_IF_ERROR(MakePrivateFile(entry.path().string(), false, "--state-dir"));
  }
  if (ec) {
    return absl::UnavailableError(absl::StrCat("--state-dir ", directory, ": cannot list it: ",
                                               ec.message()));
  }
  return lock;
}

StateDirLock::~StateDirLock() { close(fd_); }  // releases the flock

}  // namespace substrax
