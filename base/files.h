// Files written whole or not at all: the one atomic writer every package uses (the agent's work
// files, the job's result and started files, rendezvous file stores, keys and certificates, the
// coordinator's address file, the local cluster's pid file).
//
// Thread-safe: concurrent writers of one path each write their own temporary file; the last
// rename wins, and a reader sees one writer's whole contents, never a mix.
#ifndef SUBSTRAX_BASE_FILES_H_
#define SUBSTRAX_BASE_FILES_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace substrax {

// Writes `contents` to `path` atomically: a temporary file beside it (created with `mode`, so a
// key is never readable by others even for a moment), every byte written, fsync, rename over
// `path`, then its directory synced (best effort). Errors (open, write, fsync, close or rename
// failing, e.g. ENOSPC or EACCES) keep the errno's code (absl::ErrnoToStatus) and read "cannot
// write <path>: <step>: <the system's reason>"; the temporary file is removed then.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view contents,
                                 mode_t mode = 0644);

// The whole file at `path`. Errors: NOT_FOUND when it does not exist, otherwise the errno's code;
// the message names the path and the system's reason.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace substrax

#endif  // SUBSTRAX_BASE_FILES_H_
