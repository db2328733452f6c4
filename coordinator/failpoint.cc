#include "coordinator/failpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "absl/strings/str_split.h"

namespace substrax {
namespace {

const std::set<std::string>& Armed() {
  static const std::set<std::string>* armed = [] {
    auto* names = new std::set<std::string>();
    if (const char* env = std::getenv("SUBSTRAX_FAILPOINTS"); env != nullptr) {
      for (absl::string_view name : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
        names->insert(std::string(name));
      }
    }
    return names;
  }();
  return *armed;
}

}  // namespace

bool FailpointArmed(absl::string_view name) { return Armed().count(std::string(name)) > 0; }

void Failpoint(absl::string_view name) {
  if (!FailpointArmed(name)) return;
  std::fprintf(stderr, "substrax-coordinator: failpoint %.*s: SIGKILL\n",
               static_cast<int>(name.size()), name.data());
  std::fflush(stderr);
  kill(getpid(), SIGKILL);
}

}  // namespace substrax
