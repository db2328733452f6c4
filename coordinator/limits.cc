#include "coordinator/limits.h"

#include "absl/strings/str_cat.h"

namespace substrax {

std::string BoundedText(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  size_t cut = max_bytes;
  // Back off continuation bytes (10xxxxxx) so that a multi-byte character is not split.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(text.substr(0, cut), " ... (", text.size() - cut, " more bytes)");
}

absl::Status CheckName(absl::string_view field, absl::string_view value) {
  if (value.size() <= limits::kMaxNameBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(),
                                                 " bytes, more than the limit of ",
                                                 limits::kMaxNameBytes));
}

absl::Status CheckReportLimits(const v1::ReportStepsRequest& request) {
  if (request.reports_size() > limits::kMaxReportsPerRequest) {
    return absl::InvalidArgumentError(
        absl::StrCat("reports: ", request.reports_size(), " in one request, more than the limit of ",
                     limits::kMaxReportsPerRequest, "; send them in several requests"));
  }
  for (int i = 0; i < request.reports_size(); ++i) {
    const v1::StepReport& report = request.reports(i);
    if (report.values_size() > limits::kMaxValuesPerReport) {
      return absl::InvalidArgumentError(absl::StrCat(
          "reports[", i, "].values: ", report.values_size(), " metrics, more than the limit of ",
          limits::kMaxValuesPerReport));
    }
    for (const auto& [name, value] : report.values()) {
      if (name.size() > limits::kMaxNameBytes) {
        return CheckName(absl::StrCat("reports[", i, "].values name '",
                                      name.substr(0, 32), "...'"),
                         name);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace substrax
