// Store: the small key-value interface runners rendezvous through. Gloo connects
// its contexts through it, NCCL's unique id travels through it, and peers publish their
// liveness addresses in it.
//
// Implementations: InMemoryStore (threads of one process: unit tests, the local runner),
// FileStore (processes sharing a directory: multi-process tests), PrefixStore (a key space
// inside another store: one per job attempt, one per communicator). The coordinator-backed
// store arrives with the control plane.
//
// All implementations are thread-safe.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_STORE_H_
#define SUBSTRAX_WORKER_COLLECTIVES_STORE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace substrax {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing an earlier value. Errors: UNAVAILABLE when the backing
  // medium cannot be written (the message says why).
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;

  // The value of `key`, waiting up to `timeout` for it to be set. Errors: DEADLINE_EXCEEDED
  // naming the key when it is not set in time; UNAVAILABLE when the medium cannot be read.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

// Keys in memory; Get blocks on a condition variable.
class InMemoryStore final : public Store {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

// One file per key under a directory that every process can reach. Set writes a temporary
// file and renames it into place, so readers never see half a value. Get polls for the file
// with exponential backoff (1 ms doubling to 50 ms) until the deadline: files have no change
// notification that works across hosts.
class FileStore final : public Store {
 public:
  // The directory is created if missing. Errors: UNAVAILABLE if it cannot be created.
  static absl::StatusOr<std::unique_ptr<FileStore>> Create(const std::string& directory);

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {}
  std::string PathOf(const std::string& key) const;

  const std::string directory_;
};

// Every key of `base` prefixed with "<prefix>/". Does not own `base`, which must outlive it.
class PrefixStore final : public Store {
 public:
  PrefixStore(Store* base, std::string prefix) : base_(base), prefix_(std::move(prefix)) {}

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;

 private:
  Store* const base_;
  const std::string prefix_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_STORE_H_
