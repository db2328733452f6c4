// Validation of a whole JobSpec: required fields, ranges, fields the chosen types do not use,
// and cross-field rules. The optimizer and model rules come from their tables
// (core/optimizers.h, core/models.h).
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/data_paths.h"
#include "core/job_env.h"
#include "core/job_spec.h"
#include "core/job_spec_internal.h"
#include "core/models.h"
#include "core/optimizers.h"

namespace substrax {
namespace job_spec_internal {
namespace {

class Validator {
 public:
  Validator(const Positions* positions, Errors* errors) : positions_(positions), errors_(errors) {}

  void Add(const std::string& path, std::string message) {
    errors_->Add(path, std::move(message));
  }

  // A required count in [1, max]. A zero that was never written is reported as missing.
  void Count(const std::string& path, int64_t value, int64_t max, const std::string& what) {
    if (value == 0 && !Written(path)) {
      Add(path, absl::StrCat("is required (", what, ")"));
    } else {
      Range(path, value, 1, max);
    }
  }

  void Range(const std::string& path, int64_t value, int64_t min, int64_t max) {
    if (value < min) {
      Add(path, absl::StrCat("must be >= ", min, ", got ", value));
    } else if (value > max) {
      Add(path, absl::StrCat("must be <= ", max, ", got ", value));
    }
  }

  // A field the chosen type does not use. Zero values count as unset unless written.
  void Unused(const std::string& path, bool set, const std::string& by) {
    if (set || Written(path)) Add(path, absl::StrCat("is not used by ", by, "; remove it"));
  }

  bool Written(const std::string& path) const {
    return positions_ != nullptr && positions_->Present(path);
  }

 private:
  const Positions* positions_;
  Errors* errors_;
};

void ValidateModel(const v1::JobSpec& spec, Validator& v) {
  const v1::ModelSpec& model = spec.model();
  if (RunsUserCode(spec)) {
    // The program's or command's own (ValidateUserCode says so when the section is there).
    return;
  }
  if (!spec.has_model()) {
    v.Add("spec.model", absl::StrCat("is required; give its type (",
                                     EnumChoices(v1::ModelType_descriptor()), ")"));
    return;
  }
  const ModelInfo* info = FindModel(model.type());
  if (info == nullptr) {
    if (!v.Written("spec.model.type")) {
      v.Add("spec.model.type",
            absl::StrCat("is required; use one of ", EnumChoices(v1::ModelType_descriptor())));
    }
    return;
  }
  const std::string by = absl::StrCat("model ", info->name);
  const bool classification = info->task == ModelInfo::Task::kClassification;
  for (const std::string& field : ModelSpecFields()) {
    if (info->Uses(field)) continue;
    const google::protobuf::FieldDescriptor* f =
        v1::ModelSpec::descriptor()->FindFieldByName(field);
    const google::protobuf::Reflection* r = model.GetReflection();
    const bool set = f->is_repeated() ? r->FieldSize(model, f) > 0 : r->HasField(model, f);
    v.Unused("spec.model." + field, set,
             field == "num_classes" && !classification
                 ? absl::StrCat(by, " (a regression model; use output_size)")
                 : by);
  }
  if (info->Uses("hidden_sizes")) {
    if (model.hidden_sizes().empty()) {
      v.Add("spec.model.hidden_sizes",
            absl::StrCat(by, " needs at least one hidden layer, e.g. [512, 512]"));
    } else if (model.hidden_sizes_size() > kMaxHiddenLayers) {
      v.Add("spec.model.hidden_sizes", absl::StrCat("at most ", kMaxHiddenLayers,
                                                    " hidden layers, got ",
                                                    model.hidden_sizes_size()));
    }
    for (int i = 0; i < model.hidden_sizes_size(); ++i) {
      v.Range(absl::StrCat("spec.model.hidden_sizes[", i, "]"), model.hidden_sizes(i), 1,
              kMaxLayerWidth);
    }
  }
  if (info->Uses("num_classes")) {
    v.Count("spec.model.num_classes", model.num_classes(), kMaxNumClasses,
            "the number of classes");
    if (model.num_classes() == 1) {
      v.Add("spec.model.num_classes", "must be >= 2: one class needs no classifier");
    }
  }
  if (info->Uses("output_size")) {
    v.Range("spec.model.output_size", model.output_size(), 1, kMaxLayerWidth);
  }
}

void ValidateSplit(const v1::DataSplit& split, const std::string& path, v1::DataFormat format,
                   Validator& v) {
  if (format == v1::DATA_FORMAT_IDX) {
    if (split.images().empty()) v.Add(path + ".images", "is required for idx data (an IDX file)");
    if (split.labels().empty()) v.Add(path + ".labels", "is required for idx data (an IDX file)");
    v.Unused(path + ".path", !split.path().empty(), "idx data (give images and labels)");
  } else if (format == v1::DATA_FORMAT_CSV) {
    if (split.path().empty()) v.Add(path + ".path", "is required for csv data (a CSV file)");
    v.Unused(path + ".images", !split.images().empty(), "csv data (give path)");
    v.Unused(path + ".labels", !split.labels().empty(), "csv data (give path)");
  }
}

void ValidateData(const v1::JobSpec& spec, Validator& v) {
  if (RunsUserCode(spec)) return;  // the program's or command's own
  if (!spec.has_data()) {
    v.Add("spec.data", absl::StrCat("is required; give its format (",
                                    EnumChoices(v1::DataFormat_descriptor()), ")"));
    return;
  }
  const v1::DataSpec& data = spec.data();
  const v1::ModelType model = spec.model().type();
  switch (data.format()) {
    case v1::DATA_FORMAT_IDX:
      if (!data.has_train()) v.Add("spec.data.train", "is required: {images: ..., labels: ...}");
      ValidateSplit(data.train(), "spec.data.train", data.format(), v);
      if (data.has_test()) ValidateSplit(data.test(), "spec.data.test", data.format(), v);
      if (const ModelInfo* info = FindModel(model);
          info != nullptr && info->task == ModelInfo::Task::kRegression) {
        const std::vector<std::string> classifiers = ModelNames(
            [](const ModelInfo& m) { return m.task == ModelInfo::Task::kClassification; });
        v.Add("spec.model.type",
              absl::StrCat(info->name, " is a regression model, but idx data has class labels; "
                           "use ", absl::StrJoin(classifiers, " or ")));
      }
      v.Unused("spec.data.csv", data.has_csv(), "idx data");
      v.Unused("spec.data.synthetic", data.has_synthetic(), "idx data");
      break;
    case v1::DATA_FORMAT_CSV:
      if (!data.has_train()) v.Add("spec.data.train", "is required: {path: ...}");
      ValidateSplit(data.train(), "spec.data.train", data.format(), v);
      if (data.has_test()) ValidateSplit(data.test(), "spec.data.test", data.format(), v);
      if (data.csv().label_column().empty()) {
        v.Add("spec.data.csv.label_column", "is required for csv data: the column with labels");
      }
      if (data.csv().delimiter().size() > 1) {
        v.Add("spec.data.csv.delimiter",
              absl::StrCat("must be one character, got \"", data.csv().delimiter(), "\""));
      }
      v.Unused("spec.data.synthetic", data.has_synthetic(), "csv data");
      break;
    case v1::DATA_FORMAT_SYNTHETIC: {
      v.Unused("spec.data.train", data.has_train(), "synthetic data (it is generated)");
      v.Unused("spec.data.test", data.has_test(), "synthetic data (it is generated)");
      v.Unused("spec.data.csv", data.has_csv(), "synthetic data");
      const v1::SyntheticOptions& syn = data.synthetic();
      const std::string p = "spec.data.synthetic";
      if (syn.task() == v1::SYNTHETIC_TASK_UNSPECIFIED) {
        v.Add(p + ".task", absl::StrCat("is required; use one of ",
                                        EnumChoices(v1::SyntheticTask_descriptor())));
      } else if ((syn.task() == v1::SYNTHETIC_TASK_CLASSIFICATION) !=
                     IsClassification(model) &&
                 model != v1::MODEL_TYPE_UNSPECIFIED) {
        v.Add(p + ".task", absl::StrCat("a ", EnumName(v1::SyntheticTask_descriptor(), syn.task()),
                                        " task does not suit model ", ModelTypeName(model)));
      }
      v.Count(p + ".num_train_examples", syn.num_train_examples(), kMaxExamples,
              "examples to generate");
      v.Range(p + ".num_test_examples", syn.num_test_examples(), 0, kMaxExamples);
      v.Count(p + ".num_features", syn.num_features(), kMaxFeatures, "input width");
      const int64_t model_outputs = IsClassification(model) ? spec.model().num_classes()
                                                            : spec.model().output_size();
      if (syn.num_outputs() != 0 && model_outputs != 0 && syn.num_outputs() != model_outputs) {
        v.Add(p + ".num_outputs",
              absl::StrCat("is ", syn.num_outputs(), " but the model has ", model_outputs,
                           IsClassification(model) ? " classes" : " outputs"));
      }
      if (syn.noise() < 0 || !std::isfinite(syn.noise())) {
        v.Add(p + ".noise", absl::StrCat("must be a finite number >= 0, got ", syn.noise()));
      }
      break;
    }
    default:
      v.Add("spec.data.format", absl::StrCat("is required; use one of ",
                                             EnumChoices(v1::DataFormat_descriptor())));
      return;
  }
  if (data.prefetch_size() != 0 || v.Written("spec.data.prefetch_size")) {
    v.Range("spec.data.prefetch_size", data.prefetch_size(), 1, kMaxPrefetchSize);
  }
}

void ValidateOptimizer(const v1::JobSpec& spec, Validator& v) {
  if (RunsUserCode(spec)) return;  // the program's or command's own
  if (!spec.has_optimizer()) {
    v.Add("spec.optimizer", absl::StrCat("is required; give its type (", OptimizerNames(),
                                         ") and learning_rate"));
    return;
  }
  const v1::OptimizerSpec& opt = spec.optimizer();
  ForEachOptimizerError(opt, [&](absl::string_view field, absl::string_view message) {
    const std::string path = absl::StrCat("spec.optimizer.", field);
    if (field == "learning_rate" && opt.learning_rate() == 0 && !v.Written(path)) {
      v.Add(path, "is required (a positive number such as 0.001)");
    } else {
      v.Add(path, std::string(message));
    }
  });
}

void ValidateMesh(const v1::JobSpec& spec, Validator& v) {
  if (!spec.has_mesh()) {
    v.Add("spec.mesh", "is required, e.g. {data_parallel_size: 4}");
    return;
  }
  const v1::MeshSpec& mesh = spec.mesh();
  const std::string p = "spec.mesh";
  // Sizes that are given must be sizes, whatever the mesh type.
  for (const auto& [field, value] :
       {std::make_pair("data_parallel_size", mesh.data_parallel_size()),
        std::make_pair("model_parallel_size", mesh.model_parallel_size()),
        std::make_pair("num_devices", mesh.num_devices())}) {
    const std::string path = absl::StrCat(p, ".", field);
    if (value != 0 || v.Written(path)) v.Range(path, value, 1, kMaxMeshAxisSize);
  }
  if (mesh.min_data_parallel_size() != 0 || v.Written(p + ".min_data_parallel_size")) {
    const std::string path = p + ".min_data_parallel_size";
    if (mesh.type() == v1::MESH_TYPE_MODEL_PARALLEL) {
      v.Add(path, "a model-parallel mesh has no data axis to resize; remove the range");
    } else if (mesh.min_data_parallel_size() < 1 ||
               mesh.min_data_parallel_size() > mesh.data_parallel_size()) {
      v.Add(path, absl::StrCat("the range's min must be in [1, max = ",
                               mesh.data_parallel_size(), "], got ",
                               mesh.min_data_parallel_size()));
    }
  }
  switch (mesh.type()) {
    case v1::MESH_TYPE_DATA_PARALLEL:
      if (mesh.data_parallel_size() == 0 && !v.Written(p + ".data_parallel_size")) {
        v.Add(p + ".data_parallel_size", "is required (devices on the data axis)");
      }
      if (mesh.model_parallel_size() > 1) {
        v.Add(p + ".model_parallel_size",
              absl::StrCat("a data-parallel mesh has model_parallel_size 1, got ",
                           mesh.model_parallel_size(), "; use type hybrid for a model axis"));
      }
      v.Unused(p + ".num_devices", mesh.num_devices() != 0,
               "a data-parallel mesh (use data_parallel_size)");
      v.Unused(p + ".allow_cross_host_model_axis", mesh.allow_cross_host_model_axis(),
               "a data-parallel mesh (it has no model axis)");
      break;
    case v1::MESH_TYPE_MODEL_PARALLEL:
      if (mesh.num_devices() == 0 && !v.Written(p + ".num_devices")) {
        v.Add(p + ".num_devices", "is required (devices on the model axis)");
      }
      if (mesh.data_parallel_size() > 1) {
        v.Add(p + ".data_parallel_size",
              absl::StrCat("a model-parallel mesh has no data axis, got ",
                           mesh.data_parallel_size(), "; use type hybrid for both axes"));
      }
      if (mesh.model_parallel_size() > 0 && mesh.num_devices() > 0 &&
          mesh.model_parallel_size() != mesh.num_devices()) {
        v.Add(p + ".model_parallel_size",
              absl::StrCat("a model-parallel mesh is sized by num_devices (",
                           mesh.num_devices(), "), got ", mesh.model_parallel_size()));
      }
      break;
    case v1::MESH_TYPE_HYBRID:
      for (const char* field : {"data_parallel_size", "model_parallel_size"}) {
        const std::string path = absl::StrCat(p, ".", field);
        const int32_t value = std::string(field) == "data_parallel_size"
                                  ? mesh.data_parallel_size()
                                  : mesh.model_parallel_size();
        if (value == 0 && !v.Written(path)) {
          v.Add(path, "is required for a hybrid mesh");
        }
      }
      v.Unused(p + ".num_devices", mesh.num_devices() != 0,
               "a hybrid mesh (use data_parallel_size and model_parallel_size)");
      if (int64_t{mesh.data_parallel_size()} * mesh.model_parallel_size() > kMaxMeshAxisSize) {
        v.Add(p, absl::StrCat("a mesh of ", mesh.data_parallel_size(), " x ",
                              mesh.model_parallel_size(), " devices is larger than the limit of ",
                              kMaxMeshAxisSize));
      }
      break;
    default:
      v.Add(p + ".type",
            absl::StrCat("is required; use one of ", EnumChoices(v1::MeshType_descriptor())));
      return;
  }
  // Only some models split over a model axis (tensor parallelism); reject the rest up front.
  const int64_t mp = ModelAxisSize(spec);
  const ModelInfo* model = FindModel(spec.model().type());
  if (mp > 1 && model != nullptr && !model->tensor_parallel) {
    const std::vector<std::string> split =
        ModelNames([](const ModelInfo& m) { return m.tensor_parallel; });
    v.Add(p, absl::StrCat("a model axis of size ", mp, " needs a model that splits over it; only ",
                          absl::StrJoin(split, ", "), split.size() == 1 ? " does" : " do",
                          " (got ", model->name, ")"));
  }
  if (mp > 1 && model != nullptr && model->tensor_parallel) {
    for (int i = 0; i < spec.model().hidden_sizes_size(); ++i) {
      const int64_t width = spec.model().hidden_sizes(i);
      if (width > 0 && width % mp != 0) {
        v.Add(absl::StrCat("spec.model.hidden_sizes[", i, "]"),
              absl::StrCat(width, " does not divide over the model axis of size ", mp,
                           "; use a multiple of ", mp));
      }
    }
  }
}

void ValidateBatch(const v1::JobSpec& spec, Validator& v) {
  const v1::BatchSpec& batch = spec.batch();
  const std::string p = "spec.batch";
  // A program or command may do without a batch (it is passed on to it when given).
  if (RunsUserCode(spec) && !spec.has_batch() && !v.Written(p)) return;
  if (batch.global_batch_size() == 0 && batch.per_device_batch_size() == 0 &&
      !v.Written(p + ".global_batch_size") && !v.Written(p + ".per_device_batch_size")) {
    v.Add(p, "give global_batch_size or per_device_batch_size (or both)");
    return;
  }
  const bool has_global = batch.global_batch_size() != 0 || v.Written(p + ".global_batch_size");
  const bool has_per_device =
      batch.per_device_batch_size() != 0 || v.Written(p + ".per_device_batch_size");
  if (has_global) v.Range(p + ".global_batch_size", batch.global_batch_size(), 1, kMaxBatchSize);
  if (has_per_device) {
    v.Range(p + ".per_device_batch_size", batch.per_device_batch_size(), 1, kMaxBatchSize);
  }
  const int64_t dp = DataAxisSize(spec);
  if (dp < 1 || dp > kMaxMeshAxisSize) return;  // the mesh error says why
  if (has_global && batch.global_batch_size() > 0 && batch.global_batch_size() % dp != 0) {
    const int64_t g = batch.global_batch_size();
    v.Add(p + ".global_batch_size",
          absl::StrCat(g, " does not divide over the data axis of size ", dp, " (", g, " = ", dp,
                       " x ", g / dp, " + ", g % dp, "); use a multiple of ", dp));
  }
  // An elastic data axis keeps the global batch: it must divide over the smallest size too.
  const int64_t min_dp = spec.mesh().min_data_parallel_size();
  if (has_global && batch.global_batch_size() > 0 && min_dp > 0 && min_dp < dp &&
      batch.global_batch_size() % min_dp != 0) {
    v.Add(p + ".global_batch_size",
          absl::StrCat(batch.global_batch_size(), " does not divide over the data axis's "
                       "smallest size ", min_dp, "; use a multiple of both ", min_dp, " and ", dp));
  }
  if (has_global && has_per_device && batch.per_device_batch_size() > 0 &&
      batch.global_batch_size() > 0 &&
      batch.global_batch_size() != batch.per_device_batch_size() * dp) {
    v.Add(p + ".per_device_batch_size",
          absl::StrCat(batch.per_device_batch_size(), " x ", dp, " data-axis devices = ",
                       batch.per_device_batch_size() * dp, ", but global_batch_size is ",
                       batch.global_batch_size(), "; give one of them or make them agree"));
  }
  if (has_per_device && !has_global && batch.per_device_batch_size() * dp > kMaxBatchSize) {
    v.Add(p + ".per_device_batch_size",
          absl::StrCat(batch.per_device_batch_size(), " x ", dp,
                       " data-axis devices is larger than the limit of ", kMaxBatchSize));
  }
}

// [A-Za-z_][A-Za-z0-9_]*: program metric names (environment variable names: job_env.h).
bool IsIdentifier(const std::string& name) {
  if (name.empty() || absl::ascii_isdigit(static_cast<unsigned char>(name[0]))) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  return true;
}

// A directory the workers write or read (checkpoints): absolute, normalized, bounded.
void ValidatePath(const std::string& path, const std::string& value, Validator& v) {
  if (value.size() > kMaxSpecPathBytes) {
    v.Add(path, absl::StrCat(value.size(), " bytes, more than the limit of ", kMaxSpecPathBytes));
  } else if (absl::Status s = CheckNormalizedAbsolute(value); !s.ok()) {
    v.Add(path, absl::StrCat("'", value, "' ", s.message()));
  }
}

void ValidateName(const v1::JobSpec& spec, Validator& v) {
  if (spec.name().empty()) {
    v.Add("metadata.name", "is required: a name for the job, such as fashion-mnist-mlp");
  } else if (!IsDns1123Label(spec.name(), kMaxJobNameLength)) {
    // At most 52 so that the job id "<name>-<sequence>" stays a DNS label of at most 63: job ids
    // name files and processes on the workers.
    v.Add("metadata.name",
          absl::StrCat("'", spec.name(), "' must be at most ", kMaxJobNameLength,
                       " lowercase letters, digits or '-', starting and ending with a letter or "
                       "digit (a DNS-1123 label; the job id appends '-<number>')"));
  }
}

void ValidateRest(const v1::JobSpec& spec, Validator& v) {
  ValidateName(spec, v);
  // Names of the coordinator's configuration (docs/scheduling.md); the coordinator checks that
  // they exist.
  for (const auto& [path, value] : {std::pair<const char*, const std::string*>{
                                        "spec.queue", &spec.queue()},
                                    {"spec.priority_class", &spec.priority_class()}}) {
    if (!value->empty() && !IsDns1123Label(*value)) {
      const std::string shown = value->size() > 64 ? value->substr(0, 64) + "..." : *value;
      v.Add(path, absl::StrCat("'", shown, "' must be at most ",
                               kMaxDnsLabelLength,
                               " lowercase letters, digits or '-', starting and ending with a "
                               "letter or digit (a DNS-1123 label)"));
    }
  }
  switch (spec.length_case()) {
    case v1::JobSpec::kSteps:
      v.Range("spec.steps", spec.steps(), 1, kMaxSteps);
      break;
    case v1::JobSpec::kEpochs:
      v.Range("spec.epochs", spec.epochs(), 1, kMaxEpochs);
      break;
    default:
      // A program or command decides how long it trains when the spec does not say.
      if (!RunsUserCode(spec)) v.Add("spec", "give steps or epochs: how long to train");
  }

  const bool classification = IsClassification(spec.model().type());
  std::vector<std::string> known = {kMetricLoss, kMetricStep};
  if (classification) known.insert(known.begin() + 1, kMetricAccuracy);
  for (const auto& [name, reduction] : spec.metrics()) {
    const std::string path = absl::StrCat("spec.metrics.", name);
    if (RunsUserCode(spec)) {
      // A program or command reports metrics of its own choosing, named like identifiers.
      if (!IsIdentifier(name) || name.size() > kMaxProgramMetricNameBytes) {
        v.Add(path, absl::StrCat("a metric name is at most ", kMaxProgramMetricNameBytes,
                                 " letters, digits or '_', not starting with a digit"));
      }
    } else if (std::find(known.begin(), known.end(), name) == known.end()) {
      v.Add(path, absl::StrCat(
                      name == kMetricAccuracy ? "a regression model reports no accuracy"
                                              : absl::StrCat("unknown metric '", name, "'"),
                      "; the model reports ", absl::StrJoin(known, ", ")));
    }
    if (reduction == v1::REDUCTION_UNSPECIFIED || reduction == v1::REDUCTION_NONE) {
      v.Add(path,
            absl::StrCat("needs a reduction: one of ", EnumChoices(v1::Reduction_descriptor())));
    }
  }
  if (spec.report_every_steps() != 0 || v.Written("spec.report_every_steps")) {
    v.Range("spec.report_every_steps", spec.report_every_steps(), 1, kMaxSteps);
  }
  if (spec.has_checkpoint()) {
    const v1::CheckpointSpec& c = spec.checkpoint();
    if (c.directory().empty()) {
      v.Add("spec.checkpoint.directory", "is required when checkpointing: a shared directory");
    } else {
      ValidatePath("spec.checkpoint.directory", c.directory(), v);
    }
    v.Range("spec.checkpoint.every_steps", c.every_steps(), 0, kMaxSteps);
    v.Range("spec.checkpoint.every_seconds", c.every_seconds(), 0, kMaxCheckpointSeconds);
    v.Range("spec.checkpoint.keep_last", c.keep_last(), 0, kMaxCheckpointsKept);
    if (c.every_steps() == 0 && c.every_seconds() == 0 && c.has_at_end() && !c.at_end()) {
      v.Add("spec.checkpoint", "saves nothing: give every_steps, every_seconds or at_end: true");
    }
  }
  if (!spec.resume_from().empty()) {
    ValidatePath("spec.resume_from", spec.resume_from(), v);
  }
  if (spec.has_tensorboard() || v.Written("spec.tensorboard")) {
    if (spec.tensorboard().directory().empty()) {
      v.Add("spec.tensorboard.directory",
            "is required: the directory the event files go to, under a worker's checkpoint root");
    } else {
      ValidatePath("spec.tensorboard.directory", spec.tensorboard().directory(), v);
    }
  }
  v.Range("spec.max_restarts", spec.max_restarts(), 0, kMaxRestarts);
  // Reduced precision exists only on the GPU path; backend auto is checked when the job's
  // devices are known (worker/runtime/trainer.cc).
  const bool reduced = spec.precision() == v1::PRECISION_TF32 ||
                       spec.precision() == v1::PRECISION_BF16;
  if (reduced && spec.backend() == v1::BACKEND_CPU && !RunsUserCode(spec)) {
    v.Add("spec.precision", "tf32 and bf16 need the cuda backend; the cpu backend computes in "
                            "fp32 only: use precision fp32 or backend cuda");
  }
}

// A job's own variables (spec.program.env, spec.command.env), `prefix` naming the map.
template <typename Map>
void ValidateEnv(const Map& env, const std::string& prefix, Validator& v) {
  for (const auto& [name, value] : env) {
    const std::string path = absl::StrCat(prefix, ".", name);
    // The allowlist, which the administrator extends, is the coordinator's (AdmitJobSpec);
    // what no setting allows is refused everywhere a spec is validated.
    if (std::string problem = JobEnvNameProblem(name); !problem.empty()) {
      v.Add(path, problem);
    } else if (std::string denial = JobEnvDenial(name); !denial.empty()) {
      v.Add(path, denial);
    }
    if (value.find('\0') != std::string::npos) {
      v.Add(path, "the value must not contain a NUL character");
    }
  }
}

// What the user's code defines itself, and so a program or command job (`kind`, its section
// `section`) may not have: substrax's model, data and optimizer.
void ValidateNoBuiltIns(const v1::JobSpec& spec, const std::string& kind,
                        const std::string& section, Validator& v) {
  for (const auto& [field, present] :
       {std::pair<const char*, bool>{"model", spec.has_model() || v.Written("spec.model")},
        {"data", spec.has_data() || v.Written("spec.data")},
        {"optimizer", spec.has_optimizer() || v.Written("spec.optimizer")}}) {
    if (present) {
      v.Add(absl::StrCat("spec.", field),
            absl::StrCat("a ", kind, " defines its ", field, " itself; remove spec.", field,
                         " or ", section));
    }
  }
}

// spec.program, and what a program job may not have: the program defines its model, data and
// optimizer, runs on CPU devices and saves its own state in this version.
void ValidateProgram(const v1::JobSpec& spec, Validator& v) {
  if (!spec.has_program()) return;
  const v1::ProgramSpec& program = spec.program();
  if (program.path().empty()) {
    v.Add("spec.program.path", "is required: the absolute path of the program on the workers, "
                               "under a worker's --programs-dir");
  } else {
    ValidatePath("spec.program.path", program.path(), v);
  }
  for (int i = 0; i < program.args_size(); ++i) {
    if (program.args(i).find('\0') != std::string::npos) {
      v.Add(absl::StrCat("spec.program.args[", i, "]"), "must not contain a NUL character");
    }
  }
  ValidateEnv(program.env(), "spec.program.env", v);
  ValidateNoBuiltIns(spec, "program job", "spec.program", v);
  if (spec.has_tensorboard() || v.Written("spec.tensorboard")) {
    v.Add("spec.tensorboard", "the built-in trainer writes these files; a program job writes its "
                              "own, or use substraxctl metrics --tensorboard; remove "
                              "spec.tensorboard");
  }
  if (spec.has_gradients() || v.Written("spec.gradients")) {
    v.Add("spec.gradients", "a program job reduces its gradients itself (substrax::SpmdTrainStep, "
                            "GradientReductionOptions); remove spec.gradients");
  }
  if (spec.precision() != v1::PRECISION_UNSPECIFIED && spec.precision() != v1::PRECISION_FP32) {
    v.Add("spec.precision", "program jobs run on CPU devices in this version, which compute in "
                            "fp32 only; use precision fp32 or leave it out");
  }
  if (spec.backend() != v1::BACKEND_UNSPECIFIED && spec.backend() != v1::BACKEND_AUTO &&
      spec.backend() != v1::BACKEND_CPU) {
    v.Add("spec.backend", "program jobs run on CPU devices in this version (the SDK's devices "
                          "are CPU devices); use backend cpu or auto");
  }
  // A program saves at the steps it chooses from every_steps and at_end (substrax::JobSettings):
  // the built-in trainer's agreement on elapsed time across devices is not the SDK's.
  if (spec.checkpoint().every_seconds() != 0) {
    v.Add("spec.checkpoint.every_seconds",
          "program jobs checkpoint at steps (every_steps, at_end); use every_steps");
  }
}

// Whether `name` can be looked up in a Python environment's bin/: one plain file name.
bool IsPlainFileName(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.size() > kMaxSpecPathBytes) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '+' &&
        c != '-') {
      return false;
    }
  }
  return true;
}

void ValidateCommandArgv(const v1::CommandSpec& command, Validator& v) {
  const std::string p = "spec.command.argv";
  if (command.argv().empty()) {
    v.Add(p, "is required: the command and its arguments, e.g. [python, train.py] with "
             "python_env, or [/srv/programs/train.sh]");
    return;
  }
  if (command.argv_size() > kMaxCommandArgs) {
    v.Add(p, absl::StrCat(command.argv_size(), " arguments, more than the limit of ",
                          kMaxCommandArgs));
  }
  size_t bytes = 0;
  for (int i = 0; i < command.argv_size(); ++i) {
    bytes += command.argv(i).size() + 1;
    if (command.argv(i).find('\0') != std::string::npos) {
      v.Add(absl::StrCat(p, "[", i, "]"), "must not contain a NUL character");
    }
  }
  if (bytes > kMaxCommandArgvBytes) {
    v.Add(p, absl::StrCat(bytes, " bytes in all (a NUL after each), more than the limit of ",
                          kMaxCommandArgvBytes));
  }
  const std::string& first = command.argv(0);
  if (command.python_env().empty()) {
    if (IsPlainFileName(first)) {
      v.Add(p + "[0]", absl::StrCat("'", first, "' is a name: name its Python environment "
                                    "(spec.command.python_env) or give an absolute path under a "
                                    "worker's --programs-dir"));
    } else {
      ValidatePath(p + "[0]", first, v);
    }
  } else if (!IsPlainFileName(first)) {
    v.Add(p + "[0]", absl::StrCat("'", first.substr(0, 256), "': with python_env, argv[0] is a "
                                  "file name in the environment's bin/ (letters, digits, '.', "
                                  "'_', '+', '-'), such as python or torchrun"));
  }
}

// spec.command, and what a command job may not have: the command defines its model, data,
// optimizer, gradient reduction and precision (its framework's own).
void ValidateCommand(const v1::JobSpec& spec, Validator& v) {
  if (!spec.has_command()) return;
  const v1::CommandSpec& command = spec.command();
  if (spec.has_program() || v.Written("spec.program")) {
    v.Add("spec.command", "a job runs a command or a program, not both; remove spec.command or "
                          "spec.program");
  }
  ValidateCommandArgv(command, v);
  if (!command.python_env().empty()) {
    if (std::string problem = PythonEnvNameProblem(command.python_env()); !problem.empty()) {
      v.Add("spec.command.python_env", problem);
    }
  }
  if (!v1::CommandProcesses_IsValid(command.processes())) {
    v.Add("spec.command.processes",
          absl::StrCat("unknown value ", command.processes(), "; use one of ",
                       EnumChoices(v1::CommandProcesses_descriptor())));
  }
  ValidateEnv(command.env(), "spec.command.env", v);
  if (command.env_size() > kMaxCommandEnvVars) {
    v.Add("spec.command.env", absl::StrCat(command.env_size(), " variables, more than the limit "
                                           "of ", kMaxCommandEnvVars));
  }
  size_t env_bytes = 0;
  for (const auto& [name, value] : command.env()) env_bytes += name.size() + value.size() + 2;
  if (env_bytes > kMaxCommandEnvSpecBytes) {
    v.Add("spec.command.env", absl::StrCat(env_bytes, " bytes in all (NAME=value and a NUL "
                                           "each), more than the limit of ",
                                           kMaxCommandEnvSpecBytes));
  }
  if (!command.working_dir().empty() || v.Written("spec.command.working_dir")) {
    ValidatePath("spec.command.working_dir", command.working_dir(), v);
  }
  ValidateNoBuiltIns(spec, "command job", "spec.command", v);
  if (spec.has_gradients() || v.Written("spec.gradients")) {
    v.Add("spec.gradients", "a command job's framework reduces its gradients itself; remove "
                            "spec.gradients");
  }
  if (spec.precision() == v1::PRECISION_TF32 || spec.precision() == v1::PRECISION_BF16 ||
      v.Written("spec.precision")) {
    v.Add("spec.precision", "a command job's framework chooses its precision itself (torch's "
                            "autocast, JAX's dtypes); remove spec.precision");
  }
}

// A doctor job (spec.doctor): built by the coordinator (RunDoctor), never by a user; checked
// all the same, since it is stored and replayed like any job. It trains nothing.
void ValidateDoctor(const v1::JobSpec& spec, Validator& v) {
  const v1::DoctorSpec& doctor = spec.doctor();
  for (const auto& [field, present] :
       {std::pair<const char*, bool>{"model", spec.has_model()},
        {"data", spec.has_data()},
        {"optimizer", spec.has_optimizer()},
        {"batch", spec.has_batch()},
        {"program", spec.has_program()},
        {"command", spec.has_command()},
        {"checkpoint", spec.has_checkpoint()},
        {"gradients", spec.has_gradients()},
        {"tensorboard", spec.has_tensorboard()},
        {"steps", spec.length_case() != v1::JobSpec::LENGTH_NOT_SET},
        {"resume_from", !spec.resume_from().empty()}}) {
    if (present) {
      v.Add(absl::StrCat("spec.", field),
            absl::StrCat("a doctor job checks the cluster and trains nothing; remove spec.",
                         field));
    }
  }
  if (doctor.workers().empty() || doctor.workers_size() > kMaxDoctorWorkers) {
    v.Add("spec.doctor.workers", absl::StrCat("1 to ", kMaxDoctorWorkers, " workers, got ",
                                              doctor.workers_size()));
  }
  std::set<std::string> seen;
  for (const std::string& worker : doctor.workers()) {
    if (worker.empty() || worker.size() > kMaxDnsLabelLength * 4) {
      v.Add("spec.doctor.workers", absl::StrCat("a worker id of ", worker.size(), " bytes"));
    } else if (!seen.insert(worker).second) {
      v.Add("spec.doctor.workers", absl::StrCat("worker ", worker, " is named twice"));
    }
  }
  if (doctor.untested_size() > kMaxDoctorUntestedListed + 1) {
    v.Add("spec.doctor.untested", absl::StrCat("at most ", kMaxDoctorUntestedListed + 1,
                                               " entries, got ", doctor.untested_size()));
  }
  const v1::MeshSpec& mesh = spec.mesh();
  if (mesh.type() != v1::MESH_TYPE_DATA_PARALLEL ||
      mesh.data_parallel_size() != doctor.workers_size() || mesh.min_data_parallel_size() != 0) {
    v.Add("spec.mesh", absl::StrCat("a doctor job's mesh is {data_parallel_size: ",
                                    doctor.workers_size(), "}: one device on each worker"));
  }
  if (spec.backend() != v1::BACKEND_CPU) {
    v.Add("spec.backend", "a doctor job is scheduled as backend cpu");
  }
}

}  // namespace

void ValidateGradients(const v1::JobSpec& spec, Validator& v) {
  const v1::GradientsSpec& g = spec.gradients();
  if (g.bucket_bytes() != 0 || v.Written("spec.gradients.bucket_bytes")) {
    v.Range("spec.gradients.bucket_bytes", g.bucket_bytes(), 4, kMaxBucketBytes);
  }
  const v1::MeshSpec& mesh = spec.mesh();
  const bool model_axis =
      mesh.model_parallel_size() > 1 ||
      (mesh.type() == v1::MESH_TYPE_MODEL_PARALLEL && mesh.num_devices() > 1);
  if (g.has_shard_update() && g.shard_update()) {
    if (g.has_overlap() && g.overlap()) {
      v.Add("spec.gradients.shard_update",
            "the sharded update reduce-scatters the whole gradient after the backward pass, "
            "which overlap cannot do; choose one of shard_update and overlap");
    }
    if (spec.backend() == v1::BACKEND_CUDA) {
      v.Add("spec.gradients.shard_update",
            "the update is sharded between CPU devices only; remove it or use backend cpu");
    }
    if (model_axis) {
      v.Add("spec.gradients.shard_update",
            "the update is sharded only on a mesh with a data axis alone (along a model axis "
            "each device holds other blocks already); remove it");
    }
  }
  if (!g.has_overlap() || !g.overlap()) return;
  if (spec.backend() == v1::BACKEND_CUDA) {
    v.Add("spec.gradients.overlap",
          "CUDA devices queue the gradient reduction on the device after the backward pass; "
          "overlap runs on CPU devices: remove it or use backend cpu");
  }
  if (model_axis) {
    v.Add("spec.gradients.overlap",
          "a mesh with a model axis reduces gradients after the backward pass (the pass itself "
          "all-reduces over the model axis); remove overlap");
  }
}

void Validate(const v1::JobSpec& spec, const Positions* positions, Errors* errors) {
  Validator v(positions, errors);
  if (spec.has_doctor() || v.Written("spec.doctor")) {
    ValidateName(spec, v);
    ValidateDoctor(spec, v);
    return;
  }
  ValidateModel(spec, v);
  ValidateData(spec, v);
  ValidateOptimizer(spec, v);
  ValidateMesh(spec, v);
  ValidateBatch(spec, v);
  ValidateRest(spec, v);
  ValidateGradients(spec, v);
  ValidateProgram(spec, v);
  ValidateCommand(spec, v);
}

}  // namespace job_spec_internal
}  // namespace substrax
