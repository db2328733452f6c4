#include "base/files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace substrax {
namespace {

absl::Status ErrnoError(int error, absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path, ": ", std::strerror(error)));
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents, mode_t mode) {
  // Every error reads "cannot write <path>: <step>: <reason>".
  auto failed = [&path](int error, absl::string_view step) {
    return absl::ErrnoToStatus(
        error, absl::StrCat("cannot write ", path, ": ", step, ": ", std::strerror(error)));
  };
  // A unique name per writer (mkstemp), so that two writers of one path never share a
  // temporary file.
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) return failed(errno, "creating a temporary file beside it");
  auto fail = [&](absl::string_view step) {
    const int error = errno;
    close(fd);
    unlink(tmp.c_str());
    return failed(error, absl::StrCat(step, " ", tmp));
  };
  // mkstemp creates 0600; the file gets its mode before a byte is written.
  if (fchmod(fd, mode) != 0) return fail("setting the mode of");
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("writing");
    done += static_cast<size_t>(n);
  }
  // A full disk may only show at fsync or close (delayed allocation, NFS).
  if (fsync(fd) != 0) return fail("syncing");
  if (close(fd) != 0) {
    const int error = errno;
    unlink(tmp.c_str());
    return failed(error, absl::StrCat("closing ", tmp));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(tmp.c_str());
    return failed(error, absl::StrCat("renaming ", tmp, " over it"));
  }
  // The rename is durable once the directory is synced; best effort (the data already is).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  std::string contents;
  char buffer[65536];
  while (true) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return ErrnoError(error, "cannot read", path);
    }
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  return contents;
}

int OpenRegularFileNoFollow(const std::string& path, struct stat* st) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return -1;
  if (fstat(fd, st) != 0) {
    const int error = errno;
    close(fd);
    errno = error;
    return -1;
  }
  if (!S_ISREG(st->st_mode)) {
    close(fd);
    errno = 0;
    return -1;
  }
  return fd;
}

}  // namespace substrax
