// The main of the corpus replay tests: runs a fuzz target's LLVMFuzzerTestOneInput over every
// file of the directories (or files) given as arguments, as libFuzzer does when given a corpus,
// so that the saved inputs are checked by every `bazel test //...`, without libFuzzer or clang.
// A crash is the target's own abort (or a sanitizer's report under --config=asan/ubsan); an
// empty corpus fails, so that a wrong path cannot pass unnoticed.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

std::vector<std::filesystem::path> InputsOf(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> inputs;
  if (std::filesystem::is_regular_file(root)) return {root};
  std::error_code error;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root, error)) {
    if (entry.is_regular_file()) inputs.push_back(entry.path());
  }
  if (error) std::fprintf(stderr, "cannot list %s: %s\n", root.c_str(), error.message().c_str());
  return inputs;
}

}  // namespace

int main(int argc, char** argv) {
  size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    for (const std::filesystem::path& path : InputsOf(argv[i])) {
      std::ifstream file(path, std::ios::binary);
      const std::string bytes((std::istreambuf_iterator<char>(file)),
                              std::istreambuf_iterator<char>());
      if (!file.good() && !file.eof()) {
        std::fprintf(stderr, "cannot read %s\n", path.c_str());
        return 1;
      }
      std::fprintf(stderr, "replaying %s (%zu bytes)\n", path.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
      ++replayed;
    }
  }
  if (replayed == 0) {
    std::fprintf(stderr, "no corpus inputs found in the arguments\n");
    return 1;
  }
  std::fprintf(stderr, "%zu inputs replayed without a crash\n", replayed);
  return 0;
}
