#include "agent/work_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace substrax {
namespace {

absl::Status ErrnoError(int error, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

// The attempt a work-dir file belongs to ("<job>-attempt-<a>"), or "" for any other file.
std::string AttemptOfFile(absl::string_view name) {
  const size_t at = name.rfind("-attempt-");
  if (at == absl::string_view::npos || at == 0) return "";
  absl::string_view rest = name.substr(at + 9);
  const size_t process = rest.find("-process-");
  if (process == absl::string_view::npos) return "";
  int attempt = 0;
  if (!absl::SimpleAtoi(rest.substr(0, process), &attempt)) return "";
  rest.remove_prefix(process + 9);
  const size_t dot = rest.find('.');
  int index = 0;
  if (dot == absl::string_view::npos || !absl::SimpleAtoi(rest.substr(0, dot), &index)) return "";
  // "assignment": the files of agents before the launch contract, cleaned up as well.
  // "job": the directory of a job user's attempt (launch.h).
  static constexpr absl::string_view kKinds[] = {"activity", "assignment", "launch", "log",
                                                  "result",   "started",    "job"};
  absl::string_view kind = rest.substr(dot + 1);
  // A temporary file of an atomic write (base/files.h): `<name>.tmp.XXXXXX`.
  if (const size_t tmp = kind.find(".tmp"); tmp != absl::string_view::npos) {
    kind = kind.substr(0, tmp);
  }
  if (std::find(std::begin(kKinds), std::end(kKinds), kind) == std::end(kKinds)) return "";
  return std::string(name.substr(0, at + 9 + process));
}

}  // namespace

absl::StatusOr<std::string> TailOfFile(const std::string& path, size_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoError(error, "cannot stat", path);
  }
  const size_t size = static_cast<size_t>(st.st_size);
  const size_t from = size > max_bytes ? size - max_bytes : 0;
  std::string tail(size - from, '\0');
  size_t done = 0;
  while (done < tail.size()) {
    const ssize_t n = pread(fd, tail.data() + done, tail.size() - done, from + done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      close(fd);
      return ErrnoError(error, "cannot read", path);
    }
    if (n == 0) break;  // truncated meanwhile
    done += static_cast<size_t>(n);
  }
  close(fd);
  tail.resize(done);
  return from > 0 ? "..." + tail : tail;
}

std::string DefaultWorkDir() {
  const char* runtime = std::getenv("XDG_RUNTIME_DIR");
  if (runtime != nullptr && runtime[0] == '/') return absl::StrCat(runtime, "/substrax-agent");
  if (geteuid() == 0) return "/var/lib/substrax-agent";
  return absl::StrCat("/tmp/substrax-agent-", geteuid());
}

absl::Status PrepareWorkDir(const std::string& dir) {
  const std::string hint = "; remove it or give another --work-dir";
  const std::filesystem::path parent = std::filesystem::path(dir).parent_path();
  std::error_code error;
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create the parents of work dir ", dir, ": ", error.message()));
  }
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError(errno, "cannot create work dir", dir);
  }
  // Checked on the directory opened, never through a link: a link or directory planted by
  // someone else (a shared /tmp) must not receive the attempts' files.
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    const int open_error = errno;
    struct stat st;
    if (lstat(dir.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("work dir ", dir, " is a symbolic link, which the agent does not follow",
                       hint));
    }
    if (open_error == ENOTDIR) {
      return absl::FailedPreconditionError(
          absl::StrCat("work dir ", dir, " is not a directory", hint));
    }
    return ErrnoError(open_error, "cannot open work dir", dir);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int stat_error = errno;
    close(fd);
    return ErrnoError(stat_error, "cannot stat work dir", dir);
  }
  if (st.st_uid != geteuid() && st.st_uid != 0) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "work dir ", dir, " is owned by uid ", st.st_uid, ", not by this agent's user (uid ",
        geteuid(), ") or root: its owner could read and replace the files of job attempts",
        hint));
  }
  if (st.st_uid == geteuid() && (st.st_mode & 077) != 0 && fchmod(fd, 0700) != 0) {
    const int chmod_error = errno;
    close(fd);
    return ErrnoError(chmod_error, "cannot restrict to its owner (0700) work dir", dir);
  }
  close(fd);
  return absl::OkStatus();
}

std::string AttemptFilePrefix(absl::string_view job_id, int attempt) {
  return absl::StrCat(job_id, "-attempt-", attempt);
}

absl::StatusOr<CleanupResult> CleanWorkDir(const std::string& dir, const LogRetention& retention,
                                           const std::set<std::string>& running, absl::Time now) {
  struct Attempt {
    // Each file (or a job user's directory) and the bytes it took when listed.
    std::vector<std::pair<std::filesystem::path, int64_t>> files;
    int64_t bytes = 0;
    absl::Time newest = absl::InfinitePast();
  };
  std::map<std::string, Attempt> attempts;
  CleanupResult result;
  std::error_code error;
  std::filesystem::directory_iterator it(dir, error);
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot list work dir ", dir, ": ", error.message()));
  }
  for (; it != std::filesystem::directory_iterator(); it.increment(error)) {
    if (error) break;
    const std::string attempt = AttemptOfFile(it->path().filename().string());
    if (attempt.empty()) continue;
    struct stat st;
    if (lstat(it->path().c_str(), &st) != 0) {
      if (errno != ENOENT) result.errors.push_back(absl::StrCat(it->path().string(), ": ",
                                                                std::strerror(errno)));
      continue;
    }
    int64_t bytes = st.st_size;
    absl::Time modified = absl::TimeFromTimespec(st.st_mtim);
    if (S_ISDIR(st.st_mode)) {
      // A job user's directory (launch.h): all it holds (the job may have left more there).
      bytes = 0;
      std::error_code inner_error;
      for (std::filesystem::recursive_directory_iterator in(it->path(), inner_error), end;
           !inner_error && in != end; in.increment(inner_error)) {
        struct stat inner;
        if (lstat(in->path().c_str(), &inner) != 0) continue;
        bytes += inner.st_size;
        modified = std::max(modified, absl::TimeFromTimespec(inner.st_mtim));
      }
    } else if (!S_ISREG(st.st_mode)) {
      continue;
    }
    Attempt& a = attempts[attempt];
    a.files.emplace_back(it->path(), bytes);
    a.bytes += bytes;
    a.newest = std::max(a.newest, modified);
  }
  if (error) {
    return absl::UnavailableError(absl::StrCat("cannot list work dir ", dir, ": ", error.message()));
  }
  for (const auto& [name, a] : attempts) result.bytes_kept += a.bytes;
  // Ended attempts, oldest first.
  std::vector<std::pair<absl::Time, std::string>> ended;
  for (const auto& [name, a] : attempts) {
    if (running.count(name) == 0) ended.emplace_back(a.newest, name);
  }
  std::sort(ended.begin(), ended.end());
  for (const auto& [newest, name] : ended) {
    const bool too_old = retention.max_age > absl::ZeroDuration() && now - newest > retention.max_age;
    const bool over_budget = retention.max_bytes > 0 && result.bytes_kept > retention.max_bytes;
    if (!too_old && !over_budget) continue;
    Attempt& a = attempts[name];
    bool all = true;
    for (const auto& [file, bytes] : a.files) {
      struct stat st;
      if (lstat(file.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        // remove_all deletes symbolic links inside, never what they point to.
        std::error_code removed;
        std::filesystem::remove_all(file, removed);
        if (removed) {
          result.errors.push_back(absl::StrCat(file.string(), ": ", removed.message()));
          all = false;
          continue;
        }
      } else if (unlink(file.c_str()) != 0 && errno != ENOENT) {
        result.errors.push_back(absl::StrCat(file.string(), ": ", std::strerror(errno)));
        all = false;
        continue;
      }
      result.bytes_deleted += bytes;
      result.bytes_kept -= bytes;
    }
    if (all) ++result.attempts_deleted;
  }
  return result;
}

absl::StatusOr<absl::Duration> ParseRetention(absl::string_view text) {
  absl::Duration d;
  int64_t days = 0;
  absl::string_view number = text;
  if (absl::ConsumeSuffix(&number, "d") && absl::SimpleAtoi(number, &days) && days >= 0) {
    return absl::Hours(24 * days);
  }
  if (absl::ParseDuration(text, &d) && d >= absl::ZeroDuration() && d != absl::InfiniteDuration()) {
    return d;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("'", text, "' is not an age such as 7d, 36h or 90m (0: no age limit)"));
}

absl::StatusOr<int64_t> ParseByteSize(absl::string_view text) {
  static constexpr std::pair<absl::string_view, int64_t> kUnits[] = {
      {"TiB", int64_t{1} << 40}, {"GiB", int64_t{1} << 30}, {"MiB", int64_t{1} << 20},
      {"KiB", int64_t{1} << 10}, {"B", 1}};
  absl::string_view number = absl::StripAsciiWhitespace(text);
  int64_t unit = 1;
  for (const auto& [suffix, bytes] : kUnits) {
    if (absl::ConsumeSuffix(&number, suffix)) {
      unit = bytes;
      break;
    }
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(number, &n) || n < 0 || n > INT64_MAX / unit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a size such as 1GiB, 512MiB or 1048576 (0: no size limit)"));
  }
  return n * unit;
}

}  // namespace substrax
