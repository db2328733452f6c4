// An SDK program for //tests/launch:launch_contract_test: it joins its job through
// substrax::Init (which logs the launch it read) and writes back, through the SDK's own API,
// what the Program says it is: "program process P of N, devices D".
#include <cstdio>
#include <string>

#include "absl/strings/str_join.h"
#include "substrax/substrax.h"

int main() {
  absl::StatusOr<std::unique_ptr<substrax::Program>> program = substrax::Init();
  if (!program.ok()) {
    std::fprintf(stderr, "sdk_echo: %s\n", program.status().ToString().c_str());
    return 1;
  }
  std::printf("program process %d of %d, devices %s\n", (*program)->process_index(),
              (*program)->num_processes(),
              absl::StrJoin((*program)->local_device_ids(), ",").c_str());
  std::fflush(stdout);
  return (*program)->Finish(absl::OkStatus());
}
