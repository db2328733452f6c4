#include "bench/host.h"

#include <fstream>

#include "absl/strings/str_cat.h"

namespace substrax::bench {

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return absl::StrCat(one, " ", five);
}

}  // namespace substrax::bench
