#include "worker/checkpoint/safetensors.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "xxhash.h"

namespace substrax {
namespace {

// The reference implementation's limit: a larger header is refused before it is parsed.
constexpr int64_t kMaxHeaderBytes = 100'000'000;
constexpr char kMetadataKey[] = "__metadata__";

struct DtypeInfo {
  SafetensorsDtype dtype;
  const char* name;
  int size;
};
constexpr DtypeInfo kDtypes[] = {
    {SafetensorsDtype::kF32, "F32", 4},   {SafetensorsDtype::kF64, "F64", 8},
    {SafetensorsDtype::kF16, "F16", 2},   {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kI64, "I64", 8},   {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kU8, "U8", 1},     {SafetensorsDtype::kBool, "BOOL", 1},
};

const DtypeInfo& InfoOf(SafetensorsDtype dtype) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.dtype == dtype) return d;
  }
  return kDtypes[0];  // unreachable: every enumerator is in the table
}

// A JSON string literal.
std::string Quote(absl::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Elements of `shape`, or -1 when a dimension is negative or the product overflows int64.
int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

// A JSON number that must be a non-negative integer (safetensors' offsets and dimensions).
bool AsCount(const google::protobuf::Value& v, int64_t* out) {
  if (v.kind_case() != google::protobuf::Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0) || d > 9007199254740992.0 || std::floor(d) != d) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

}  // namespace

std::string SafetensorsDtypeName(SafetensorsDtype dtype) { return InfoOf(dtype).name; }

int SafetensorsDtypeSize(SafetensorsDtype dtype) { return InfoOf(dtype).size; }

absl::StatusOr<SafetensorsDtype> ParseSafetensorsDtype(absl::string_view name) {
  for (const DtypeInfo& d : kDtypes) {
    if (d.name == name) return d.dtype;
  }
  std::vector<std::string> known;
  for (const DtypeInfo& d : kDtypes) known.push_back(d.name);
  return absl::InvalidArgumentError(absl::StrCat("dtype '", name, "' is not one of ",
                                                 absl::StrJoin(known, ", ")));
}

absl::StatusOr<std::string> EncodeSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  std::map<std::string, const SafetensorsTensor*> by_name;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name '", t.name, "' is reserved"));
    }
    if (!by_name.emplace(t.name, &t).second) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "' given twice"));
    }
    const int64_t elements = Elements(t.shape);
    if (elements < 0 || static_cast<uint64_t>(elements) * SafetensorsDtypeSize(t.dtype) !=
                            t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.name, "': shape [", absl::StrJoin(t.shape, ", "), "] of ",
          SafetensorsDtypeName(t.dtype), " does not match its ", t.bytes.size(), " bytes"));
    }
  }
  std::vector<std::string> fields;
  if (!metadata.empty()) {
    std::vector<std::string> items;
    for (const auto& [key, value] : metadata) items.push_back(Quote(key) + ":" + Quote(value));
    fields.push_back(absl::StrCat(Quote(kMetadataKey), ":{", absl::StrJoin(items, ","), "}"));
  }
  int64_t offset = 0;
  for (const auto& [name, t] : by_name) {
    const int64_t end = offset + static_cast<int64_t>(t->bytes.size());
    fields.push_back(absl::StrCat(Quote(name), ":{\"dtype\":\"", SafetensorsDtypeName(t->dtype),
                                  "\",\"shape\":[", absl::StrJoin(t->shape, ","),
                                  "],\"data_offsets\":[", offset, ",", end, "]}"));
    offset = end;
  }
  std::string header = absl::StrCat("{", absl::StrJoin(fields, ","), "}");
  // The data starts 8-aligned, as the reference implementation pads it.
  header.append((8 - (header.size() % 8)) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += header;
  out.reserve(out.size() + offset);
  for (const auto& [name, t] : by_name) out += t->bytes;
  return out;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string contents,
                                                      const std::string& source) {
  auto bad = [&source](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a safetensors file: ", what));
  };
  if (contents.size() < 8) return bad(absl::StrCat("only ", contents.size(), " bytes"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(contents[i]);
  if (n > static_cast<uint64_t>(kMaxHeaderBytes) || n > contents.size() - 8) {
    return bad(absl::StrCat("a header of ", n, " bytes but the file has ", contents.size() - 8,
                            " after the length (limit ", kMaxHeaderBytes, ")"));
  }
  const std::string header = contents.substr(8, n);
  if (header.empty() || header[0] != '{') return bad("the header is not a JSON object");
  google::protobuf::Struct json;
  if (!google::protobuf::util::JsonStringToMessage(header, &json).ok()) {
    return bad("the header is not valid JSON");
  }
  SafetensorsFile file;
  file.source_ = source;
  file.data_start_ = static_cast<int64_t>(8 + n);
  const int64_t data_size = static_cast<int64_t>(contents.size()) - file.data_start_;
  for (const auto& [name, value] : json.fields()) {
    const std::string where = absl::StrCat("tensor '", name, "'");
    // What EncodeSafetensors cannot write is not read either.
    if (name.empty()) return bad("a tensor has an empty name");
    if (value.kind_case() != google::protobuf::Value::kStructValue) {
      return bad(absl::StrCat(where, " is not an object"));
    }
    const auto& fields = value.struct_value().fields();
    if (name == kMetadataKey) {
      for (const auto& [key, v] : fields) {
        if (v.kind_case() != google::protobuf::Value::kStringValue) {
          return bad(absl::StrCat("metadata '", key, "' is not a string"));
        }
        file.metadata_[key] = v.string_value();
      }
      continue;
    }
    auto dtype = fields.find("dtype");
    auto shape = fields.find("shape");
    auto offsets = fields.find("data_offsets");
    if (dtype == fields.end() || shape == fields.end() || offsets == fields.end() ||
        dtype->second.kind_case() != google::protobuf::Value::kStringValue ||
        shape->second.kind_case() != google::protobuf::Value::kListValue ||
        offsets->second.kind_case() != google::protobuf::Value::kListValue ||
        offsets->second.list_value().values_size() != 2) {
      return bad(absl::StrCat(where, " needs dtype, shape and data_offsets [begin, end]"));
    }
    absl::StatusOr<SafetensorsDtype> parsed = ParseSafetensorsDtype(dtype->second.string_value());
    if (!parsed.ok()) return bad(absl::StrCat(where, ": ", parsed.status().message()));
    Entry e;
    e.dtype = *parsed;
    for (const google::protobuf::Value& d : shape->second.list_value().values()) {
      int64_t dim = 0;
      if (!AsCount(d, &dim)) return bad(absl::StrCat(where, ": a dimension is not a count"));
      e.shape.push_back(dim);
    }
    if (!AsCount(offsets->second.list_value().values(0), &e.begin) ||
        !AsCount(offsets->second.list_value().values(1), &e.end) || e.end < e.begin ||
        e.end > data_size) {
      return bad(absl::StrCat(where, ": data_offsets out of the ", data_size, " data bytes"));
    }
    const int64_t elements = Elements(e.shape);
    if (elements < 0 || elements > INT64_MAX / SafetensorsDtypeSize(e.dtype) ||
        elements * SafetensorsDtypeSize(e.dtype) != e.end - e.begin) {
      return bad(absl::StrCat(where, ": its shape does not match its ", e.end - e.begin,
                              " bytes"));
    }
    file.entries_[name] = std::move(e);
  }
  // The tensors tile the data exactly: no gap, no overlap, nothing after the last.
  std::map<int64_t, std::pair<int64_t, std::string>> spans;
  for (const auto& [name, e] : file.entries_) {
    if (e.end == e.begin) continue;  // an empty tensor takes no bytes
    if (!spans.emplace(e.begin, std::make_pair(e.end, name)).second) {
      return bad(absl::StrCat("tensor '", name, "' overlaps another"));
    }
  }
  int64_t at = 0;
  for (const auto& [begin, span] : spans) {
    if (begin != at) {
      return bad(absl::StrCat("tensor '", span.second, "' starts at ", begin, ", not at ", at));
    }
    at = span.first;
  }
  if (at != data_size) {
    return bad(absl::StrCat("the tensors cover ", at, " of the ", data_size, " data bytes"));
  }
  file.contents_ = std::move(contents);
  return file;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Read(const std::string& path, int64_t max_bytes) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, more than the limit of ", max_bytes));
  }
  std::string contents(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(contents.data(), size)) {
    return absl::DataLossError(absl::StrCat("cannot read all of ", path));
  }
  return Parse(std::move(contents), path);
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> names;
  for (const auto& [name, e] : entries_) names.push_back(name);
  return names;
}

absl::StatusOr<SafetensorsTensor> SafetensorsFile::Tensor(const std::string& name) const {
  auto e = entries_.find(name);
  if (e == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(source_, " has no tensor '", name, "' (it has ",
                                            absl::StrJoin(names(), ", "), ")"));
  }
  SafetensorsTensor t;
  t.name = name;
  t.dtype = e->second.dtype;
  t.shape = e->second.shape;
  t.bytes = contents_.substr(static_cast<size_t>(data_start_ + e->second.begin),
                             static_cast<size_t>(e->second.end - e->second.begin));
  return t;
}

std::string Xxh3Hex(absl::string_view data) {
  return absl::StrFormat("%016x", XXH3_64bits(data.data(), data.size()));
}

}  // namespace substrax
