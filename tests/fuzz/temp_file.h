// TempFile: a file the data fuzz targets write an input to, because the readers they fuzz take
// paths. One per process (TEST_TMPDIR when Bazel sets it, else /tmp), rewritten for every input.
#ifndef SUBSTRAX_TESTS_FUZZ_TEMP_FILE_H_
#define SUBSTRAX_TESTS_FUZZ_TEMP_FILE_H_

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

namespace substrax {

class TempFile {
 public:
  // `name` tells the files of one process apart ("images", "labels").
  explicit TempFile(const std::string& name) {
    const char* dir = std::getenv("TEST_TMPDIR");
    path_ = std::string(dir != nullptr ? dir : "/tmp") + "/substrax_fuzz_" +
            std::to_string(getpid()) + "_" + name;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  // Replaces the file's contents; aborts when it cannot (the fuzzer would test nothing).
  const std::string& Write(const std::string& contents) {
    std::ofstream file(path_, std::ios::binary | std::ios::trunc);
    file.write(contents.data(), static_cast<std::streamsize>(contents.size()));
    file.close();
    if (!file) {
      std::fprintf(stderr, "cannot write %s\n", path_.c_str());
      std::abort();
    }
    return path_;
  }

 private:
  std::string path_;
};

}  // namespace substrax

#endif  // SUBSTRAX_TESTS_FUZZ_TEMP_FILE_H_
