#include "client/args.h"

#include <cstdint>
#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace substrax::ctl {

bool IsUnreachable(absl::StatusCode code) {
  return code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded;
}

int ExitCodeForStatus(absl::StatusCode code) {
  if (code == absl::StatusCode::kOk) return kExitOk;
  if (IsUnreachable(code)) return kExitUnreachable;
  if (code == absl::StatusCode::kInvalidArgument) return kExitUsage;
  return kExitError;
}

absl::StatusOr<OutputFormat> ParseOutputFormat(absl::string_view text) {
  if (text == "table") return OutputFormat::kTable;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(
      absl::StrCat("-o: '", text, "' is not an output format; use table, json or yaml"));
}

namespace {

absl::StatusOr<int64_t> ParseStep(absl::string_view text, absl::string_view whole) {
  int64_t step = 0;
  if (!absl::SimpleAtoi(text, &step) || text.empty() || text[0] == '+') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--steps: '", whole, "': '", text,
        "' is not a step number; use A:B, A: (to the latest), :B or A, e.g. 100:200"));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--steps: '", whole, "': steps are >= 0, got ", step));
  }
  return step;
}

}  // namespace

absl::StatusOr<v1::StepRange> ParseStepRange(absl::string_view text) {
  const absl::string_view whole = text;
  text = absl::StripAsciiWhitespace(text);
  v1::StepRange range;
  if (text.empty() || text == ":") return range;
  std::vector<absl::string_view> parts = absl::StrSplit(text, ':');
  if (parts.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--steps: '", whole, "': more than one ':'; use A:B, A: (to the latest), :B or A"));
  }
  if (parts.size() == 1) {
    auto step = ParseStep(parts[0], whole);
    if (!step.ok()) return step.status();
    if (*step == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--steps: '", whole, "': a single step must be >= 1"));
    }
    range.set_first(*step);
    range.set_last(*step);
    return range;
  }
  if (!parts[0].empty()) {
    auto first = ParseStep(parts[0], whole);
    if (!first.ok()) return first.status();
    range.set_first(*first);
  }
  if (!parts[1].empty()) {
    auto last = ParseStep(parts[1], whole);
    if (!last.ok()) return last.status();
    // The wire's last = 0 means "to the latest"; an explicit end must be a real step.
    if (*last == 0 || *last < range.first()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--steps: '", whole, "': the range is empty (", *last, " < ",
          std::max<int64_t>(range.first(), 1), "); write A: to mean from A to the latest"));
    }
    range.set_last(*last);
  }
  return range;
}

absl::StatusOr<std::vector<v1::JobState>> ParseJobStates(absl::string_view text) {
  std::vector<v1::JobState> states;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::string name =
        absl::StrCat("JOB_STATE_", absl::AsciiStrToUpper(absl::StripAsciiWhitespace(part)));
    v1::JobState state;
    if (!v1::JobState_Parse(name, &state) || state == v1::JOB_STATE_UNSPECIFIED) {
      return absl::InvalidArgumentError(
          absl::StrCat("--state: unknown state '", absl::StripAsciiWhitespace(part),
                       "'; use pending, running, succeeded, failed or cancelled"));
    }
    states.push_back(state);
  }
  return states;
}

absl::StatusOr<v1::Reduction> ParseReduction(absl::string_view text) {
  if (text.empty()) return v1::REDUCTION_UNSPECIFIED;
  v1::Reduction reduction;
  if (!v1::Reduction_Parse(absl::StrCat("REDUCTION_", absl::AsciiStrToUpper(text)),
                           &reduction) ||
      reduction == v1::REDUCTION_UNSPECIFIED) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--reduce: '", text, "' is not a reduction; use mean, sum, max, min or none"));
  }
  return reduction;
}

absl::StatusOr<v1::GroupBy> ParseGroupBy(absl::string_view text) {
  if (text.empty()) return v1::GROUP_BY_NONE;
  v1::GroupBy group_by;
  if (!v1::GroupBy_Parse(absl::StrCat("GROUP_BY_", absl::AsciiStrToUpper(text)), &group_by) ||
      group_by == v1::GROUP_BY_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("--group-by: '", text, "' is not a grouping; use device, host or none"));
  }
  return group_by;
}

absl::StatusOr<absl::Duration> ParseTimeout(absl::string_view text) {
  absl::Duration d;
  if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration() || d == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout: '", text, "' is not a positive duration such as 10s or 500ms"));
  }
  return d;
}

absl::StatusOr<WorkersShape> ParseWorkersShape(absl::string_view text) {
  constexpr int64_t kMax = 65536;
  const std::string lower = absl::AsciiStrToLower(text);
  const std::vector<absl::string_view> parts = absl::StrSplit(lower, 'x');
  int64_t n = 0, d = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &n) || !absl::SimpleAtoi(parts[1], &d)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers: '", text, "' is not WORKERSxDEVICES, e.g. 2x2 for 2 workers of 2 devices"));
  }
  if (n < 1 || d < 1 || n > kMax || d > kMax || n * d > kMax) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--workers: '", text, "': each number must be 1 to ", kMax, " and so must their product"));
  }
  return WorkersShape{static_cast<int>(n), static_cast<int>(d)};
}

std::string ResolveCoordinator(absl::string_view flag, absl::string_view env,
                               const std::string& local_address_file) {
  if (!flag.empty()) return std::string(flag);
  if (!env.empty()) return std::string(env);
  std::ifstream in(local_address_file);
  std::string line;
  if (in && std::getline(in, line)) {
    absl::string_view address = absl::StripAsciiWhitespace(line);
    if (!address.empty()) return std::string(address);
  }
  return kDefaultCoordinator;
}

std::string LocalTlsDir(absl::string_view state_dir) { return absl::StrCat(state_dir, "/tls"); }

TransportOptions ResolveTransport(TransportOptions flags,
                                  const std::function<std::string(const char*)>& env,
                                  const std::string& local_tls_dir) {
  if (flags.insecure) return flags;
  for (auto [field, name] : {std::pair{&flags.ca_file, kTlsCaEnv},
                             std::pair{&flags.cert_file, kTlsCertEnv},
                             std::pair{&flags.key_file, kTlsKeyEnv},
                             std::pair{&flags.token_file, kTokenFileEnv}}) {
    if (field->empty()) *field = env(name);
  }
  if (!flags.ca_file.empty()) return flags;
  const std::string ca = local_tls_dir + "/ca.crt";
  if (!std::ifstream(ca)) return flags;
  flags.ca_file = ca;
  if (flags.cert_file.empty() && flags.token_file.empty()) {
    flags.cert_file = local_tls_dir + "/admin.crt";
    flags.key_file = local_tls_dir + "/admin.key";
  }
  return flags;
}

std::string UserPath(const std::string& path, absl::string_view working_directory) {
  if (path.empty() || path[0] == '/' || working_directory.empty()) return path;
  return absl::StrCat(working_directory, "/", path);
}

}  // namespace substrax::ctl
