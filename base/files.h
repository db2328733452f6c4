// Files written whole or not at all: the one atomic writer every package uses (the agent's work
// files, the job's result and started files, rendezvous file stores, keys and certificates, the
// coordinator's address file, the local cluster's pid file); and the one way to open a file
// that someone else (a job's process) may have planted.
//
// Thread-safe: concurrent writers of one path each write their own temporary file; the last
// rename wins, and a reader sees one writer's whole contents, never a mix.
#ifndef SUBSTRAX_BASE_FILES_H_
#define SUBSTRAX_BASE_FILES_H_

#include <sys/stat.h>
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

// Opens `path` for reading when another user may have made it (a job's process writes files the
// agent reads): never through a symbolic link at `path` (it may lead to a file only the reader
// may read), never blocking on a FIFO, and only a regular file. Returns the descriptor (the
// caller closes it) with `*st` filled by fstat; -1 with errno set when it cannot be opened
// (ELOOP: a symbolic link; ENOENT: none); -1 with errno 0 when it is not a regular file
// (`*st` says what it is).
int OpenRegularFileNoFollow(const std::string& path, struct stat* st);

}  // namespace substrax

#endif  // SUBSTRAX_BASE_FILES_H_
