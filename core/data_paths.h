// The path and name rules of confined data access (docs/operations.md, "Data roots"), by the
// string alone: nothing here touches the file system. The coordinator checks a job's data paths
// at submit against the data roots its workers report; the worker daemon checks its own
// --data-root flags and every job id it receives; the runner picks the root to open a file
// beneath (worker/data/safe_open.h).
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_CORE_DATA_PATHS_H_
#define SUBSTRAX_CORE_DATA_PATHS_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

// The longest name of one directory entry (NAME_MAX on Linux): an owner's directory name must
// fit.
inline constexpr size_t kMaxDirectoryNameBytes = 255;

// The longest DNS-1123 label (RFC 1123): what a job id must fit in.
inline constexpr size_t kMaxDnsLabelLength = 63;
// The longest metadata.name: the coordinator appends "-<sequence>" to make the job id, and ten
// characters leave room for sequence numbers up to 999,999,999 within kMaxDnsLabelLength.
inline constexpr size_t kMaxJobNameLength = 52;

// True when `name` is a DNS-1123 label of at most `max_length` characters: lowercase letters,
// digits and '-', starting and ending with a letter or digit.
bool IsDns1123Label(absl::string_view name, size_t max_length = kMaxDnsLabelLength);

// OK when `path` is absolute and lexically normalized: it starts with '/', and has no empty
// ("//", a trailing '/'), "." or ".." component ("/" itself is normalized). Otherwise
// INVALID_ARGUMENT saying which rule the path breaks (without repeating the path: the caller
// names the field and the path).
absl::Status CheckNormalizedAbsolute(absl::string_view path);

// `path` lexically normalized: repeated and trailing '/' and "." components removed. Errors:
// INVALID_ARGUMENT for a relative path or one with a ".." component (which only the file system
// could resolve, through symlinks).
absl::StatusOr<std::string> NormalizeAbsolute(absl::string_view path);

// Whether `path` is `root` or lies beneath it, on a component boundary ("/data" holds
// "/data/x" but not "/database"). Both must be normalized (CheckNormalizedAbsolute); the root
// "/" holds every absolute path.
bool IsUnderRoot(absl::string_view path, absl::string_view root);

// The longest of `roots` that holds `path` (IsUnderRoot), or nullptr when none does.
const std::string* FindRoot(absl::string_view path, const std::vector<std::string>& roots);

// The data file paths of `data` with the spec field each comes from
// ("spec.data.train.images", ...), in spec order; empty fields are left out.
std::vector<std::pair<std::string, std::string>> DataPaths(const v1::DataSpec& data);

// OK when every data path of `data` is absolute, normalized and under one of `roots`.
// INVALID_ARGUMENT otherwise, one line per bad path, naming the field, the path and the roots
// offered (or saying that no worker has reported a data root).
absl::Status CheckDataPathsUnderRoots(const v1::DataSpec& data,
                                      const std::vector<std::string>& roots);

// The checkpoint directories of `spec` with their fields ("spec.checkpoint.directory",
// "spec.resume_from"); empty fields are left out. Runners write and read them.
std::vector<std::pair<std::string, std::string>> CheckpointPaths(const v1::JobSpec& spec);

// The directories runners write or read beneath the workers' --checkpoint-root directories:
// CheckpointPaths and spec.tensorboard.directory.
std::vector<std::pair<std::string, std::string>> CheckpointRootPaths(const v1::JobSpec& spec);

// The directory beneath every checkpoint root that belongs to `owner` (a job's submitter,
// "anonymous" on an --insecure cluster): the name itself when it is made of ASCII letters,
// digits, '_', '-', '@', '+' and '.' (not first); otherwise every other byte, and a leading '.',
// written %XX (upper-case hex), so that no owner name can be ".", "..", hold a '/' or collide
// with another's. Empty for an empty owner.
std::string OwnerDirectoryName(absl::string_view owner);

// Whether `name` can only name an entry of a directory: not empty, ".", ".." or longer than
// kMaxDirectoryNameBytes, and no '/' or NUL in it.
bool IsDirectoryEntryName(absl::string_view name);

// `<root>/<owner_dir>` for each of `roots`, in order.
std::vector<std::string> OwnerCheckpointRoots(const std::vector<std::string>& roots,
                                              absl::string_view owner_dir);

// OK when every path of CheckpointRootPaths(spec) is absolute, normalized and under one of
// `roots` (the workers' --checkpoint-root directories) and, unless `owner_dir` is empty, under
// `<root>/<owner_dir>` (OwnerCheckpointRoots): a job writes, resumes and logs only in its
// owner's directory. INVALID_ARGUMENT otherwise, as for data paths, naming the field, the path
// and the directories the owner may use.
absl::Status CheckCheckpointPathsUnderRoots(const v1::JobSpec& spec,
                                            const std::vector<std::string>& roots,
                                            absl::string_view owner_dir = "");

// OK when the program `spec` runs, its program.path or, without python_env, its
// command.argv[0], is absolute, normalized and under one of `dirs` (the workers'
// --programs-dir directories); OK when it runs neither. INVALID_ARGUMENT otherwise, as for data
// paths: naming the field, the path and the directories offered (or saying that no worker has
// reported a programs dir).
absl::Status CheckProgramPathUnderDirs(const v1::JobSpec& spec,
                                       const std::vector<std::string>& dirs);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_DATA_PATHS_H_
