#include "worker/collectives/store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>
#include <thread>

#include "base/backoff.h"
#include "base/files.h"
#include "absl/strings/str_cat.h"

namespace substrax {
namespace {

absl::Status KeyNotSet(const std::string& key, absl::Duration timeout) {
  return absl::DeadlineExceededError(absl::StrCat(
      "rendezvous key '", key, "' was not set within ", absl::FormatDuration(timeout),
      ": a peer has not started, has died, or uses another store"));
}

}  // namespace

absl::Status InMemoryStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> InMemoryStore::Get(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [this, &key]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return values_.count(key) > 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return KeyNotSet(key, timeout);
  }
  return values_[key];
}

absl::StatusOr<std::unique_ptr<FileStore>> FileStore::Create(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return absl::UnavailableError(
        absl::StrCat("cannot create store directory ", directory, ": ", error.message()));
  }
  return std::unique_ptr<FileStore>(new FileStore(directory));
}

std::string FileStore::PathOf(const std::string& key) const {
  // Keys hold '/' (prefixes); keep one flat directory with a reversible escape.
  std::string name;
  for (char c : key) {
    if (c == '/') {
      name += "%2F";
    } else if (c == '%') {
      name += "%25";
    } else {
      name += c;
    }
  }
  return absl::StrCat(directory_, "/", name);
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  // Atomic (a unique temporary file per writer, renamed into place): a reader sees the whole
  // value or none.
  const absl::Status written = WriteFileAtomically(PathOf(key), value);
  if (written.ok()) return written;
  return absl::UnavailableError(
      absl::StrCat("cannot publish store key '", key, "': ", written.message()));
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Duration timeout) {
  const std::string path = PathOf(key);
  const absl::Time deadline = absl::Now() + timeout;
  Backoff backoff({.initial = absl::Milliseconds(1), .max = absl::Milliseconds(50), .jitter = 0});
  // Polls until the file exists or the deadline passes; only "not there yet" is retried.
  while (true) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::stringstream contents;
      contents << in.rdbuf();
      return contents.str();
    }
    if (errno != ENOENT) {
      return absl::UnavailableError(
          absl::StrCat("cannot read store key '", key, "' at ", path, ": ", std::strerror(errno)));
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) return KeyNotSet(key, timeout);
    absl::SleepFor(std::min(*backoff.Next(now), deadline - now));
  }
}

absl::Status PrefixStore::Set(const std::string& key, const std::string& value) {
  return base_->Set(absl::StrCat(prefix_, "/", key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(const std::string& key, absl::Duration timeout) {
  return base_->Get(absl::StrCat(prefix_, "/", key), timeout);
}

}  // namespace substrax
