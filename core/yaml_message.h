// Reading a YAML document into any protobuf message by its descriptors, with errors that name
// the field and where it was written ("source:line:column: path: message"). Job specs
// (core/job_spec.h) and the coordinator's scheduling configuration (coordinator/scheduler.h)
// are read this way, so a new proto field needs no reader change.
#ifndef SUBSTRAX_CORE_YAML_MESSAGE_H_
#define SUBSTRAX_CORE_YAML_MESSAGE_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"
#include "yaml-cpp/yaml.h"

namespace substrax {
namespace yaml_message {

struct FieldError {
  std::string path;
  std::string message;
};

class Errors {
 public:
  void Add(std::string path, std::string message) {
    errors_.push_back({std::move(path), std::move(message)});
  }
  bool empty() const { return errors_.empty(); }
  const std::vector<FieldError>& list() const { return errors_; }

 private:
  std::vector<FieldError> errors_;
};

// Where each field appears in the YAML, for "source:line:column:" prefixes and to tell a field
// written as 0 from one left out.
struct Positions {
  std::map<std::string, YAML::Mark> marks;

  bool Present(const std::string& path) const { return marks.count(path) > 0; }

  // The position of `path`, or of its nearest written ancestor.
  std::optional<YAML::Mark> Find(std::string path) const;
};

// Every error as "source:line:column: path: message" (without positions: "path: message"), one
// per line, in one INVALID_ARGUMENT status; OK when there are none.
absl::Status ToStatus(const Errors& errors, const Positions* positions, absl::string_view source);

// The document's root node. Errors: INVALID_ARGUMENT "source:line:column: not valid YAML: ..."
// or "source: the document is empty; expected <what>".
absl::StatusOr<YAML::Node> LoadDocument(absl::string_view yaml, absl::string_view source,
                                        absl::string_view what);

// Reads the mapping `node` into `message`: every key must be a field of it, by its proto name;
// enums by their lower-case names without the enum's prefix, `optional` fields keep their
// presence. Records type and structure errors under `path` (empty: the document) and the
// position of every key written.
void ReadMessage(const YAML::Node& node, const std::string& path,
                 google::protobuf::Message* message, Errors* errors, Positions* positions);

}  // namespace yaml_message
}  // namespace substrax

#endif  // SUBSTRAX_CORE_YAML_MESSAGE_H_
