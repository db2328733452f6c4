#include "core/data_paths.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace substrax {

bool IsDns1123Label(absl::string_view name, size_t max_length) {
  if (name.empty() || name.size() > max_length) return false;
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return name.front() != '-' && name.back() != '-';
}

absl::Status CheckNormalizedAbsolute(absl::string_view path) {
  if (!absl::StartsWith(path, "/")) {
    return absl::InvalidArgumentError("is not an absolute path (it must start with '/')");
  }
  if (path == "/") return absl::OkStatus();
  for (absl::string_view component : absl::StrSplit(path.substr(1), '/')) {
    if (component.empty()) {
      return absl::InvalidArgumentError("has an empty component ('//' or a trailing '/')");
    }
    if (component == "." || component == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("has a '", component, "' component; write the path without it"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NormalizeAbsolute(absl::string_view path) {
  if (!absl::StartsWith(path, "/")) {
    return absl::InvalidArgumentError("is not an absolute path (it must start with '/')");
  }
  std::vector<absl::string_view> kept;
  for (absl::string_view component : absl::StrSplit(path, '/')) {
    if (component.empty() || component == ".") continue;
    if (component == "..") {
      return absl::InvalidArgumentError(
          "has a '..' component, which only the file system could resolve; give the directory "
          "itself");
    }
    kept.push_back(component);
  }
  return absl::StrCat("/", absl::StrJoin(kept, "/"));
}

bool IsUnderRoot(absl::string_view path, absl::string_view root) {
  if (root == "/") return absl::StartsWith(path, "/");
  if (!absl::StartsWith(path, root)) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

const std::string* FindRoot(absl::string_view path, const std::vector<std::string>& roots) {
  const std::string* best = nullptr;
  for (const std::string& root : roots) {
    if (IsUnderRoot(path, root) && (best == nullptr || root.size() > best->size())) best = &root;
  }
  return best;
}

std::vector<std::pair<std::string, std::string>> DataPaths(const v1::DataSpec& data) {
  std::vector<std::pair<std::string, std::string>> paths;
  auto add = [&paths](const std::string& field, const std::string& path) {
    if (!path.empty()) paths.emplace_back(field, path);
  };
  for (const auto& [name, split] : {std::pair<const char*, const v1::DataSplit*>{
                                        "train", &data.train()},
                                    {"test", &data.test()}}) {
    const std::string p = absl::StrCat("spec.data.", name, ".");
    add(p + "images", split->images());
    add(p + "labels", split->labels());
    add(p + "path", split->path());
  }
  return paths;
}

namespace {

// One line per path of `paths` that is not normalized or not under one of `roots`; `what` names
// the kind of path ("data", "checkpoint", "program"), `root` the kind of root ("data root",
// "programs dir") and `flag` the daemon flag that offers one.
std::vector<std::string> PathsNotUnderRoots(
    const std::vector<std::pair<std::string, std::string>>& paths,
    const std::vector<std::string>& roots, absl::string_view what, absl::string_view root,
    absl::string_view flag) {
  std::vector<std::string> problems;
  for (const auto& [field, path] : paths) {
    if (absl::Status normalized = CheckNormalizedAbsolute(path); !normalized.ok()) {
      problems.push_back(absl::StrCat(field, ": '", path, "' ", normalized.message(), "; ", what,
                                      " paths are absolute paths on the workers"));
    } else if (FindRoot(path, roots) == nullptr) {
      problems.push_back(
          roots.empty()
              ? absl::StrCat(field, ": '", path, "' is not under a ", root, ": no worker has "
                             "reported any ", root, " (start the worker daemons with ", flag,
                             " DIR)")
              : absl::StrCat(field, ": '", path, "' is not under a ", root, " of any worker (",
                             absl::StrJoin(roots, ", "), "); use a directory there or start a "
                             "worker with ", flag));
    }
  }
  return problems;
}

absl::Status Problems(const std::vector<std::string>& problems) {
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrJoin(problems, "\n"));
}

}  // namespace

absl::Status CheckDataPathsUnderRoots(const v1::DataSpec& data,
                                      const std::vector<std::string>& roots) {
  return Problems(PathsNotUnderRoots(DataPaths(data), roots, "data", "data root", "--data-root"));
}

std::vector<std::pair<std::string, std::string>> CheckpointPaths(const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> paths;
  if (!spec.checkpoint().directory().empty()) {
    paths.emplace_back("spec.checkpoint.directory", spec.checkpoint().directory());
  }
  if (!spec.resume_from().empty()) paths.emplace_back("spec.resume_from", spec.resume_from());
  return paths;
}

std::vector<std::pair<std::string, std::string>> CheckpointRootPaths(const v1::JobSpec& spec) {
  std::vector<std::pair<std::string, std::string>> paths = CheckpointPaths(spec);
  if (!spec.tensorboard().directory().empty()) {
    paths.emplace_back("spec.tensorboard.directory", spec.tensorboard().directory());
  }
  return paths;
}

std::string OwnerDirectoryName(absl::string_view owner) {
  std::string out;
  for (size_t i = 0; i < owner.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(owner[i]);
    const bool plain = absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '@' || c == '+' ||
                       (c == '.' && i > 0);
    if (plain) {
      out.push_back(static_cast<char>(c));
    } else {
      constexpr char kHex[] = "0123456789ABCDEF";
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

bool IsDirectoryEntryName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.size() <= kMaxDirectoryNameBytes &&
         name.find('/') == absl::string_view::npos && name.find('\0') == absl::string_view::npos;
}

std::vector<std::string> OwnerCheckpointRoots(const std::vector<std::string>& roots,
                                              absl::string_view owner_dir) {
  std::vector<std::string> out;
  for (const std::string& root : roots) {
    out.push_back(root == "/" ? absl::StrCat("/", owner_dir) : absl::StrCat(root, "/", owner_dir));
  }
  return out;
}

absl::Status CheckCheckpointPathsUnderRoots(const v1::JobSpec& spec,
                                            const std::vector<std::string>& roots,
                                            absl::string_view owner_dir) {
  const std::vector<std::pair<std::string, std::string>> paths = CheckpointRootPaths(spec);
  std::vector<std::string> problems =
      PathsNotUnderRoots(paths, roots, "checkpoint", "checkpoint root", "--checkpoint-root");
  if (!problems.empty() || owner_dir.empty()) return Problems(problems);
  // Under a root, but it must be the owner's part of it: another owner's directory holds their
  // weights, the checkpoints their next resume reads, and what their keep_last rotates.
  const std::vector<std::string> owned = OwnerCheckpointRoots(roots, owner_dir);
  for (const auto& [field, path] : paths) {
    if (FindRoot(path, owned) != nullptr) continue;
    problems.push_back(absl::StrCat(
        field, ": '", path, "' is not in the submitter's own directory: a job writes and resumes "
        "checkpoints only under ", absl::StrJoin(owned, " or "),
        " (<checkpoint root>/<owner>; an admin may name any path under the roots)"));
  }
  return Problems(problems);
}

absl::Status CheckProgramPathUnderDirs(const v1::JobSpec& spec,
                                       const std::vector<std::string>& dirs) {
  std::vector<std::pair<std::string, std::string>> paths;
  if (spec.has_program()) paths.emplace_back("spec.program.path", spec.program().path());
  // A command run from a Python environment is found in its bin/, which the agent checks.
  if (spec.has_command() && spec.command().python_env().empty() &&
      !spec.command().argv().empty()) {
    paths.emplace_back("spec.command.argv[0]", spec.command().argv(0));
  }
  return Problems(PathsNotUnderRoots(paths, dirs, "program", "programs dir", "--programs-dir"));
}

}  // namespace substrax
