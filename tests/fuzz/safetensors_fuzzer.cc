// Fuzz target: SafetensorsFile::Parse on any bytes (checkpoint shard files are read back from
// disks that may hold anything: a half-written or corrupted file).
//
// Checks: an accepted file hands out every tensor it lists with as many bytes as its shape and
// dtype say; encoding those tensors and metadata again parses to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/checkpoint/safetensors.h"

namespace substrax {
namespace {

void Check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "safetensors_fuzzer: %s\n", what);
  std::abort();
}

void FuzzSafetensors(const uint8_t* data, size_t size) {
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::Parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!file.ok()) return;
  std::vector<SafetensorsTensor> tensors;
  for (const std::string& name : file->names()) {
    absl::StatusOr<SafetensorsTensor> t = file->Tensor(name);
    Check(t.ok(), "a listed tensor cannot be read");
    uint64_t elements = 1;
    for (int64_t d : t->shape) elements *= static_cast<uint64_t>(d);
    Check(elements * SafetensorsDtypeSize(t->dtype) == t->bytes.size(),
          "a tensor's bytes do not match its shape");
    tensors.push_back(*std::move(t));
  }
  absl::StatusOr<std::string> again = EncodeSafetensors(tensors, file->metadata());
  Check(again.ok(), "an accepted file's tensors cannot be encoded");
  absl::StatusOr<SafetensorsFile> reread = SafetensorsFile::Parse(*std::move(again), "again");
  Check(reread.ok(), "an encoded file is refused");
  Check(reread->names() == file->names(), "names changed in a round trip");
  Check(reread->metadata() == file->metadata(), "metadata changed in a round trip");
  for (const SafetensorsTensor& t : tensors) {
    absl::StatusOr<SafetensorsTensor> r = reread->Tensor(t.name);
    Check(r.ok() && r->bytes == t.bytes && r->shape == t.shape && r->dtype == t.dtype,
          "a tensor changed in a round trip");
  }
}

}  // namespace
}  // namespace substrax

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  substrax::FuzzSafetensors(data, size);
  return 0;
}
