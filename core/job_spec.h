// Job specs: parsing the TrainJob YAML users write into v1::JobSpec, defaults, and validation.
//
// The YAML maps onto the proto field by field (docs/job-spec.md):
//
//   apiVersion: substrax/v1
//   kind: TrainJob
//   metadata: {name: fashion-mnist-mlp}
//   spec: {model: ..., data: ..., optimizer: ..., mesh: ..., batch: ..., epochs: 3, ...}
//
// Every error names the field by its path ("spec.mesh.model_parallel_size: must be >= 1, got
// 0"); errors found while parsing YAML also carry the source name, line and column. All errors
// of a spec are reported together, one per line, in one INVALID_ARGUMENT status. Unknown fields,
// wrong types, out-of-range sizes, fields the chosen model/data/optimizer/mesh does not use, and
// combinations that cannot run (a batch that does not divide over the data axis) are all errors.
//
// Pure functions; thread-safe.
#ifndef SUBSTRAX_CORE_JOB_SPEC_H_
#define SUBSTRAX_CORE_JOB_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "substrax/v1/job.pb.h"

namespace substrax {

// Limits on sizes; larger values are rejected as absurd (they would not fit any real cluster or
// would take longer than anyone waits).
inline constexpr int64_t kMaxMeshAxisSize = 65536;
inline constexpr int64_t kMaxLayerWidth = 65536;
inline constexpr int kMaxHiddenLayers = 64;
inline constexpr int64_t kMaxNumClasses = 100000;
inline constexpr int64_t kMaxBatchSize = int64_t{1} << 24;
inline constexpr int64_t kMaxSteps = 1000000000;
inline constexpr int64_t kMaxEpochs = 1000000;
inline constexpr int64_t kMaxExamples = 100000000;
// A doctor job (spec.doctor, `substraxctl doctor`): the most workers it tests, and the most
// untested workers its spec names one by one (the rest are counted in one more entry).
inline constexpr int kMaxDoctorWorkers = 128;
inline constexpr int kMaxDoctorUntestedListed = 32;
inline constexpr int64_t kMaxFeatures = 1000000;
inline constexpr int kMaxPrefetchSize = 64;
inline constexpr int kMaxRestarts = 100;
inline constexpr int64_t kMaxCheckpointSeconds = 30 * 24 * 3600;
inline constexpr int kMaxCheckpointsKept = 1000;
inline constexpr int64_t kMaxBucketBytes = int64_t{1} << 30;
// The longest path a spec may name (checkpoint.directory, resume_from, program.path).
inline constexpr size_t kMaxSpecPathBytes = 4096;
// The longest metric name a program or command job may declare in spec.metrics.
inline constexpr size_t kMaxProgramMetricNameBytes = 64;
// A command job's argv (spec.command.argv): at most this many arguments, argv[0] included, and
// this many bytes in all, a NUL after each counted as execve counts them. Linux refuses argv and
// the environment together beyond a quarter of the stack limit (2 MiB by default); the rest is
// the environment's (contract/command_env.h bounds its own part).
inline constexpr int kMaxCommandArgs = 1024;
inline constexpr size_t kMaxCommandArgvBytes = 64 * 1024;
// A command job's spec.command.env: at most this many variables, and this many bytes in all
// ("NAME=value" and a NUL each).
inline constexpr int kMaxCommandEnvVars = 256;
inline constexpr size_t kMaxCommandEnvSpecBytes = 32 * 1024;
// The longest name of a Python environment (spec.command.python_env, the agent's --python-env
// NAME=DIR): [A-Za-z0-9_.-].
inline constexpr size_t kMaxPythonEnvNameBytes = 64;

// Parses, defaults and validates a TrainJob YAML document. `source` names the document in error
// messages (a file name). Errors: INVALID_ARGUMENT with every problem found, one per line, as
// "source:line:column: path: message".
absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml,
                                             absl::string_view source = "<job spec>");

// Reads a TrainJob YAML document into a JobSpec field by field, without defaults or
// validation: what a client that skipped the checks could send. Errors: INVALID_ARGUMENT for
// what the message cannot represent (not YAML, an empty document, unknown fields, wrong types,
// repeated keys), as ParseJobSpecYaml.
absl::StatusOr<v1::JobSpec> ReadJobSpecYaml(absl::string_view yaml,
                                            absl::string_view source = "<job spec>");

// ParseJobSpecYaml on a file's contents. Errors: NOT_FOUND / PERMISSION_DENIED when the file
// cannot be read, else as ParseJobSpecYaml.
absl::StatusOr<v1::JobSpec> LoadJobSpecFile(const std::string& path);

// Fills in the documented defaults of fields left unset (the optimizer's hyper-parameters from
// core/optimizers.h, mesh type and the axis sizes it implies, metric reductions, report
// interval, prefetch size, ...). Idempotent.
void ApplyJobSpecDefaults(v1::JobSpec* spec);

// Checks a spec (normally after ApplyJobSpecDefaults) for everything that can be checked without
// a cluster: required fields, ranges, fields unused by the chosen types, and cross-field rules.
// This is what the coordinator runs on every submitted spec, whatever client sent it.
// Errors: INVALID_ARGUMENT with every problem, one per line, as "path: message".
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// Sizes of the mesh a (defaulted) spec asks for.
int64_t DataAxisSize(const v1::JobSpec& spec);
int64_t ModelAxisSize(const v1::JobSpec& spec);
int64_t RequiredDevices(const v1::JobSpec& spec);
// Examples each shard of the data axis processes per step.
int64_t PerDeviceBatchSize(const v1::JobSpec& spec);

// The data-axis sizes an attempt of a (defaulted, valid) spec may be planned with, largest
// first: the spec's own, or for an elastic axis (mesh.min_data_parallel_size) every size in
// [min, max] that divides the global batch (every size in it when the spec has no batch: a
// program job may have none).
std::vector<int> DataParallelSizes(const v1::JobSpec& spec);
// `spec` as an attempt planned with data-axis size `size` runs it: mesh.data_parallel_size set
// to `size` and the per-device batch to global / size (the global batch stays the same).
v1::JobSpec SpecWithDataParallelSize(v1::JobSpec spec, int size);
// Whether a checkpointed spec saves after its last step (checkpoint.at_end, true by default).
bool CheckpointAtEnd(const v1::JobSpec& spec);
// The backend whose devices the job is scheduled on: spec.backend, except that a program job
// (spec.program) runs on CPU devices in this version, so its `auto` is `cpu`. A command job
// (spec.command) keeps auto, cpu and cuda as built-in jobs do: its framework drives the GPUs.
v1::Backend SchedulingBackend(const v1::JobSpec& spec);
// Whether the job runs the user's own training code (spec.program or spec.command), which
// defines its model, data and optimizer itself: none of substrax's are planned or required.
bool RunsUserCode(const v1::JobSpec& spec);
// Why `name` cannot name a Python environment (spec.command.python_env, the agent's
// --python-env NAME=DIR), "" when it can: 1 to kMaxPythonEnvNameBytes of [A-Za-z0-9_.-], and not
// "." or "..".
std::string PythonEnvNameProblem(absl::string_view name);
// Whether the model predicts classes (softmax_regression, mlp) rather than values (linear);
// core/models.h has the table.
bool IsClassification(v1::ModelType type);

// YAML names of the enums ("mlp", "hybrid", "idx", "cuda"), for messages and output: the value's
// name lower-cased without the enum's prefix; "unspecified" for the zero value. (An optimizer's
// type is its name already; core/optimizers.h has the table.)
std::string ModelTypeName(v1::ModelType type);
std::string MeshTypeName(v1::MeshType type);
std::string DataFormatName(v1::DataFormat format);
std::string BackendName(v1::Backend backend);
std::string PrecisionName(v1::Precision precision);

}  // namespace substrax

#endif  // SUBSTRAX_CORE_JOB_SPEC_H_
