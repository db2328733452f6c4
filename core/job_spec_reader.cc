// YAML -> v1::JobSpec, driven by the protobuf descriptors: every field of job.proto is read by
// its name, type and label, so a new field needs no change here. Types and structure only;
// ranges and cross-field rules are the validator's (job_spec_validate.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/job_spec_internal.h"
#include "core/optimizers.h"
#include "core/suggest.h"
#include "google/protobuf/message.h"

namespace substrax {
namespace job_spec_internal {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::EnumValueDescriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Enum values that exist for queries, never for specs: a metric kept per device cannot be
// reported as one value.
bool QueryOnly(const EnumValueDescriptor* value) {
  return value->full_name() == "substrax.v1.REDUCTION_NONE";
}

// "ModelType" -> "model type", for "unknown model type 'cnn'".
std::string EnumWhat(const EnumDescriptor* type) {
  std::string what;
  for (char c : type->name()) {
    if (absl::ascii_isupper(c) && !what.empty()) what.push_back(' ');
    what.push_back(absl::ascii_tolower(c));
  }
  return what;
}

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

// A scalar that is not quoted: numbers and booleans written as strings are type errors.
bool PlainScalar(const YAML::Node& node) { return node.IsScalar() && node.Tag() != "!"; }

std::string Child(const std::string& path, const std::string& key) {
  return path.empty() ? key : absl::StrCat(path, ".", key);
}

// What "expected a list of ..." names for the elements of a repeated field.
std::string Plural(const FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
    case FieldDescriptor::CPPTYPE_INT64:
      return "integers";
    case FieldDescriptor::CPPTYPE_UINT32:
    case FieldDescriptor::CPPTYPE_UINT64:
      return "non-negative integers";
    case FieldDescriptor::CPPTYPE_FLOAT:
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return "numbers";
    case FieldDescriptor::CPPTYPE_BOOL:
      return "true or false values";
    case FieldDescriptor::CPPTYPE_MESSAGE:
      return "mappings";
    default:
      return "names";
  }
}

// Maps whose entries YAML writes inline beside the message's own fields, because which keys
// exist depends on another field: optimizer hyper-parameters (`{type: adam, b1: 0.9}`).
bool IsInlineMap(const FieldDescriptor* field) {
  return field == v1::OptimizerSpec::descriptor()->FindFieldByName("hyperparameters");
}

// A hyper-parameter of some optimizer in the table called `name`, preferring `type`'s.
const HyperParameter* FindAnyHyper(const std::string& type, const std::string& name) {
  if (const OptimizerInfo* info = FindOptimizer(type)) {
    if (const HyperParameter* h = info->FindHyper(name)) return h;
  }
  for (const OptimizerInfo& info : OptimizerTable()) {
    if (const HyperParameter* h = info.FindHyper(name)) return h;
  }
  return nullptr;
}

class Reader {
 public:
  Reader(Errors* errors, Positions* positions) : errors_(errors), positions_(positions) {}

  // A mapping's entries by key, rejecting repeated keys and recording each key's position;
  // nothing if `node` is not a mapping.
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

  void UnknownField(const std::string& path, const std::string& key,
                    const std::vector<std::string>& fields) {
    errors_->Add(Child(path, key),
                 absl::StrCat("unknown field", DidYouMean(key, fields), "; ",
                              path.empty() ? "the document" : path, " takes ",
                              absl::StrJoin(fields, ", ")));
  }

  // Reads the mapping `node` into `message`: every key must be a field of it (other than
  // `hidden`, which the YAML writes elsewhere) or an entry of its inline map.
  void ReadMessage(const YAML::Node& node, const std::string& path, Message* message,
                   const std::set<std::string>& hidden = {}) {
    std::optional<std::map<std::string, YAML::Node>> entries = Entries(node, path);
    if (!entries.has_value()) return;
    const Descriptor* d = message->GetDescriptor();
    std::vector<std::string> names;
    const FieldDescriptor* inline_map = nullptr;
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      if (IsInlineMap(f)) {
        inline_map = f;
      } else if (hidden.count(f->name()) == 0) {
        names.push_back(f->name());
      }
    }
    std::set<std::string> skip = ConflictingOneofFields(*entries, path, d);
    for (const std::string& name : names) {
      auto it = entries->find(name);
      if (it == entries->end() || skip.count(name) > 0) continue;
      ReadField(it->second, Child(path, name), d->FindFieldByName(name), message);
    }
    for (const auto& [key, value] : *entries) {
      if (std::find(names.begin(), names.end(), key) != names.end()) continue;
      if (inline_map != nullptr) {
        ReadInlineEntry(path, key, value, names, message);
      } else {
        UnknownField(path, key, names);
      }
    }
  }

  bool String(const YAML::Node& node, const std::string& path, std::string* out) {
    if (!node.IsScalar()) {
      errors_->Add(path, absl::StrCat("expected a string, got ", Describe(node)));
      return false;
    }
    *out = node.Scalar();
    return true;
  }

 private:
  // Fields of one oneof written together: an error on the last, and none of them is read.
  std::set<std::string> ConflictingOneofFields(const std::map<std::string, YAML::Node>& entries,
                                               const std::string& path, const Descriptor* d) {
    std::set<std::string> skip;
    for (int i = 0; i < d->oneof_decl_count(); ++i) {
      const google::protobuf::OneofDescriptor* oneof = d->oneof_decl(i);
      if (oneof->is_synthetic()) continue;  // an `optional` field's presence, not a choice
      std::vector<std::string> all, written;
      for (int j = 0; j < oneof->field_count(); ++j) {
        all.push_back(oneof->field(j)->name());
        if (entries.count(all.back()) > 0) written.push_back(all.back());
      }
      if (written.size() < 2) continue;
      errors_->Add(Child(path, written.back()),
                   absl::StrCat("give ", absl::StrJoin(all, " or "), ", not both"));
      skip.insert(written.begin(), written.end());
    }
    return skip;
  }

  // The optimizer's hyper-parameters: a key that some optimizer in the table has goes into the
  // map (the validator says when the chosen type does not use it); anything else is unknown.
  void ReadInlineEntry(const std::string& parent, const std::string& key, const YAML::Node& node,
                       const std::vector<std::string>& fields, Message* message) {
    // The one inline map is OptimizerSpec.hyperparameters (IsInlineMap).
    auto* opt = static_cast<v1::OptimizerSpec*>(message);
    const std::string path = Child(parent, key);
    const HyperParameter* h = FindAnyHyper(opt->type(), key);
    if (h == nullptr) {
      const OptimizerInfo* info = FindOptimizer(opt->type());
      if (info != nullptr) {
        errors_->Add(path, UnknownHyperParameterMessage(*info, key));
      } else {
        std::vector<std::string> candidates = fields;
        for (const OptimizerInfo& o : OptimizerTable()) {
          for (const HyperParameter& hp : o.hyper) candidates.push_back(hp.name);
        }
        UnknownField(parent, key, candidates);
      }
      return;
    }
    double value = 0;
    if (h->kind == HyperParameter::Kind::kBool) {
      bool b = false;
      if (!Bool(node, path, &b)) return;
      value = b ? 1 : 0;
    } else if (!Double(node, path, &value)) {
      return;
    }
    (*opt->mutable_hyperparameters())[key] = value;
  }

  // `data_parallel_size: {min: 2, max: 4}`: an elastic data axis, read into
  // min_data_parallel_size and data_parallel_size (the validator checks the range).
  bool ReadSizeRange(const YAML::Node& node, const std::string& path, Message* message) {
    auto* mesh = static_cast<v1::MeshSpec*>(message);
    std::optional<std::map<std::string, YAML::Node>> entries = Entries(node, path);
    if (!entries.has_value()) return false;
    for (const auto& [key, value] : *entries) {
      if (key != "min" && key != "max") UnknownField(path, key, {"min", "max"});
    }
    for (const char* key : {"min", "max"}) {
      if (entries->count(key) == 0) {
        errors_->Add(path, absl::StrCat("a range needs both min and max, e.g. {min: 2, max: 4}"));
        return false;
      }
    }
    int64_t min = 0, max = 0;
    const int64_t limit = std::numeric_limits<int32_t>::max();
    if (!Int(entries->at("min"), Child(path, "min"), 1, limit, &min) ||
        !Int(entries->at("max"), Child(path, "max"), 1, limit, &max)) {
      return false;
    }
    mesh->set_min_data_parallel_size(static_cast<int32_t>(min));
    mesh->set_data_parallel_size(static_cast<int32_t>(max));
    return true;
  }

  void ReadField(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                 Message* message) {
    const Reflection* r = message->GetReflection();
    if (node.IsMap() && f->full_name() == "substrax.v1.MeshSpec.data_parallel_size") {
      ReadSizeRange(node, path, message);
      return;
    }
    if (f->is_map()) {
      std::optional<std::map<std::string, YAML::Node>> entries = Entries(node, path);
      if (!entries.has_value()) return;
      for (const auto& [key, value] : *entries) {
        Message* entry = r->AddMessage(message, f);
        const Descriptor* ed = entry->GetDescriptor();
        const std::string child = Child(path, key);
        // A key is a YAML scalar like any value; string keys need no parsing.
        bool ok = true;
        if (ed->map_key()->cpp_type() == FieldDescriptor::CPPTYPE_STRING) {
          entry->GetReflection()->SetString(entry, ed->map_key(), key);
        } else {
          ok = ReadSingular(YAML::Node(key), child, ed->map_key(), entry);
        }
        if (!ok || !ReadSingular(value, child, ed->map_value(), entry)) r->RemoveLast(message, f);
      }
      return;
    }
    if (f->is_repeated()) {
      if (!node.IsSequence()) {
        errors_->Add(path, absl::StrCat("expected a list of ", Plural(f), ", got ",
                                        Describe(node)));
        return;
      }
      for (size_t i = 0; i < node.size(); ++i) {
        const std::string item = absl::StrCat(path, "[", i, "]");
        positions_->marks[item] = node[i].Mark();
        ReadSingular(node[i], item, f, message);
      }
      return;
    }
    ReadSingular(node, path, f, message);
  }

  // Reads one value of `f` (an element when `f` is repeated) into `message`.
  bool ReadSingular(const YAML::Node& node, const std::string& path, const FieldDescriptor* f,
                    Message* message) {
    const Reflection* r = message->GetReflection();
    const bool add = f->is_repeated();
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE: {
        Message* child = add ? r->AddMessage(message, f) : r->MutableMessage(message, f);
        ReadMessage(node, path, child);
        return true;
      }
      case FieldDescriptor::CPPTYPE_INT32:
      case FieldDescriptor::CPPTYPE_INT64: {
        const bool narrow = f->cpp_type() == FieldDescriptor::CPPTYPE_INT32;
        int64_t v = 0;
        if (!Int(node, path, narrow ? std::numeric_limits<int32_t>::min()
                                    : std::numeric_limits<int64_t>::min(),
                 narrow ? std::numeric_limits<int32_t>::max()
                        : std::numeric_limits<int64_t>::max(),
                 &v)) {
          return false;
        }
        if (narrow) {
          add ? r->AddInt32(message, f, static_cast<int32_t>(v))
              : r->SetInt32(message, f, static_cast<int32_t>(v));
        } else {
          add ? r->AddInt64(message, f, v) : r->SetInt64(message, f, v);
        }
        return true;
      }
      case FieldDescriptor::CPPTYPE_UINT32:
      case FieldDescriptor::CPPTYPE_UINT64: {
        const bool narrow = f->cpp_type() == FieldDescriptor::CPPTYPE_UINT32;
        uint64_t v = 0;
        if (!UInt(node, path,
                  narrow ? std::numeric_limits<uint32_t>::max()
                         : std::numeric_limits<uint64_t>::max(),
                  &v)) {
          return false;
        }
        if (narrow) {
          add ? r->AddUInt32(message, f, static_cast<uint32_t>(v))
              : r->SetUInt32(message, f, static_cast<uint32_t>(v));
        } else {
          add ? r->AddUInt64(message, f, v) : r->SetUInt64(message, f, v);
        }
        return true;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
      case FieldDescriptor::CPPTYPE_FLOAT: {
        double v = 0;
        if (!Double(node, path, &v)) return false;
        if (f->cpp_type() == FieldDescriptor::CPPTYPE_FLOAT) {
          add ? r->AddFloat(message, f, static_cast<float>(v))
              : r->SetFloat(message, f, static_cast<float>(v));
        } else {
          add ? r->AddDouble(message, f, v) : r->SetDouble(message, f, v);
        }
        return true;
      }
      case FieldDescriptor::CPPTYPE_BOOL: {
        bool v = false;
        if (!Bool(node, path, &v)) return false;
        add ? r->AddBool(message, f, v) : r->SetBool(message, f, v);
        return true;
      }
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string v;
        if (!String(node, path, &v)) return false;
        add ? r->AddString(message, f, v) : r->SetString(message, f, v);
        return true;
      }
      case FieldDescriptor::CPPTYPE_ENUM: {
        const EnumValueDescriptor* v = Enum(node, path, f->enum_type());
        if (v == nullptr) return false;
        add ? r->AddEnum(message, f, v) : r->SetEnum(message, f, v);
        return true;
      }
    }
    return false;
  }

  bool Int(const YAML::Node& node, const std::string& path, int64_t min, int64_t max,
           int64_t* out) {
    int64_t value = 0;
    if (!PlainScalar(node) || !absl::SimpleAtoi(node.Scalar(), &value)) {
      errors_->Add(path, absl::StrCat("expected an integer, got ", Describe(node)));
      return false;
    }
    if (value > max) {
      errors_->Add(path, absl::StrCat("must be <= ", max, ", got ", value));
      return false;
    }
    if (value < min) {
      errors_->Add(path, absl::StrCat("must be >= ", min, ", got ", value));
      return false;
    }
    *out = value;
    return true;
  }

  bool UInt(const YAML::Node& node, const std::string& path, uint64_t max, uint64_t* out) {
    uint64_t value = 0;
    if (!PlainScalar(node) || node.Scalar().empty() || node.Scalar()[0] == '-' ||
        !absl::SimpleAtoi(node.Scalar(), &value)) {
      errors_->Add(path, absl::StrCat("expected a non-negative integer, got ", Describe(node)));
      return false;
    }
    if (value > max) {
      errors_->Add(path, absl::StrCat("must be <= ", max, ", got ", value));
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

  const EnumValueDescriptor* Enum(const YAML::Node& node, const std::string& path,
                                  const EnumDescriptor* type) {
    std::string name;
    if (!String(node, path, &name)) return nullptr;
    for (int i = 0; i < type->value_count(); ++i) {
      const EnumValueDescriptor* v = type->value(i);
      if (v->number() != 0 && !QueryOnly(v) && EnumValueYamlName(v) == name) return v;
    }
    errors_->Add(path, absl::StrCat("unknown ", EnumWhat(type), " '", name, "'; use one of ",
                                    EnumChoices(type)));
    return nullptr;
  }

  Errors* errors_;
  Positions* positions_;
};

}  // namespace

std::string EnumValueYamlName(const EnumValueDescriptor* value) {
  // The prefix is what the zero value ("MODEL_TYPE_UNSPECIFIED") has before UNSPECIFIED.
  std::string prefix = value->type()->FindValueByNumber(0)->name();
  if (absl::EndsWith(prefix, "UNSPECIFIED")) prefix.resize(prefix.size() - strlen("UNSPECIFIED"));
  absl::string_view name = value->name();
  if (absl::StartsWith(name, prefix)) name.remove_prefix(prefix.size());
  return absl::AsciiStrToLower(name);
}

std::string EnumChoices(const EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) {
    const EnumValueDescriptor* v = type->value(i);
    if (v->number() != 0 && !QueryOnly(v)) names.push_back(EnumValueYamlName(v));
  }
  return absl::StrJoin(names, ", ");
}

std::string EnumName(const EnumDescriptor* type, int number) {
  const EnumValueDescriptor* v = type->FindValueByNumber(number);
  if (v == nullptr || number == 0 || QueryOnly(v)) return "unspecified";
  return EnumValueYamlName(v);
}

void ReadJobSpecDocument(const YAML::Node& root, Errors* errors, Positions* positions,
                         v1::JobSpec* spec) {
  Reader r(errors, positions);
  // The envelope Kubernetes users know; the job's name lives in metadata, the rest in spec.
  const std::vector<std::string> envelope = {"apiVersion", "kind", "metadata", "spec"};
  std::optional<std::map<std::string, YAML::Node>> top = r.Entries(root, "");
  if (!top.has_value()) return;
  for (const auto& entry : *top) {
    if (std::find(envelope.begin(), envelope.end(), entry.first) == envelope.end()) {
      r.UnknownField("", entry.first, envelope);
    }
  }
  std::string api_version, kind;
  if (!top->count("apiVersion")) {
    errors->Add("apiVersion", "is required; use substrax/v1");
  } else if (r.String(top->at("apiVersion"), "apiVersion", &api_version) &&
             api_version != "substrax/v1") {
    errors->Add("apiVersion", absl::StrCat("unsupported version '", api_version,
                                           "'; this coordinator speaks substrax/v1"));
  }
  if (!top->count("kind")) {
    errors->Add("kind", "is required; use TrainJob");
  } else if (r.String(top->at("kind"), "kind", &kind) && kind != "TrainJob") {
    errors->Add("kind", absl::StrCat("unsupported kind '", kind, "'; use TrainJob"));
  }
  if (top->count("metadata")) {
    if (auto meta = r.Entries(top->at("metadata"), "metadata")) {
      for (const auto& [key, value] : *meta) {
        if (key != "name") {
          r.UnknownField("metadata", key, {"name"});
        } else {
          r.String(value, "metadata.name", spec->mutable_name());
        }
      }
    }
  }
  if (!top->count("spec")) {
    errors->Add("spec", "is required: the job's model, data, optimizer, mesh and batch");
    return;
  }
  r.ReadMessage(top->at("spec"), "spec", spec, {"name"});
}

}  // namespace job_spec_internal

namespace yaml_message {

void ReadMessage(const YAML::Node& node, const std::string& path,
                 google::protobuf::Message* message, Errors* errors, Positions* positions) {
  job_spec_internal::Reader(errors, positions).ReadMessage(node, path, message);
}

}  // namespace yaml_message
}  // namespace substrax
