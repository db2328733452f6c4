// OpenDataFile: the one way a runner opens a job's data files. A job's spec comes from whoever
// may submit jobs, so its data paths are not trusted: a runner started by the worker daemon
// opens only regular files beneath the daemon's data roots (--data-root), resolving the path
// with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) from the root's directory, so that
// neither ".." nor a symlink can lead out of the root. /proc, /dev, FIFOs and sockets are never
// opened for reading (a FIFO is opened non-blocking, so it cannot hang the runner, and refused
// before any read).
//
// Errors name the path, never a byte of what the file holds: a job's error is readable by
// everyone who can `substraxctl get` it.
//
// Thread-safe: pure functions of their arguments and the file system.
#ifndef SUBSTRAX_WORKER_DATA_SAFE_OPEN_H_
#define SUBSTRAX_WORKER_DATA_SAFE_OPEN_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

struct open_how;

namespace substrax {

// 64 GiB: larger than any data set a single host trains on from memory, small enough that a
// runaway file (or gzip bomb) fails with a message instead of exhausting the host's memory.
inline constexpr int64_t kDefaultMaxDataFileBytes = int64_t{64} << 30;

// How data files may be opened.
struct DataAccess {
  // Confined (a runner of the worker daemon): only files beneath one of `roots`. Unconfined
  // (`substrax-job train`, the user's own process): any path the process can open. Both
  // open regular files only.
  bool confined = true;
  // Absolute, normalized directories (core/data_paths.h). Confined with none: no data file can
  // be opened (synthetic data only).
  std::vector<std::string> roots;
  // A file larger than this, or gzip data that decompresses to more, is refused.
  int64_t max_file_bytes = kDefaultMaxDataFileBytes;
  // The openat2 system call; tests put a function here that fails with ENOSYS to exercise the
  // fallback for kernels before 5.6 (or a seccomp filter that refuses openat2). Returns an fd,
  // or -1 with errno set.
  using Openat2Fn = long (*)(int dirfd, const char* path, open_how* how, size_t size);
  Openat2Fn openat2 = nullptr;  // nullptr: syscall(SYS_openat2, ...)

  static DataAccess Unconfined() {
    DataAccess access;
    access.confined = false;
    return access;
  }
  static DataAccess Confined(std::vector<std::string> roots) {
    DataAccess access;
    access.roots = std::move(roots);
    return access;
  }
};

// An owned file descriptor, closed on destruction.
class ScopedFd {
 public:
  ScopedFd() = default;
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.Release()) {}
  ScopedFd& operator=(ScopedFd&& other) noexcept;
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd();

  int get() const { return fd_; }
  // Gives up ownership.
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// Opens `path` for reading (blocking reads, close-on-exec) as `access` allows, and returns it
// with its size in *size. Confined: `path` must be absolute and normalized and lie under a root
// (the longest that holds it is used); it is resolved beneath that root with openat2, or, where
// openat2 is unavailable (ENOSYS, EPERM), component by component with O_NOFOLLOW, refusing
// every symlink. With openat2, a relative symlink that stays inside the root is followed; an
// absolute one, or one that leads out, is refused.
// Errors, each naming the path: INVALID_ARGUMENT (confined and the path is relative or not
// normalized; the file is larger than max_file_bytes); PERMISSION_DENIED (outside every root, a
// symlink out of the root, or refused by the fallback; not a regular file: a directory, FIFO,
// device or socket; a file of /proc or /sys; or the system's EACCES); NOT_FOUND (no such
// file); the errno's code otherwise.
absl::StatusOr<ScopedFd> OpenDataFile(const std::string& path, const DataAccess& access,
                                      int64_t* size);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_DATA_SAFE_OPEN_H_
