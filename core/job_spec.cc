// The public entry points of core/job_spec.h. The stages live beside this file: reading
// (job_spec_reader.cc), defaults (job_spec_defaults.cc), validation (job_spec_validate.cc).
#include "core/job_spec.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_spec_internal.h"
#include "core/models.h"

namespace substrax {
namespace yaml_message {

std::optional<YAML::Mark> Positions::Find(std::string path) const {
  while (true) {
    auto it = marks.find(path);
    if (it != marks.end()) return it->second;
    const size_t cut = path.find_last_of(".[");
    if (cut == std::string::npos) return std::nullopt;
    path.resize(cut);
  }
}

absl::Status ToStatus(const Errors& errors, const Positions* positions, absl::string_view source) {
  if (errors.empty()) return absl::OkStatus();
  std::vector<std::string> lines;
  for (const FieldError& e : errors.list()) {
    std::optional<YAML::Mark> mark;
    if (positions != nullptr) mark = positions->Find(e.path);
    if (mark.has_value() && mark->line >= 0) {
      lines.push_back(absl::StrCat(source, ":", mark->line + 1, ":", mark->column + 1, ": ",
                                   e.path, ": ", e.message));
    } else if (positions != nullptr) {
      lines.push_back(absl::StrCat(source, ": ", e.path, ": ", e.message));
    } else {
      lines.push_back(absl::StrCat(e.path, ": ", e.message));
    }
  }
  return absl::InvalidArgumentError(absl::StrJoin(lines, "\n"));
}

absl::StatusOr<YAML::Node> LoadDocument(absl::string_view yaml, absl::string_view source,
                                        absl::string_view what) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": not valid YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the document is empty; expected ", what));
  }
  return root;
}

}  // namespace yaml_message

using job_spec_internal::Errors;
using job_spec_internal::Positions;

namespace {

// Reads the document into *spec; its errors, with positions, in *errors.
absl::Status ReadDocument(absl::string_view yaml, absl::string_view source, Errors* errors,
                          Positions* positions, v1::JobSpec* spec) {
  absl::StatusOr<YAML::Node> root = yaml_message::LoadDocument(yaml, source, "a TrainJob");
  if (!root.ok()) return root.status();
  job_spec_internal::ReadJobSpecDocument(*root, errors, positions, spec);
  if (!errors->empty()) return job_spec_internal::ToStatus(*errors, positions, source);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> ReadJobSpecYaml(absl::string_view yaml, absl::string_view source) {
  Errors errors;
  Positions positions;
  v1::JobSpec spec;
  if (absl::Status read = ReadDocument(yaml, source, &errors, &positions, &spec); !read.ok()) {
    return read;
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml, absl::string_view source) {
  Errors errors;
  Positions positions;
  v1::JobSpec spec;
  // Type errors leave fields unset; validating on top of them would only repeat them as
  // "required". Report what the document got wrong first.
  if (absl::Status read = ReadDocument(yaml, source, &errors, &positions, &spec); !read.ok()) {
    return read;
  }
  job_spec_internal::ApplyDefaults(&positions, &spec);
  job_spec_internal::Validate(spec, &positions, &errors);
  if (!errors.empty()) return job_spec_internal::ToStatus(errors, &positions, source);
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot read job spec ", path, ": ",
                                            std::strerror(errno)));
  }
  std::stringstream contents;
  contents << in.rdbuf();
  return ParseJobSpecYaml(contents.str(), path);
}

void ApplyJobSpecDefaults(v1::JobSpec* spec) { job_spec_internal::ApplyDefaults(nullptr, spec); }

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  Errors errors;
  job_spec_internal::Validate(spec, nullptr, &errors);
  return job_spec_internal::ToStatus(errors, nullptr, "");
}

int64_t DataAxisSize(const v1::JobSpec& spec) {
  switch (spec.mesh().type()) {
    case v1::MESH_TYPE_MODEL_PARALLEL:
      return 1;
    default:
      return spec.mesh().data_parallel_size();
  }
}

int64_t ModelAxisSize(const v1::JobSpec& spec) {
  switch (spec.mesh().type()) {
    case v1::MESH_TYPE_MODEL_PARALLEL:
      return spec.mesh().num_devices();
    case v1::MESH_TYPE_HYBRID:
      return spec.mesh().model_parallel_size();
    default:
      return 1;
  }
}

int64_t RequiredDevices(const v1::JobSpec& spec) {
  return DataAxisSize(spec) * ModelAxisSize(spec);
}

int64_t PerDeviceBatchSize(const v1::JobSpec& spec) {
  if (spec.batch().per_device_batch_size() > 0) return spec.batch().per_device_batch_size();
  const int64_t dp = DataAxisSize(spec);
  return dp > 0 ? spec.batch().global_batch_size() / dp : 0;
}

std::vector<int> DataParallelSizes(const v1::JobSpec& spec) {
  const int max = static_cast<int>(DataAxisSize(spec));
  const int min = spec.mesh().min_data_parallel_size();
  const int64_t global = spec.batch().global_batch_size();
  if (min <= 0 || min >= max || spec.mesh().type() == v1::MESH_TYPE_MODEL_PARALLEL) return {max};
  std::vector<int> sizes;
  for (int size = max; size >= min; --size) {
    // Without a batch (a program job may have none) every size in the range will do.
    if (global <= 0 || global % size == 0) sizes.push_back(size);
  }
  if (sizes.empty()) sizes.push_back(max);  // validation refuses such a spec
  return sizes;
}

v1::JobSpec SpecWithDataParallelSize(v1::JobSpec spec, int size) {
  if (spec.mesh().type() == v1::MESH_TYPE_MODEL_PARALLEL || size <= 0) return spec;
  spec.mutable_mesh()->set_data_parallel_size(size);
  if (spec.batch().global_batch_size() > 0) {
    spec.mutable_batch()->set_per_device_batch_size(spec.batch().global_batch_size() / size);
  }
  return spec;
}

bool CheckpointAtEnd(const v1::JobSpec& spec) {
  return spec.has_checkpoint() &&
         (!spec.checkpoint().has_at_end() || spec.checkpoint().at_end());
}

v1::Backend SchedulingBackend(const v1::JobSpec& spec) {
  if (spec.has_program()) return v1::BACKEND_CPU;  // validation refuses any other
  return spec.backend();
}

bool RunsUserCode(const v1::JobSpec& spec) { return spec.has_program() || spec.has_command(); }

std::string PythonEnvNameProblem(absl::string_view name) {
  if (name.empty() || name.size() > kMaxPythonEnvNameBytes) {
    return absl::StrCat("a Python environment's name is 1 to ", kMaxPythonEnvNameBytes,
                        " bytes, got ", name.size());
  }
  if (name == "." || name == "..") return absl::StrCat("'", name, "' is not a name");
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '-') {
      return absl::StrCat("'", name, "': a Python environment's name is letters, digits, '_', "
                          "'.' or '-' (the agent's --python-env NAME=DIR)");
    }
  }
  return "";
}

bool IsClassification(v1::ModelType type) {
  const ModelInfo* info = FindModel(type);
  return info != nullptr && info->task == ModelInfo::Task::kClassification;
}

std::string ModelTypeName(v1::ModelType type) {
  const ModelInfo* info = FindModel(type);
  return info != nullptr ? info->name : "unspecified";
}

std::string MeshTypeName(v1::MeshType type) {
  return job_spec_internal::EnumName(v1::MeshType_descriptor(), type);
}

std::string DataFormatName(v1::DataFormat format) {
  return job_spec_internal::EnumName(v1::DataFormat_descriptor(), format);
}

std::string BackendName(v1::Backend backend) {
  return job_spec_internal::EnumName(v1::Backend_descriptor(), backend);
}

std::string PrecisionName(v1::Precision precision) {
  return job_spec_internal::EnumName(v1::Precision_descriptor(), precision);
}

}  // namespace substrax
