// What the three stages of core/job_spec.h share: reading YAML into v1::JobSpec
// (job_spec_reader.cc), defaults (job_spec_defaults.cc) and validation (job_spec_validate.cc).
// Internal to //core:job_spec.
#ifndef SUBSTRAX_CORE_JOB_SPEC_INTERNAL_H_
#define SUBSTRAX_CORE_JOB_SPEC_INTERNAL_H_

#include <string>

#include "google/protobuf/descriptor.h"
#include "core/yaml_message.h"
#include "substrax/v1/job.pb.h"
#include "yaml-cpp/yaml.h"

namespace substrax {
namespace job_spec_internal {

// The metrics runners report ("accuracy" only for classification models).
inline constexpr const char* kMetricLoss = "loss";
inline constexpr const char* kMetricAccuracy = "accuracy";
inline constexpr const char* kMetricStep = "step";

using yaml_message::Errors;
using yaml_message::FieldError;
using yaml_message::Positions;
using yaml_message::ToStatus;

// The YAML name of an enum value: its name lower-cased without the enum's prefix
// (MODEL_TYPE_SOFTMAX_REGRESSION -> "softmax_regression").
std::string EnumValueYamlName(const google::protobuf::EnumValueDescriptor* value);

// The YAML names a user may write for `type`, comma-separated ("mean, sum, max, min"): every
// value except the zero (unspecified) one and those only queries use.
std::string EnumChoices(const google::protobuf::EnumDescriptor* type);

// The YAML name of `number` in `type`, "unspecified" for values without one.
std::string EnumName(const google::protobuf::EnumDescriptor* type, int number);

// Fills `spec` from a TrainJob document; records type and structure errors and the position of
// every key written.
void ReadJobSpecDocument(const YAML::Node& root, Errors* errors, Positions* positions,
                         v1::JobSpec* spec);

// ApplyJobSpecDefaults; fields the YAML wrote (per `positions`, may be null) are never unset.
void ApplyDefaults(const Positions* positions, v1::JobSpec* spec);

// ValidateJobSpec; `positions` (may be null) tells zeros written from fields left out.
void Validate(const v1::JobSpec& spec, const Positions* positions, Errors* errors);

}  // namespace job_spec_internal
}  // namespace substrax

#endif  // SUBSTRAX_CORE_JOB_SPEC_INTERNAL_H_
