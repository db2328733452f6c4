#include "worker/checkpoint/sharded.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "google/protobuf/util/json_util.h"

namespace substrax {
namespace {

constexpr int kFormatVersion = 1;

std::string RangesText(const std::vector<IndexRange>& index) {
  std::vector<std::string> parts;
  for (const IndexRange& r : index) parts.push_back(absl::StrCat(r.start, ":", r.limit));
  return absl::StrJoin(parts, ",");
}

std::vector<IndexRange> FromProto(const google::protobuf::RepeatedPtrField<v1::IndexRange>& p) {
  std::vector<IndexRange> out;
  for (const v1::IndexRange& r : p) out.push_back({r.start(), r.limit()});
  return out;
}

int64_t Volume(const std::vector<IndexRange>& index) {
  int64_t n = 1;
  for (const IndexRange& r : index) n *= std::max<int64_t>(0, r.size());
  return n;
}

// The intersection of two blocks of the same rank; empty when they do not meet.
std::vector<IndexRange> Intersect(const std::vector<IndexRange>& a,
                                  const std::vector<IndexRange>& b) {
  std::vector<IndexRange> out(a.size());
  for (size_t d = 0; d < a.size(); ++d) {
    out[d] = {std::max(a[d].start, b[d].start), std::min(a[d].limit, b[d].limit)};
    if (out[d].limit <= out[d].start) return {};
  }
  return out;
}

// Copies the elements of `region` (global indices) from the row-major block `from` (covering
// `from_index`) into the row-major block `to` (covering `to_index`).
void CopyRegion(const float* from, const std::vector<IndexRange>& from_index, float* to,
                const std::vector<IndexRange>& to_index, const std::vector<IndexRange>& region) {
  const size_t rank = region.size();
  if (rank == 0) {
    *to = *from;
    return;
  }
  auto offset = [rank](const std::vector<IndexRange>& block, const std::vector<int64_t>& at) {
    int64_t o = 0;
    for (size_t d = 0; d < rank; ++d) o = o * block[d].size() + (at[d] - block[d].start);
    return o;
  };
  std::vector<int64_t> at(rank);
  for (size_t d = 0; d < rank; ++d) at[d] = region[d].start;
  const int64_t run = region[rank - 1].size();
  while (true) {
    std::memcpy(to + offset(to_index, at), from + offset(from_index, at), run * sizeof(float));
    // The next run: an odometer over every dimension but the last.
    int d = static_cast<int>(rank) - 2;
    for (; d >= 0; --d) {
      if (++at[d] < region[d].limit) break;
      at[d] = region[d].start;
    }
    if (d < 0) return;
  }
}

}  // namespace

absl::StatusOr<ProcessShards> EncodeProcessShards(int process_index,
                                                  const std::map<std::string, LocalArray>& arrays) {
  ProcessShards out;
  out.entry.set_name(absl::StrFormat("process-%05d.safetensors", process_index));
  out.entry.set_process_index(process_index);
  std::vector<SafetensorsTensor> tensors;
  for (const auto& [name, array] : arrays) {
    for (const auto& [device_id, tensor] : array.shards) {
      absl::StatusOr<ShardSlice> slice = array.layout.ForDevice(device_id);
      if (!slice.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "array ", name, ": device ", device_id, " is not in its layout's mesh"));
      }
      // Another device holds the same block as replica 0 and writes it.
      if (slice->replica_id != 0) continue;
      if (tensor->shape() != slice->shape()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "array ", name, ": the shard of device ", device_id, " has shape ",
            ShapeToString(tensor->shape()), ", its slice ", ShapeToString(slice->shape())));
      }
      SafetensorsTensor t;
      t.name = absl::StrCat(name, "@", RangesText(slice->index));
      t.dtype = SafetensorsDtype::kF32;
      t.shape = tensor->shape();
      t.bytes.assign(reinterpret_cast<const char*>(tensor->data()),
                     static_cast<size_t>(tensor->size()) * sizeof(float));
      v1::CheckpointShard* shard = out.entry.add_shards();
      shard->set_array(name);
      shard->set_tensor(t.name);
      for (const IndexRange& r : slice->index) {
        v1::IndexRange* p = shard->add_index();
        p->set_start(r.start);
        p->set_limit(r.limit);
      }
      tensors.push_back(std::move(t));
    }
  }
  absl::StatusOr<std::string> contents = EncodeSafetensors(
      tensors, {{"format", "substrax-checkpoint"}, {"process_index", absl::StrCat(process_index)}});
  if (!contents.ok()) return contents.status();
  out.contents = *std::move(contents);
  out.entry.set_xxh3(Xxh3Hex(out.contents));
  out.entry.set_size_bytes(static_cast<int64_t>(out.contents.size()));
  return out;
}

absl::StatusOr<v1::CheckpointManifest> MakeManifest(int64_t step, const Mesh& mesh,
                                                    const std::map<std::string, LocalArray>& arrays,
                                                    std::vector<v1::CheckpointFile> files) {
  v1::CheckpointManifest manifest;
  manifest.set_format_version(kFormatVersion);
  manifest.set_step(step);
  *manifest.mutable_mesh() = mesh.ToProto();
  std::map<std::string, std::vector<std::vector<IndexRange>>> blocks;
  for (const v1::CheckpointFile& file : files) {
    for (const v1::CheckpointShard& shard : file.shards()) {
      if (arrays.count(shard.array()) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(file.name(), " holds array ",
                                                       shard.array(), ", which is not saved"));
      }
      blocks[shard.array()].push_back(FromProto(shard.index()));
    }
  }
  for (const auto& [name, array] : arrays) {
    v1::CheckpointArray* a = manifest.add_arrays();
    a->set_name(name);
    for (int64_t d : array.layout.global_shape) a->add_global_shape(d);
    *a->mutable_spec() = array.layout.spec.ToProto();
    a->set_dtype(SafetensorsDtypeName(SafetensorsDtype::kF32));
    // Exactly once: the blocks are disjoint and as many elements as the array has.
    const std::vector<std::vector<IndexRange>>& held = blocks[name];
    int64_t covered = 0;
    for (size_t i = 0; i < held.size(); ++i) {
      covered += Volume(held[i]);
      for (size_t j = 0; j < i; ++j) {
        if (!Intersect(held[i], held[j]).empty() && Volume(held[i]) > 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "array ", name, ": block ", RangesText(held[i]), " is written twice (overlaps ",
              RangesText(held[j]), ")"));
        }
      }
    }
    std::vector<IndexRange> whole;
    for (int64_t d : array.layout.global_shape) whole.push_back({0, d});
    if (covered != Volume(whole)) {
      return absl::InvalidArgumentError(
          absl::StrCat("array ", name, ": the shard files hold ", covered, " of its ",
                       Volume(whole), " elements (a process's file is missing)"));
    }
  }
  for (v1::CheckpointFile& file : files) *manifest.add_files() = std::move(file);
  return manifest;
}

absl::StatusOr<CheckpointReader> CheckpointReader::Open(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("no checkpoint manifest at ", path));
  std::stringstream text;
  text << in.rdbuf();
  v1::CheckpointManifest manifest;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &manifest).ok() ||
      manifest.format_version() != kFormatVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a checkpoint manifest of format version ", kFormatVersion));
  }
  return CheckpointReader(dir, std::move(manifest));
}

absl::StatusOr<const SafetensorsFile*> CheckpointReader::File(const v1::CheckpointFile& entry) {
  auto found = files_.find(entry.name());
  if (found != files_.end()) return &found->second;
  const std::string path = absl::StrCat(dir_, "/", entry.name());
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return absl::NotFoundError(absl::StrCat("checkpoint shard file ", path, " is missing"));
  // One read of the whole file (an istreambuf_iterator, a byte at a time, was most of a
  // checkpoint read's time: bench/checkpoint). A file cut short meanwhile reads short, and fails
  // the size check below.
  const std::streamoff size = in.tellg();
  std::string contents(static_cast<size_t>(std::max<std::streamoff>(size, 0)), '\0');
  in.seekg(0);
  in.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  contents.resize(static_cast<size_t>(in.gcount()));
  if (static_cast<int64_t>(contents.size()) != entry.size_bytes() ||
      Xxh3Hex(contents) != entry.xxh3()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint shard file ", path, " is damaged: ", contents.size(), " bytes, xxh3 ",
        Xxh3Hex(contents), "; the manifest says ", entry.size_bytes(), " bytes, xxh3 ",
        entry.xxh3()));
  }
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Parse(std::move(contents), path);
  if (!file.ok()) return absl::DataLossError(file.status().message());
  return &files_.emplace(entry.name(), *std::move(file)).first->second;
}

absl::StatusOr<Tensor> CheckpointReader::ReadWhole(const std::string& name) {
  for (const v1::CheckpointArray& array : manifest_.arrays()) {
    if (array.name() != name) continue;
    std::vector<IndexRange> whole;
    for (int64_t d : array.global_shape()) whole.push_back({0, d});
    return ReadBlock(name, whole);
  }
  return ReadBlock(name, {});  // its NOT_FOUND names the arrays there are
}

absl::StatusOr<TensorTree> CheckpointReader::ReadArrays(absl::string_view prefix) {
  TensorTree arrays;
  for (const v1::CheckpointArray& array : manifest_.arrays()) {
    if (!absl::StartsWith(array.name(), prefix)) continue;
    SUBSTRAX_ASSIGN_OR_RETURN(arrays[array.name()], ReadWhole(array.name()));
  }
  return arrays;
}

absl::Status CheckpointReader::VerifyAll() {
  for (const v1::CheckpointFile& entry : manifest_.files()) {
    if (absl::StatusOr<const SafetensorsFile*> file = File(entry); !file.ok()) {
      return file.status();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> CheckpointReader::ReadBlock(const std::string& name,
                                                   const std::vector<IndexRange>& index) {
  const v1::CheckpointArray* array = nullptr;
  for (const v1::CheckpointArray& a : manifest_.arrays()) {
    if (a.name() == name) array = &a;
  }
  if (array == nullptr) {
    return absl::NotFoundError(absl::StrCat("the checkpoint of step ", manifest_.step(),
                                            " has no array ", name));
  }
  bool fits = static_cast<int>(index.size()) == array->global_shape_size();
  for (size_t d = 0; fits && d < index.size(); ++d) {
    fits = index[d].start >= 0 && index[d].start <= index[d].limit &&
           index[d].limit <= array->global_shape(static_cast<int>(d));
  }
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block ", RangesText(index), " does not fit array ", name, " of shape ",
        ShapeToString(std::vector<int64_t>(array->global_shape().begin(),
                                           array->global_shape().end()))));
  }
  std::vector<int64_t> shape;
  for (const IndexRange& r : index) shape.push_back(r.size());
  Tensor out(shape);
  if (out.size() == 0) return out;
  for (const v1::CheckpointFile& entry : manifest_.files()) {
    for (const v1::CheckpointShard& shard : entry.shards()) {
      if (shard.array() != name) continue;
      const std::vector<IndexRange> held = FromProto(shard.index());
      const std::vector<IndexRange> region = Intersect(held, index);
      if (region.empty() && !index.empty()) continue;
      absl::StatusOr<const SafetensorsFile*> file = File(entry);
      if (!file.ok()) return file.status();
      absl::StatusOr<SafetensorsTensor> t = (*file)->Tensor(shard.tensor());
      std::vector<int64_t> held_shape;
      for (const IndexRange& r : held) held_shape.push_back(r.size());
      if (!t.ok() || t->dtype != SafetensorsDtype::kF32 || t->shape != held_shape) {
        return absl::DataLossError(absl::StrCat(
            "checkpoint shard file ", entry.name(), " does not hold ", shard.tensor(),
            " as F32 of shape ", ShapeToString(held_shape), " as the manifest says"));
      }
      CopyRegion(reinterpret_cast<const float*>(t->bytes.data()), held, out.data(), index,
                 region);
    }
  }
  return out;
}

}  // namespace substrax
