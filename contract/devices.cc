#include "contract/devices.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace substrax {

absl::StatusOr<std::vector<v1::Device>> DiscoverDevices(const std::string& spec,
                                                        const std::string& host) {
  if (spec == "cuda") return devices_internal::DiscoverCudaDevices(host);
  absl::string_view rest = spec;
  int n = 0;
  if (absl::ConsumePrefix(&rest, "cpu:") && absl::SimpleAtoi(rest, &n) && n >= 1 && n <= 256) {
    std::vector<v1::Device> devices;
    for (int i = 0; i < n; ++i) {
      v1::Device d;
      d.set_host(host);
      d.set_local_index(i);
      d.set_kind(v1::DEVICE_KIND_CPU);
      d.set_name("cpu");
      devices.push_back(std::move(d));
    }
    return devices;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "devices '", spec, "': expected 'cuda' (every visible GPU) or 'cpu:N' with N in 1..256"));
}

}  // namespace substrax
