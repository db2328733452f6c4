#include "worker/data/safe_open.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/data_paths.h"

namespace substrax {

ScopedFd& ScopedFd::operator=(ScopedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.Release();
  }
  return *this;
}

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

namespace {

// O_NONBLOCK: opening a FIFO without a writer would otherwise block forever; the type is
// checked (fstat) before anything is read, and the flag cleared for regular files.
constexpr int kOpenFlags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;

long SystemOpenat2(int dirfd, const char* path, open_how* how, size_t size) {
  return syscall(SYS_openat2, dirfd, path, how, size);
}

absl::Status OpenError(int error, const std::string& path, absl::string_view what) {
  if (error == EACCES || error == EPERM) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": ", what, ": ", std::strerror(error),
                     "; check that the worker's user may read it"));
  }
  return absl::ErrnoToStatus(error, absl::StrCat(path, ": ", what));
}

absl::Status Refused(const std::string& path, absl::string_view why) {
  return absl::PermissionDeniedError(absl::StrCat(path, ": ", why));
}

// The fallback for kernels without openat2: every component opened with O_NOFOLLOW from the
// one before, so no symlink (which could lead anywhere) is ever followed.
absl::StatusOr<ScopedFd> OpenBeneathWithoutSymlinks(int root_fd, absl::string_view rest,
                                                    const std::string& path,
                                                    const std::string& root) {
  const std::vector<absl::string_view> components = absl::StrSplit(rest, '/');
  ScopedFd dir;
  int at = root_fd;
  for (size_t i = 0; i < components.size(); ++i) {
    const std::string name(components[i]);
    const bool last = i + 1 == components.size();
    const int fd = openat(at, name.c_str(),
                          last ? kOpenFlags | O_NOFOLLOW
                               : O_RDONLY | O_CLOEXEC | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0) {
      const int error = errno;
      struct stat st;
      if ((error == ELOOP || error == ENOTDIR) &&
          fstatat(at, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
        return Refused(path, absl::StrCat("'", absl::StrJoin(components.begin(),
                                                              components.begin() + i + 1, "/"),
                                          "' under data root ", root,
                                          " is a symlink, which this kernel cannot follow safely "
                                          "(no openat2); use the file's real path"));
      }
      return OpenError(error, path, "cannot open");
    }
    if (last) return ScopedFd(fd);
    dir = ScopedFd(fd);
    at = dir.get();
  }
  return absl::InternalError(absl::StrCat(path, ": no component to open"));  // not reached
}

absl::StatusOr<ScopedFd> OpenConfined(const std::string& path, const DataAccess& access) {
  if (absl::Status normalized = CheckNormalizedAbsolute(path); !normalized.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", normalized.message()));
  }
  const std::string* root = FindRoot(path, access.roots);
  if (root == nullptr) {
    return Refused(path, access.roots.empty()
                             ? "this worker has no data roots (start its daemon with "
                               "--data-root DIR), so it reads no data files"
                             : absl::StrCat("is not under a data root of this worker (",
                                            absl::StrJoin(access.roots, ", "), ")"));
  }
  const int root_fd_raw = open(root->c_str(), O_RDONLY | O_CLOEXEC | O_DIRECTORY);
  if (root_fd_raw < 0) {
    return OpenError(errno, path, absl::StrCat("cannot open its data root ", *root));
  }
  const ScopedFd root_fd(root_fd_raw);
  // What lies beneath the root ("" for the root itself, which then fails as a directory).
  absl::string_view rest = absl::string_view(path).substr(root->size());
  while (!rest.empty() && rest.front() == '/') rest.remove_prefix(1);
  const std::string relative = rest.empty() ? "." : std::string(rest);

  open_how how;
  std::memset(&how, 0, sizeof(how));
  how.flags = kOpenFlags;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  const DataAccess::Openat2Fn openat2 =
      access.openat2 != nullptr ? access.openat2 : &SystemOpenat2;
  long fd = -1;
  int error = 0;
  // EAGAIN: a rename or mount raced with the resolution and the kernel could not rule out an
  // escape; the man page's answer is to try again. A few immediate tries, no backoff: the race
  // is a window of microseconds, and a persistent EAGAIN is reported as an error.
  for (int attempt = 0; attempt < 4; ++attempt) {
    fd = openat2(root_fd.get(), relative.c_str(), &how, sizeof(how));
    error = fd < 0 ? errno : 0;
    if (fd >= 0 || error != EAGAIN) break;
  }
  if (fd >= 0) return ScopedFd(static_cast<int>(fd));
  switch (error) {
    case ENOSYS:  // before Linux 5.6
    case EPERM:   // a seccomp filter (some container runtimes) refuses unknown system calls
      return OpenBeneathWithoutSymlinks(root_fd.get(), relative, path, *root);
    case EXDEV:
      return Refused(path, absl::StrCat("resolves outside its data root ", *root,
                                        " (through a symlink or an absolute symlink)"));
    case ELOOP:
      return Refused(path, absl::StrCat("leads through a symlink loop or a /proc magic link "
                                        "under data root ",
                                        *root));
    default:
      return OpenError(error, path, "cannot open");
  }
}

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

}  // namespace

absl::StatusOr<ScopedFd> OpenDataFile(const std::string& path, const DataAccess& access,
                                      int64_t* size) {
  ScopedFd fd;
  if (access.confined) {
    absl::StatusOr<ScopedFd> opened = OpenConfined(path, access);
    if (!opened.ok()) return opened.status();
    fd = *std::move(opened);
  } else {
    const int raw = open(path.c_str(), kOpenFlags);
    if (raw < 0) return OpenError(errno, path, "cannot open");
    fd = ScopedFd(raw);
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return OpenError(errno, path, "cannot stat");
  if (!S_ISREG(st.st_mode)) {
    return Refused(path, absl::StrCat("is ", FileKind(st.st_mode),
                                      "; data files must be regular files"));
  }
  // /proc and /sys files look regular (size 0) but hold the system's state, not data.
  struct statfs fs;
  if (fstatfs(fd.get(), &fs) == 0 &&
      (fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC)) {
    return Refused(path, "is a file of /proc or /sys, not a data file");
  }
  if (st.st_size > access.max_file_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", st.st_size,
                                                   " bytes, more than the limit of ",
                                                   access.max_file_bytes, " for a data file"));
  }
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags < 0 || fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return OpenError(errno, path, "cannot make reads blocking");
  }
  if (size != nullptr) *size = st.st_size;
  return fd;
}

}  // namespace substrax
