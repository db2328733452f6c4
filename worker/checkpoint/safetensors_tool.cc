// For tests/interop: `safetensors_tool write FILE` writes a fixed set of tensors;
// `safetensors_tool read FILE` prints every tensor ("NAME DTYPE [SHAPE] VALUES...", values as
// numbers; BF16 and F16 widened to float) and every metadata entry ("meta KEY VALUE"), sorted;
// `safetensors_tool checkpoint DIR` saves a fixed training state as the checkpoint of step 100
// of a job of 2 processes on a (data=2, model=2) mesh in the job's checkpoint directory DIR,
// and prints every array's global value as `read` prints a tensor.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/device.h"
#include "core/mesh.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/simulated_job.h"

namespace substrax {
namespace {

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

template <typename T>
T At(const std::string& bytes, size_t i) {
  T v;
  std::memcpy(&v, bytes.data() + i * sizeof(T), sizeof(T));
  return v;
}

float Half(uint16_t h) {  // IEEE binary16
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  if (exponent == 31) return mantissa ? NAN : sign * INFINITY;
  return sign * std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
}

std::string Value(const SafetensorsTensor& t, size_t i) {
  switch (t.dtype) {
    case SafetensorsDtype::kF32:
      return absl::StrFormat("%.9g", At<float>(t.bytes, i));
    case SafetensorsDtype::kF64:
      return absl::StrFormat("%.17g", At<double>(t.bytes, i));
    case SafetensorsDtype::kBF16: {
      const uint32_t bits = static_cast<uint32_t>(At<uint16_t>(t.bytes, i)) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return absl::StrFormat("%.9g", f);
    }
    case SafetensorsDtype::kF16:
      return absl::StrFormat("%.9g", Half(At<uint16_t>(t.bytes, i)));
    case SafetensorsDtype::kI64:
      return absl::StrCat(At<int64_t>(t.bytes, i));
    case SafetensorsDtype::kI32:
      return absl::StrCat(At<int32_t>(t.bytes, i));
    case SafetensorsDtype::kU8:
    case SafetensorsDtype::kBool:
      return absl::StrCat(static_cast<int>(static_cast<unsigned char>(t.bytes[i])));
  }
  return "?";
}

// "NAME DTYPE [SHAPE] VALUES..." on stdout.
void Print(const SafetensorsTensor& t) {
  std::vector<std::string> values;
  const size_t n = t.bytes.size() / SafetensorsDtypeSize(t.dtype);
  for (size_t i = 0; i < n; ++i) values.push_back(Value(t, i));
  std::cout << t.name << " " << SafetensorsDtypeName(t.dtype) << " ["
            << absl::StrJoin(t.shape, ",") << "] " << absl::StrJoin(values, " ") << "\n";
}

int Write(const std::string& path) {
  std::vector<float> weights;
  for (int i = 0; i < 6; ++i) weights.push_back(0.5f * i - 1.0f);
  absl::StatusOr<std::string> bytes = EncodeSafetensors(
      {{"dense/kernel", SafetensorsDtype::kF32, {2, 3}, Bytes(weights)},
       {"step", SafetensorsDtype::kI64, {}, Bytes<int64_t>({1234})},
       {"mask", SafetensorsDtype::kBool, {4}, std::string("\1\0\1\1", 4)},
       {"half", SafetensorsDtype::kBF16, {2}, Bytes<uint16_t>({0x3f80, 0xc000})},
       {"f64", SafetensorsDtype::kF64, {1}, Bytes<double>({0.1})}},
      {{"format", "substrax"}, {"step", "1234"}});
  if (!bytes.ok()) {
    std::cerr << bytes.status() << "\n";
    return 1;
  }
  std::ofstream(path, std::ios::binary) << *bytes;
  return 0;
}

int Read(const std::string& path) {
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::Read(path);
  if (!file.ok()) {
    std::cerr << file.status() << "\n";
    return 1;
  }
  for (const std::string& name : file->names()) {
    absl::StatusOr<SafetensorsTensor> t = file->Tensor(name);
    if (!t.ok()) return 1;
    Print(*t);
  }
  for (const auto& [key, value] : file->metadata()) {
    std::cout << "meta " << key << " " << value << "\n";
  }
  return 0;
}

// A parameter and its optimizer slot each, partitioned as a training job would: the kernel over
// both axes, the bias over "model" (replicated over "data"). Values of every magnitude and sign,
// so that a conversion that is not exact shows.
int Checkpoint(const std::string& dir) {
  const PartitionSpec both = PartitionSpec::Of({"data", "model"});
  const PartitionSpec model = PartitionSpec::Of({"model"});
  std::map<std::string, GlobalArray> state;
  int salt = 0;
  for (const auto& [name, shape, spec] :
       {std::tuple{"params/dense_0/kernel", std::vector<int64_t>{8, 6}, both},
        std::tuple{"params/dense_0/bias", std::vector<int64_t>{6}, model},
        std::tuple{"optimizer/dense_0/kernel/mu", std::vector<int64_t>{8, 6}, both},
        std::tuple{"optimizer/dense_0/bias/mu", std::vector<int64_t>{6}, model}}) {
    Tensor value(shape);
    ++salt;
    for (int64_t i = 0; i < value.size(); ++i) {
      value.data()[i] = static_cast<float>(std::sin(1.3 * i + salt) * std::pow(10.0, i % 7 - 3));
    }
    state[name] = {std::move(value), spec};
  }
  const Mesh mesh = *Mesh::Create({"data", "model"}, {2, 2}, MakeUniformCluster(2, 2));
  absl::StatusOr<SimulatedJob> job = SimulatedJob::Create(mesh, state);
  absl::Status saved = job.ok() ? job->Save(dir, 100) : job.status();
  if (!saved.ok()) {
    std::cerr << saved << "\n";
    return 1;
  }
  for (const auto& [name, array] : state) {
    Print({name, SafetensorsDtype::kF32, array.value.shape(),
           std::string(reinterpret_cast<const char*>(array.value.data()),
                       array.value.size() * sizeof(float))});
  }
  return 0;
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "write") return substrax::Write(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "read") return substrax::Read(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "checkpoint") return substrax::Checkpoint(argv[2]);
  std::cerr << "usage: safetensors_tool write|read FILE, safetensors_tool checkpoint DIR\n";
  return 2;
}
