#include "core/job_spec.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/suggest.h"
#include "yaml-cpp/yaml.h"

namespace substrax {
namespace {

// ---------------------------------------------------------------------------------------------
// Names of enum values as users write them.

template <typename E>
using NameTable = std::vector<std::pair<const char*, E>>;

const NameTable<v1::ModelType>& ModelTypes() {
  static const auto* table = new NameTable<v1::ModelType>{
      {"linear", v1::MODEL_TYPE_LINEAR},
      {"softmax_regression", v1::MODEL_TYPE_SOFTMAX_REGRESSION},
      {"mlp", v1::MODEL_TYPE_MLP},
  };
  return *table;
}

const NameTable<v1::DataFormat>& DataFormats() {
  static const auto* table = new NameTable<v1::DataFormat>{
      {"idx", v1::DATA_FORMAT_IDX},
      {"csv", v1::DATA_FORMAT_CSV},
      {"synthetic", v1::DATA_FORMAT_SYNTHETIC},
  };
  return *table;
}

const NameTable<v1::SyntheticTask>& SyntheticTasks() {
  static const auto* table = new NameTable<v1::SyntheticTask>{
      {"classification", v1::SYNTHETIC_TASK_CLASSIFICATION},
      {"regression", v1::SYNTHETIC_TASK_REGRESSION},
  };
  return *table;
}

const NameTable<v1::OptimizerType>& OptimizerTypes() {
  static const auto* table = new NameTable<v1::OptimizerType>{
      {"sgd", v1::OPTIMIZER_TYPE_SGD},
      {"momentum", v1::OPTIMIZER_TYPE_MOMENTUM},
      {"adam", v1::OPTIMIZER_TYPE_ADAM},
  };
  return *table;
}

const NameTable<v1::MeshType>& MeshTypes() {
  static const auto* table = new NameTable<v1::MeshType>{
      {"data_parallel", v1::MESH_TYPE_DATA_PARALLEL},
      {"model_parallel", v1::MESH_TYPE_MODEL_PARALLEL},
      {"hybrid", v1::MESH_TYPE_HYBRID},
  };
  return *table;
}

const NameTable<v1::Backend>& Backends() {
  static const auto* table = new NameTable<v1::Backend>{
      {"auto", v1::BACKEND_AUTO},
      {"cpu", v1::BACKEND_CPU},
      {"cuda", v1::BACKEND_CUDA},
  };
  return *table;
}

const NameTable<v1::Reduction>& Reductions() {
  static const auto* table = new NameTable<v1::Reduction>{
      {"mean", v1::REDUCTION_MEAN},
      {"sum", v1::REDUCTION_SUM},
      {"max", v1::REDUCTION_MAX},
      {"min", v1::REDUCTION_MIN},
  };
  return *table;
}

template <typename E>
std::string NameOf(const NameTable<E>& table, E value) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  return "unspecified";
}

template <typename E>
std::string Choices(const NameTable<E>& table) {
  std::vector<std::string> names;
  for (const auto& entry : table) names.push_back(entry.first);
  return absl::StrJoin(names, ", ");
}

// The metrics runners report, and which models report them.
constexpr const char* kMetricLoss = "loss";
constexpr const char* kMetricAccuracy = "accuracy";
constexpr const char* kMetricStep = "step";

// ---------------------------------------------------------------------------------------------
// Error collection.

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
  std::optional<YAML::Mark> Find(std::string path) const {
    while (true) {
      auto it = marks.find(path);
      if (it != marks.end()) return it->second;
      const size_t cut = path.find_last_of(".[");
      if (cut == std::string::npos) return std::nullopt;
      path.resize(cut);
    }
  }
};

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

// ---------------------------------------------------------------------------------------------
// YAML reading: types and structure only. Ranges and cross-field rules are the validator's.

std::string Describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    case YAML::NodeType::Scalar:
      if (node.Tag() == "!") return absl::StrCat("the quoted string \"", node.Scalar(), "\"");
      return absl::StrCat("'", node.Scalar(), "'");
    default:
      return "an undefined value";
  }
}

class YamlReader {
 public:
  YamlReader(Errors* errors, Positions* positions) : errors_(errors), positions_(positions) {}

  // Reads a mapping whose keys must all be in `fields`. Returns the children by key (only the
  // known ones), or nothing if `node` is not a mapping.
  std::optional<std::map<std::string, YAML::Node>> Map(const YAML::Node& node,
                                                       const std::string& path,
                                                       const std::vector<std::string>& fields) {
    std::optional<std::map<std::string, YAML::Node>> entries = Entries(node, path);
    if (!entries.has_value()) return std::nullopt;
    std::map<std::string, YAML::Node> known;
    for (auto& [key, value] : *entries) {
      if (std::find(fields.begin(), fields.end(), key) != fields.end()) {
        known.emplace(key, value);
        continue;
      }
      const std::string child = Child(path, key);
      errors_->Add(child, absl::StrCat("unknown field", DidYouMean(key, fields), "; ", path.empty() ? "the" : path,
                                       path.empty() ? " document" : "", " takes ",
                                       absl::StrJoin(fields, ", ")));
    }
    return known;
  }

  // Reads a mapping with arbitrary keys (metric names), rejecting repeated keys.
  std::optional<std::map<std::string, YAML::Node>> Entries(const YAML::Node& node,
                                                           const std::string& path) {
    if (!node.IsMap()) {
      errors_->Add(path, absl::StrCat("expected a mapping, got ", Describe(node)));
      return std::nullopt;
    }
    std::map<std::string, YAML::Node> entries;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) {
        errors_->Add(path, absl::StrCat("keys must be names, got ", Describe(kv.first)));
        continue;
      }
      const std::string key = kv.first.Scalar();
      const std::string child = Child(path, key);
      if (!entries.emplace(key, kv.second).second) {
        errors_->Add(child, "appears more than once");
        continue;
      }
      positions_->marks[child] = kv.first.Mark();
    }
    return entries;
  }

  bool Int(const YAML::Node& node, const std::string& path, int64_t* out) {
    int64_t value = 0;
    if (!PlainScalar(node) || !absl::SimpleAtoi(node.Scalar(), &value)) {
      errors_->Add(path, absl::StrCat("expected an integer, got ", Describe(node)));
      return false;
    }
    *out = value;
    return true;
  }

  template <typename T>
  bool Int(const YAML::Node& node, const std::string& path, T* out) {
    int64_t value = 0;
    if (!Int(node, path, &value)) return false;
    if (value < std::numeric_limits<T>::min() || value > std::numeric_limits<T>::max()) {
      errors_->Add(path, absl::StrCat("must be <= ", std::numeric_limits<T>::max(), ", got ",
                                      value));
      return false;
    }
    *out = static_cast<T>(value);
    return true;
  }

  bool UInt64(const YAML::Node& node, const std::string& path, uint64_t* out) {
    uint64_t value = 0;
    if (!PlainScalar(node) || node.Scalar().empty() || node.Scalar()[0] == '-' ||
        !absl::SimpleAtoi(node.Scalar(), &value)) {
      errors_->Add(path, absl::StrCat("expected a non-negative integer, got ", Describe(node)));
      return false;
    }
    *out = value;
    return true;
  }

  bool Double(const YAML::Node& node, const std::string& path, double* out) {
    double value = 0;
    if (!PlainScalar(node) || !absl::SimpleAtod(node.Scalar(), &value) || !std::isfinite(value)) {
      errors_->Add(path, absl::StrCat("expected a finite number, got ", Describe(node)));
      return false;
    }
    *out = value;
    return true;
  }

  bool Bool(const YAML::Node& node, const std::string& path, bool* out) {
    if (PlainScalar(node) && (node.Scalar() == "true" || node.Scalar() == "false")) {
      *out = node.Scalar() == "true";
      return true;
    }
    errors_->Add(path, absl::StrCat("expected true or false, got ", Describe(node)));
    return false;
  }

  bool String(const YAML::Node& node, const std::string& path, std::string* out) {
    if (!node.IsScalar()) {
      errors_->Add(path, absl::StrCat("expected a string, got ", Describe(node)));
      return false;
    }
    *out = node.Scalar();
    return true;
  }

  template <typename E>
  bool Enum(const YAML::Node& node, const std::string& path, const NameTable<E>& table,
            const char* what, E* out) {
    std::string name;
    if (!String(node, path, &name)) return false;
    for (const auto& [n, value] : table) {
      if (name == n) {
        *out = value;
        return true;
      }
    }
    errors_->Add(path, absl::StrCat("unknown ", what, " '", name, "'; use one of ",
                                    Choices(table)));
    return false;
  }

  bool IntList(const YAML::Node& node, const std::string& path, std::vector<int64_t>* out) {
    if (!node.IsSequence()) {
      errors_->Add(path, absl::StrCat("expected a list of integers, got ", Describe(node)));
      return false;
    }
    bool ok = true;
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item = absl::StrCat(path, "[", i, "]");
      positions_->marks[item] = node[i].Mark();
      int64_t value = 0;
      if (Int(node[i], item, &value)) {
        out->push_back(value);
      } else {
        ok = false;
      }
    }
    return ok;
  }

  static std::string Child(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }

 private:
  // A scalar that is not quoted: numbers and booleans written as strings are type errors.
  static bool PlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

  Errors* errors_;
  Positions* positions_;
};

// Fills `spec` from the document; records type and structure errors.
void ReadDocument(const YAML::Node& root, YamlReader& r, Errors& errors, v1::JobSpec* spec) {
  auto top = r.Map(root, "", {"apiVersion", "kind", "metadata", "spec"});
  if (!top.has_value()) return;

  std::string api_version, kind;
  if (!top->count("apiVersion")) {
    errors.Add("apiVersion", "is required; use substrax/v1");
  } else if (r.String(top->at("apiVersion"), "apiVersion", &api_version) &&
             api_version != "substrax/v1") {
    errors.Add("apiVersion", absl::StrCat("unsupported version '", api_version,
                                          "'; this coordinator speaks substrax/v1"));
  }
  if (!top->count("kind")) {
    errors.Add("kind", "is required; use TrainJob");
  } else if (r.String(top->at("kind"), "kind", &kind) && kind != "TrainJob") {
    errors.Add("kind", absl::StrCat("unsupported kind '", kind, "'; use TrainJob"));
  }
  if (top->count("metadata")) {
    if (auto meta = r.Map(top->at("metadata"), "metadata", {"name"})) {
      if (meta->count("name")) r.String(meta->at("name"), "metadata.name", spec->mutable_name());
    }
  }
  if (!top->count("spec")) {
    errors.Add("spec", "is required: the job's model, data, optimizer, mesh and batch");
    return;
  }
  auto s = r.Map(top->at("spec"), "spec",
                 {"model", "data", "optimizer", "mesh", "batch", "steps", "epochs", "seed",
                  "metrics", "report_every_steps", "backend", "checkpoint", "max_restarts"});
  if (!s.has_value()) return;
  auto has = [&](const std::map<std::string, YAML::Node>& m, const char* key) {
    return m.count(key) > 0;
  };

  if (has(*s, "model")) {
    if (auto m = r.Map(s->at("model"), "spec.model",
                       {"type", "hidden_sizes", "num_classes", "output_size"})) {
      v1::ModelSpec* model = spec->mutable_model();
      v1::ModelType type{};
      if (has(*m, "type") && r.Enum(m->at("type"), "spec.model.type", ModelTypes(), "model", &type)) {
        model->set_type(type);
      }
      if (has(*m, "hidden_sizes")) {
        std::vector<int64_t> sizes;
        r.IntList(m->at("hidden_sizes"), "spec.model.hidden_sizes", &sizes);
        for (int64_t v : sizes) model->add_hidden_sizes(v);
      }
      int64_t v = 0;
      if (has(*m, "num_classes") && r.Int(m->at("num_classes"), "spec.model.num_classes", &v)) {
        model->set_num_classes(v);
      }
      if (has(*m, "output_size") && r.Int(m->at("output_size"), "spec.model.output_size", &v)) {
        model->set_output_size(v);
      }
    }
  }

  if (has(*s, "data")) {
    if (auto d = r.Map(s->at("data"), "spec.data",
                       {"format", "train", "test", "csv", "synthetic", "shuffle",
                        "prefetch_size"})) {
      v1::DataSpec* data = spec->mutable_data();
      v1::DataFormat format{};
      if (has(*d, "format") &&
          r.Enum(d->at("format"), "spec.data.format", DataFormats(), "data format", &format)) {
        data->set_format(format);
      }
      for (const char* split : {"train", "test"}) {
        if (!has(*d, split)) continue;
        const std::string path = absl::StrCat("spec.data.", split);
        v1::DataSplit* out = std::string(split) == "train" ? data->mutable_train()
                                                           : data->mutable_test();
        if (auto sp = r.Map(d->at(split), path, {"images", "labels", "path"})) {
          if (has(*sp, "images")) r.String(sp->at("images"), path + ".images", out->mutable_images());
          if (has(*sp, "labels")) r.String(sp->at("labels"), path + ".labels", out->mutable_labels());
          if (has(*sp, "path")) r.String(sp->at("path"), path + ".path", out->mutable_path());
        }
      }
      if (has(*d, "csv")) {
        if (auto c = r.Map(d->at("csv"), "spec.data.csv", {"label_column", "delimiter"})) {
          if (has(*c, "label_column")) {
            r.String(c->at("label_column"), "spec.data.csv.label_column",
                     data->mutable_csv()->mutable_label_column());
          }
          if (has(*c, "delimiter")) {
            r.String(c->at("delimiter"), "spec.data.csv.delimiter",
                     data->mutable_csv()->mutable_delimiter());
          }
        }
      }
      if (has(*d, "synthetic")) {
        if (auto y = r.Map(d->at("synthetic"), "spec.data.synthetic",
                           {"task", "num_train_examples", "num_test_examples", "num_features",
                            "num_outputs", "noise"})) {
          v1::SyntheticOptions* syn = data->mutable_synthetic();
          v1::SyntheticTask task{};
          if (has(*y, "task") && r.Enum(y->at("task"), "spec.data.synthetic.task",
                                        SyntheticTasks(), "synthetic task", &task)) {
            syn->set_task(task);
          }
          int64_t v = 0;
          if (has(*y, "num_train_examples") &&
              r.Int(y->at("num_train_examples"), "spec.data.synthetic.num_train_examples", &v)) {
            syn->set_num_train_examples(v);
          }
          if (has(*y, "num_test_examples") &&
              r.Int(y->at("num_test_examples"), "spec.data.synthetic.num_test_examples", &v)) {
            syn->set_num_test_examples(v);
          }
          if (has(*y, "num_features") &&
              r.Int(y->at("num_features"), "spec.data.synthetic.num_features", &v)) {
            syn->set_num_features(v);
          }
          if (has(*y, "num_outputs") &&
              r.Int(y->at("num_outputs"), "spec.data.synthetic.num_outputs", &v)) {
            syn->set_num_outputs(v);
          }
          double noise = 0;
          if (has(*y, "noise") && r.Double(y->at("noise"), "spec.data.synthetic.noise", &noise)) {
            syn->set_noise(noise);
          }
        }
      }
      bool shuffle = true;
      if (has(*d, "shuffle") && r.Bool(d->at("shuffle"), "spec.data.shuffle", &shuffle)) {
        data->set_shuffle(shuffle);
      }
      int32_t prefetch = 0;
      if (has(*d, "prefetch_size") &&
          r.Int(d->at("prefetch_size"), "spec.data.prefetch_size", &prefetch)) {
        data->set_prefetch_size(prefetch);
      }
    }
  }

  if (has(*s, "optimizer")) {
    if (auto o = r.Map(s->at("optimizer"), "spec.optimizer",
                       {"type", "learning_rate", "momentum", "nesterov", "b1", "b2", "eps"})) {
      v1::OptimizerSpec* opt = spec->mutable_optimizer();
      v1::OptimizerType type{};
      if (has(*o, "type") &&
          r.Enum(o->at("type"), "spec.optimizer.type", OptimizerTypes(), "optimizer", &type)) {
        opt->set_type(type);
      }
      double v = 0;
      if (has(*o, "learning_rate") &&
          r.Double(o->at("learning_rate"), "spec.optimizer.learning_rate", &v)) {
        opt->set_learning_rate(v);
      }
      if (has(*o, "momentum") && r.Double(o->at("momentum"), "spec.optimizer.momentum", &v)) {
        opt->set_momentum(v);
      }
      bool nesterov = false;
      if (has(*o, "nesterov") && r.Bool(o->at("nesterov"), "spec.optimizer.nesterov", &nesterov)) {
        opt->set_nesterov(nesterov);
      }
      if (has(*o, "b1") && r.Double(o->at("b1"), "spec.optimizer.b1", &v)) opt->set_b1(v);
      if (has(*o, "b2") && r.Double(o->at("b2"), "spec.optimizer.b2", &v)) opt->set_b2(v);
      if (has(*o, "eps") && r.Double(o->at("eps"), "spec.optimizer.eps", &v)) opt->set_eps(v);
    }
  }

  if (has(*s, "mesh")) {
    if (auto m = r.Map(s->at("mesh"), "spec.mesh",
                       {"type", "data_parallel_size", "model_parallel_size", "num_devices",
                        "allow_cross_host_model_axis"})) {
      v1::MeshSpec* mesh = spec->mutable_mesh();
      v1::MeshType type{};
      if (has(*m, "type") &&
          r.Enum(m->at("type"), "spec.mesh.type", MeshTypes(), "mesh type", &type)) {
        mesh->set_type(type);
      }
      int32_t v = 0;
      if (has(*m, "data_parallel_size") &&
          r.Int(m->at("data_parallel_size"), "spec.mesh.data_parallel_size", &v)) {
        mesh->set_data_parallel_size(v);
      }
      if (has(*m, "model_parallel_size") &&
          r.Int(m->at("model_parallel_size"), "spec.mesh.model_parallel_size", &v)) {
        mesh->set_model_parallel_size(v);
      }
      if (has(*m, "num_devices") && r.Int(m->at("num_devices"), "spec.mesh.num_devices", &v)) {
        mesh->set_num_devices(v);
      }
      bool cross = false;
      if (has(*m, "allow_cross_host_model_axis") &&
          r.Bool(m->at("allow_cross_host_model_axis"), "spec.mesh.allow_cross_host_model_axis",
                 &cross)) {
        mesh->set_allow_cross_host_model_axis(cross);
      }
    }
  }

  if (has(*s, "batch")) {
    if (auto b = r.Map(s->at("batch"), "spec.batch",
                       {"global_batch_size", "per_device_batch_size"})) {
      int64_t v = 0;
      if (has(*b, "global_batch_size") &&
          r.Int(b->at("global_batch_size"), "spec.batch.global_batch_size", &v)) {
        spec->mutable_batch()->set_global_batch_size(v);
      }
      if (has(*b, "per_device_batch_size") &&
          r.Int(b->at("per_device_batch_size"), "spec.batch.per_device_batch_size", &v)) {
        spec->mutable_batch()->set_per_device_batch_size(v);
      }
    }
  }

  int64_t v = 0;
  if (has(*s, "steps") && has(*s, "epochs")) {
    errors.Add("spec.epochs", "give steps or epochs, not both");
  } else if (has(*s, "steps")) {
    if (r.Int(s->at("steps"), "spec.steps", &v)) spec->set_steps(v);
  } else if (has(*s, "epochs")) {
    if (r.Int(s->at("epochs"), "spec.epochs", &v)) spec->set_epochs(v);
  }
  uint64_t seed = 0;
  if (has(*s, "seed") && r.UInt64(s->at("seed"), "spec.seed", &seed)) spec->set_seed(seed);

  if (has(*s, "metrics")) {
    if (auto metrics = r.Entries(s->at("metrics"), "spec.metrics")) {
      for (const auto& [name, node] : *metrics) {
        v1::Reduction reduction{};
        if (r.Enum(node, absl::StrCat("spec.metrics.", name), Reductions(), "reduction",
                   &reduction)) {
          (*spec->mutable_metrics())[name] = reduction;
        }
      }
    }
  }
  if (has(*s, "report_every_steps") &&
      r.Int(s->at("report_every_steps"), "spec.report_every_steps", &v)) {
    spec->set_report_every_steps(v);
  }
  v1::Backend backend{};
  if (has(*s, "backend") &&
      r.Enum(s->at("backend"), "spec.backend", Backends(), "backend", &backend)) {
    spec->set_backend(backend);
  }
  if (has(*s, "checkpoint")) {
    if (auto c = r.Map(s->at("checkpoint"), "spec.checkpoint", {"directory", "every_steps"})) {
      if (has(*c, "directory")) {
        r.String(c->at("directory"), "spec.checkpoint.directory",
                 spec->mutable_checkpoint()->mutable_directory());
      }
      if (has(*c, "every_steps") &&
          r.Int(c->at("every_steps"), "spec.checkpoint.every_steps", &v)) {
        spec->mutable_checkpoint()->set_every_steps(v);
      }
    }
  }
  int32_t restarts = 0;
  if (has(*s, "max_restarts") &&
      r.Int(s->at("max_restarts"), "spec.max_restarts", &restarts)) {
    spec->set_max_restarts(restarts);
  }
}

// ---------------------------------------------------------------------------------------------
// Validation.

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

bool IsDns1123Label(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!(absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-')) return false;
  }
  return name.front() != '-' && name.back() != '-';
}

void ValidateModel(const v1::JobSpec& spec, Validator& v) {
  const v1::ModelSpec& model = spec.model();
  if (!spec.has_model()) {
    v.Add("spec.model", absl::StrCat("is required; give its type (", Choices(ModelTypes()), ")"));
    return;
  }
  const std::string by = absl::StrCat("model ", ModelTypeName(model.type()));
  switch (model.type()) {
    case v1::MODEL_TYPE_MLP:
      if (model.hidden_sizes().empty()) {
        v.Add("spec.model.hidden_sizes", "an mlp needs at least one hidden layer, e.g. [512, 512]");
      } else if (model.hidden_sizes_size() > kMaxHiddenLayers) {
        v.Add("spec.model.hidden_sizes", absl::StrCat("at most ", kMaxHiddenLayers,
                                                      " hidden layers, got ",
                                                      model.hidden_sizes_size()));
      }
      for (int i = 0; i < model.hidden_sizes_size(); ++i) {
        v.Range(absl::StrCat("spec.model.hidden_sizes[", i, "]"), model.hidden_sizes(i), 1,
                kMaxLayerWidth);
      }
      break;
    case v1::MODEL_TYPE_SOFTMAX_REGRESSION:
    case v1::MODEL_TYPE_LINEAR:
      v.Unused("spec.model.hidden_sizes", !model.hidden_sizes().empty(), by);
      break;
    default:
      if (!v.Written("spec.model.type")) {
        v.Add("spec.model.type", absl::StrCat("is required; use one of ", Choices(ModelTypes())));
      }
      return;
  }
  if (IsClassification(model.type())) {
    v.Count("spec.model.num_classes", model.num_classes(), kMaxNumClasses,
            "the number of classes");
    if (model.num_classes() == 1) {
      v.Add("spec.model.num_classes", "must be >= 2: one class needs no classifier");
    }
    v.Unused("spec.model.output_size", model.output_size() != 0, by);
  } else {
    v.Range("spec.model.output_size", model.output_size(), 1, kMaxLayerWidth);
    v.Unused("spec.model.num_classes", model.num_classes() != 0,
             absl::StrCat(by, " (a regression model; use output_size)"));
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
  if (!spec.has_data()) {
    v.Add("spec.data", absl::StrCat("is required; give its format (", Choices(DataFormats()), ")"));
    return;
  }
  const v1::DataSpec& data = spec.data();
  const v1::ModelType model = spec.model().type();
  switch (data.format()) {
    case v1::DATA_FORMAT_IDX:
      if (!data.has_train()) v.Add("spec.data.train", "is required: {images: ..., labels: ...}");
      ValidateSplit(data.train(), "spec.data.train", data.format(), v);
      if (data.has_test()) ValidateSplit(data.test(), "spec.data.test", data.format(), v);
      if (model == v1::MODEL_TYPE_LINEAR) {
        v.Add("spec.model.type",
              "linear is a regression model, but idx data has class labels; use "
              "softmax_regression or mlp");
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
        v.Add(p + ".task", absl::StrCat("is required; use one of ", Choices(SyntheticTasks())));
      } else if ((syn.task() == v1::SYNTHETIC_TASK_CLASSIFICATION) !=
                     IsClassification(model) &&
                 model != v1::MODEL_TYPE_UNSPECIFIED) {
        v.Add(p + ".task", absl::StrCat("a ", NameOf(SyntheticTasks(), syn.task()),
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
      v.Add("spec.data.format", absl::StrCat("is required; use one of ", Choices(DataFormats())));
      return;
  }
  if (data.prefetch_size() != 0 || v.Written("spec.data.prefetch_size")) {
    v.Range("spec.data.prefetch_size", data.prefetch_size(), 1, kMaxPrefetchSize);
  }
}

void ValidateOptimizer(const v1::JobSpec& spec, Validator& v) {
  if (!spec.has_optimizer()) {
    v.Add("spec.optimizer",
          absl::StrCat("is required; give its type (", Choices(OptimizerTypes()),
                       ") and learning_rate"));
    return;
  }
  const v1::OptimizerSpec& opt = spec.optimizer();
  if (opt.type() == v1::OPTIMIZER_TYPE_UNSPECIFIED) {
    v.Add("spec.optimizer.type", absl::StrCat("is required; use one of ", Choices(OptimizerTypes())));
    return;
  }
  if (!(opt.learning_rate() > 0) || !std::isfinite(opt.learning_rate())) {
    v.Add("spec.optimizer.learning_rate",
          opt.learning_rate() == 0 && !v.Written("spec.optimizer.learning_rate")
              ? std::string("is required (a positive number such as 0.001)")
              : absl::StrCat("must be a positive finite number, got ", opt.learning_rate()));
  }
  const std::string by = absl::StrCat("optimizer ", OptimizerTypeName(opt.type()));
  auto unit_interval = [&](const std::string& path, double value) {
    if (!(value >= 0 && value < 1)) {
      v.Add(path, absl::StrCat("must be in [0, 1), got ", value));
    }
  };
  if (opt.type() == v1::OPTIMIZER_TYPE_MOMENTUM) {
    if (opt.has_momentum()) unit_interval("spec.optimizer.momentum", opt.momentum());
  } else {
    v.Unused("spec.optimizer.momentum", opt.has_momentum(), by);
    v.Unused("spec.optimizer.nesterov", opt.nesterov(), by);
  }
  if (opt.type() == v1::OPTIMIZER_TYPE_ADAM) {
    if (opt.has_b1()) unit_interval("spec.optimizer.b1", opt.b1());
    if (opt.has_b2()) unit_interval("spec.optimizer.b2", opt.b2());
    if (opt.has_eps() && !(opt.eps() > 0 && std::isfinite(opt.eps()))) {
      v.Add("spec.optimizer.eps", absl::StrCat("must be a positive finite number, got ", opt.eps()));
    }
  } else {
    v.Unused("spec.optimizer.b1", opt.has_b1(), by);
    v.Unused("spec.optimizer.b2", opt.has_b2(), by);
    v.Unused("spec.optimizer.eps", opt.has_eps(), by);
  }
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
      v.Add(p + ".type", absl::StrCat("is required; use one of ", Choices(MeshTypes())));
      return;
  }
  // Only the mlp splits over a model axis (tensor parallelism); reject the rest up front.
  const int64_t mp = ModelAxisSize(spec);
  if (mp > 1 && spec.model().type() != v1::MODEL_TYPE_MLP &&
      spec.model().type() != v1::MODEL_TYPE_UNSPECIFIED) {
    v.Add(p, absl::StrCat("a model axis of size ", mp, " needs a model that splits over it; only "
                          "mlp does (got ", ModelTypeName(spec.model().type()), ")"));
  }
  if (mp > 1 && spec.model().type() == v1::MODEL_TYPE_MLP) {
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

void ValidateRest(const v1::JobSpec& spec, Validator& v) {
  if (spec.name().empty()) {
    v.Add("metadata.name", "is required: a name for the job, such as fashion-mnist-mlp");
  } else if (!IsDns1123Label(spec.name())) {
    v.Add("metadata.name",
          absl::StrCat("'", spec.name(), "' must be at most 63 lowercase letters, digits or '-', "
                       "starting and ending with a letter or digit"));
  }
  switch (spec.length_case()) {
    case v1::JobSpec::kSteps:
      v.Range("spec.steps", spec.steps(), 1, kMaxSteps);
      break;
    case v1::JobSpec::kEpochs:
      v.Range("spec.epochs", spec.epochs(), 1, kMaxEpochs);
      break;
    default:
      v.Add("spec", "give steps or epochs: how long to train");
  }

  const bool classification = IsClassification(spec.model().type());
  std::vector<std::string> known = {kMetricLoss, kMetricStep};
  if (classification) known.insert(known.begin() + 1, kMetricAccuracy);
  for (const auto& [name, reduction] : spec.metrics()) {
    const std::string path = absl::StrCat("spec.metrics.", name);
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      v.Add(path, absl::StrCat(
                      name == kMetricAccuracy ? "a regression model reports no accuracy"
                                              : absl::StrCat("unknown metric '", name, "'"),
                      "; the model reports ", absl::StrJoin(known, ", ")));
    }
    if (reduction == v1::REDUCTION_UNSPECIFIED || reduction == v1::REDUCTION_NONE) {
      v.Add(path, absl::StrCat("needs a reduction: one of ", Choices(Reductions())));
    }
  }
  if (spec.report_every_steps() != 0 || v.Written("spec.report_every_steps")) {
    v.Range("spec.report_every_steps", spec.report_every_steps(), 1, kMaxSteps);
  }
  if (spec.has_checkpoint()) {
    const v1::CheckpointSpec& c = spec.checkpoint();
    if (c.directory().empty()) {
      v.Add("spec.checkpoint.directory", "is required when checkpointing: a shared directory");
    }
    v.Count("spec.checkpoint.every_steps", c.every_steps(), kMaxSteps,
            "steps between checkpoints");
  }
  v.Range("spec.max_restarts", spec.max_restarts(), 0, kMaxRestarts);
}

void Validate(const v1::JobSpec& spec, const Positions* positions, Errors* errors) {
  Validator v(positions, errors);
  ValidateModel(spec, v);
  ValidateData(spec, v);
  ValidateOptimizer(spec, v);
  ValidateMesh(spec, v);
  ValidateBatch(spec, v);
  ValidateRest(spec, v);
}

// Defaults fill fields left unset. A zero the YAML wrote explicitly is not "unset": it stays,
// so that validation reports it instead of a default hiding it.
class Defaults {
 public:
  explicit Defaults(const Positions* positions) : positions_(positions) {}

  void Apply(v1::JobSpec* spec) const {
    // Sections left out stay out, so that validation can say they are required.
    const v1::ModelSpec& model = spec->model();
    if (spec->has_model() && model.type() == v1::MODEL_TYPE_LINEAR &&
        Unset("spec.model.output_size", model.output_size())) {
      spec->mutable_model()->set_output_size(1);
    }
    if (spec->has_data()) Data(model, spec->mutable_data());
    if (spec->has_optimizer()) Optimizer(spec->mutable_optimizer());
    if (spec->has_mesh()) Mesh(spec->mutable_mesh());
    if (spec->has_batch()) Batch(spec);
    if (spec->metrics().empty() && !Written("spec.metrics")) {
      auto& metrics = *spec->mutable_metrics();
      metrics[kMetricLoss] = v1::REDUCTION_MEAN;
      metrics[kMetricStep] = v1::REDUCTION_MAX;
      if (IsClassification(model.type())) metrics[kMetricAccuracy] = v1::REDUCTION_MEAN;
    }
    if (Unset("spec.report_every_steps", spec->report_every_steps())) {
      spec->set_report_every_steps(50);
    }
    if (spec->backend() == v1::BACKEND_UNSPECIFIED) spec->set_backend(v1::BACKEND_AUTO);
  }

 private:
  bool Written(const std::string& path) const {
    return positions_ != nullptr && positions_->Present(path);
  }
  bool Unset(const std::string& path, int64_t value) const { return value == 0 && !Written(path); }

  void Data(const v1::ModelSpec& model, v1::DataSpec* data) const {
    if (!data->has_shuffle()) data->set_shuffle(true);
    if (Unset("spec.data.prefetch_size", data->prefetch_size())) data->set_prefetch_size(2);
    if (data->format() == v1::DATA_FORMAT_CSV && data->csv().delimiter().empty() &&
        !Written("spec.data.csv.delimiter")) {
      data->mutable_csv()->set_delimiter(",");
    }
    if (data->format() == v1::DATA_FORMAT_SYNTHETIC &&
        Unset("spec.data.synthetic.num_outputs", data->synthetic().num_outputs())) {
      data->mutable_synthetic()->set_num_outputs(
          IsClassification(model.type()) ? model.num_classes() : model.output_size());
    }
  }

  void Optimizer(v1::OptimizerSpec* opt) const {
    // optax's defaults: sgd(momentum=0.9 when asked for), adam(b1=0.9, b2=0.999, eps=1e-8).
    if (opt->type() == v1::OPTIMIZER_TYPE_MOMENTUM && !opt->has_momentum()) opt->set_momentum(0.9);
    if (opt->type() == v1::OPTIMIZER_TYPE_ADAM) {
      if (!opt->has_b1()) opt->set_b1(0.9);
      if (!opt->has_b2()) opt->set_b2(0.999);
      if (!opt->has_eps()) opt->set_eps(1e-8);
    }
  }

  void Mesh(v1::MeshSpec* mesh) const {
    if (mesh->type() == v1::MESH_TYPE_UNSPECIFIED) {
      if (mesh->num_devices() != 0 || Written("spec.mesh.num_devices")) {
        mesh->set_type(v1::MESH_TYPE_MODEL_PARALLEL);
      } else if (mesh->model_parallel_size() > 1) {
        mesh->set_type(v1::MESH_TYPE_HYBRID);
      } else {
        mesh->set_type(v1::MESH_TYPE_DATA_PARALLEL);
      }
    }
    const bool mp_unset = Unset("spec.mesh.model_parallel_size", mesh->model_parallel_size());
    if (mesh->type() == v1::MESH_TYPE_DATA_PARALLEL && mp_unset) {
      mesh->set_model_parallel_size(1);
    }
    if (mesh->type() == v1::MESH_TYPE_MODEL_PARALLEL) {
      if (Unset("spec.mesh.data_parallel_size", mesh->data_parallel_size())) {
        mesh->set_data_parallel_size(1);
      }
      if (mp_unset) mesh->set_model_parallel_size(mesh->num_devices());
    }
  }

  void Batch(v1::JobSpec* spec) const {
    v1::BatchSpec* batch = spec->mutable_batch();
    const int64_t dp = DataAxisSize(*spec);
    if (dp <= 0) return;
    if (Unset("spec.batch.global_batch_size", batch->global_batch_size()) &&
        batch->per_device_batch_size() > 0 && dp <= kMaxMeshAxisSize &&
        batch->per_device_batch_size() * dp <= kMaxBatchSize) {
      batch->set_global_batch_size(batch->per_device_batch_size() * dp);
    }
    if (Unset("spec.batch.per_device_batch_size", batch->per_device_batch_size()) &&
        batch->global_batch_size() > 0 && batch->global_batch_size() <= kMaxBatchSize &&
        batch->global_batch_size() % dp == 0) {
      batch->set_per_device_batch_size(batch->global_batch_size() / dp);
    }
  }

  const Positions* positions_;
};

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecYaml(absl::string_view yaml, absl::string_view source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": not valid YAML: ", e.msg));
  }
  if (!root.IsDefined() || root.IsNull()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the document is empty; expected a TrainJob"));
  }
  Errors errors;
  Positions positions;
  v1::JobSpec spec;
  YamlReader reader(&errors, &positions);
  ReadDocument(root, reader, errors, &spec);
  // Type errors leave fields unset; validating on top of them would only repeat them as
  // "required". Report what the document got wrong first.
  if (!errors.empty()) return ToStatus(errors, &positions, source);
  Defaults(&positions).Apply(&spec);
  Validate(spec, &positions, &errors);
  if (!errors.empty()) return ToStatus(errors, &positions, source);
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

void ApplyJobSpecDefaults(v1::JobSpec* spec) { Defaults(nullptr).Apply(spec); }

absl::Status ValidateJobSpec(const v1::JobSpec& spec) {
  Errors errors;
  Validate(spec, nullptr, &errors);
  return ToStatus(errors, nullptr, "");
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

bool IsClassification(v1::ModelType type) {
  return type == v1::MODEL_TYPE_SOFTMAX_REGRESSION || type == v1::MODEL_TYPE_MLP;
}

std::string ModelTypeName(v1::ModelType type) { return NameOf(ModelTypes(), type); }
std::string OptimizerTypeName(v1::OptimizerType type) { return NameOf(OptimizerTypes(), type); }
std::string MeshTypeName(v1::MeshType type) { return NameOf(MeshTypes(), type); }
std::string DataFormatName(v1::DataFormat format) { return NameOf(DataFormats(), format); }
std::string BackendName(v1::Backend backend) { return NameOf(Backends(), backend); }

}  // namespace substrax
