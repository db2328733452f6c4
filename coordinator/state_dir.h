// The coordinator's --state-dir: one coordinator at a time, and private to its user.
//
// StateDirLock holds an exclusive flock(2) on <dir>/coordinator.lock for the coordinator's
// life: a second coordinator on the same directory fails at start instead of sharing the
// database with the first (two writers would each schedule the same jobs). The kernel drops the
// lock when the process dies, however it dies, so a crashed coordinator never leaves a stale
// one. The file holds the holder's pid, for the error.
//
// Modes: the directory is 0700 and every file in it 0600 (the database holds every job's spec
// and env, rendezvous.key signs the attempts' rendezvous secrets); files made by an older
// coordinator are narrowed when the lock is taken. A directory or file of another user (a
// volume's mount point under Kubernetes' fsGroup) is left as it is: only its owner could
// change it.
#ifndef SUBSTRAX_COORDINATOR_STATE_DIR_H_
#define SUBSTRAX_COORDINATOR_STATE_DIR_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace substrax {

// Creates `directory` (and its parents) when missing and sets its mode to 0700 if this user
// owns it. `what` starts the error ("state store"). Errors: UNAVAILABLE naming the directory
// and the cause.
absl::Status MakePrivateDirectory(const std::string& directory, const std::string& what);

// Sets `path`'s mode to 0600; with `create`, creates it empty (0600) when missing; without, a
// missing file is fine. Never follows a symlink at `path`. Errors: UNAVAILABLE naming the file.
absl::Status MakePrivateFile(const std::string& path, bool create, const std::string& what);

class StateDirLock {
 public:
  // Creates the directory (0700) when missing, takes the lock without waiting, writes this
  // process's pid into the lock file and narrows every regular file in the directory to 0600.
  // Errors: FAILED_PRECONDITION when another holder has the lock (the message names the
  // directory and the holder's pid); UNAVAILABLE when the directory or file cannot be made.
  static absl::StatusOr<std::unique_ptr<StateDirLock>> Acquire(const std::string& directory);
  // Releases the lock.
  ~StateDirLock();
  StateDirLock(const StateDirLock&) = delete;
  StateDirLock& operator=(const StateDirLock&) = delete;

  static constexpr char kFileName[] = "coordinator.lock";

 private:
  explicit StateDirLock(int fd) : fd_(fd) {}
  const int fd_;
};

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_STATE_DIR_H_
