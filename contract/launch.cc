#include "contract/launch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/files.h"
#include "google/protobuf/util/json_util.h"

namespace substrax {

std::string EncodeLaunch(const v1::ProgramLaunch& launch) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string json;
  // Only fails for messages with Any fields of unknown types; ProgramLaunch has none.
  (void)google::protobuf::util::MessageToJsonString(launch, &json, options);
  return json + "\n";
}

absl::Status WriteLaunchFile(const std::string& path, const v1::ProgramLaunch& launch) {
  return WriteFileAtomically(path, EncodeLaunch(launch), 0600);
}

absl::StatusOr<v1::ProgramLaunch> ReadLaunchFile(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadWholeFile(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kLaunchEnv, " names ", path, ", which cannot be read (", contents.status().message(),
        "); a job's process is started by a substrax agent, which sets ", kLaunchEnv,
        "; an SDK program runs standalone without it"));
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  v1::ProgramLaunch launch;
  const auto parsed = google::protobuf::util::JsonStringToMessage(*contents, &launch, options);
  if (!parsed.ok() || !launch.has_assignment()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kLaunchEnv, " names ", path, ", which holds no launch of a substrax agent",
                     parsed.ok() ? " (no assignment)" : absl::StrCat(": ", parsed.ToString())));
  }
  return launch;
}

std::string DescribeLaunch(const v1::ProgramLaunch& launch) {
  const v1::Assignment& a = launch.assignment();
  return absl::StrCat("job ", a.job_id(), " attempt ", a.attempt(), " process ", a.process_index(),
                      " of ", a.num_processes(), ", devices ",
                      absl::StrJoin(a.local_device_ids(), ","), ", rendezvous ",
                      a.rendezvous_prefix(), ", result ", launch.result_path());
}

void WriteAttemptResult(const v1::ProgramLaunch& launch, v1::ReportAttemptStatusRequest result) {
  result.set_job_id(launch.assignment().job_id());
  result.set_attempt(launch.assignment().attempt());
  result.set_process_index(launch.assignment().process_index());
  const absl::Status written =
      WriteFileAtomically(launch.result_path(), result.SerializeAsString());
  if (written.ok()) return;
  // The exit status still says whether the process succeeded: the agent reports exit status 0
  // as SUCCEEDED (without final metrics), so only a successful process may exit 0.
  std::string metrics;
  for (const auto& [name, value] : result.final_metrics()) {
    absl::StrAppend(&metrics, " ", name, "=", value);
  }
  std::fprintf(stderr, "substrax: result not written (%s); the exit status carries it%s%s\n",
               written.ToString().c_str(),
               metrics.empty() ? "" : "; final metrics:", metrics.c_str());
  std::fflush(stderr);
}

void WriteAttemptFailure(const v1::ProgramLaunch& launch, const absl::Status& status) {
  v1::ReportAttemptStatusRequest result;
  result.set_state(v1::RUNNER_STATE_FAILED);
  result.set_error(std::string(status.message()));
  result.set_error_code(static_cast<int32_t>(status.code()));
  WriteAttemptResult(launch, std::move(result));
}

absl::StatusOr<v1::ReportAttemptStatusRequest> ReadAttemptResult(const std::string& path) {
  // The job's process wrote the file, maybe as another user than the reader: a symbolic link
  // (to a key the reader may read) is not followed, nor a FIFO waited on, nor more than a
  // result's size read.
  struct stat st;
  const int fd = OpenRegularFileNoFollow(path, &st);
  if (fd < 0 && errno != 0) {
    const int error = errno;
    return absl::ErrnoToStatus(error, absl::StrCat("cannot open result file ", path,
                                                   error == ELOOP ? ": a symbolic link" : ""));
  }
  if (fd < 0 || st.st_size > kMaxResultFileBytes) {
    if (fd >= 0) close(fd);
    return absl::DataLossError(absl::StrCat("result file ", path, " is not a regular file of "
                                            "at most ", kMaxResultFileBytes, " bytes"));
  }
  v1::ReportAttemptStatusRequest result;
  const bool parsed = result.ParseFromFileDescriptor(fd);
  close(fd);
  if (!parsed) return absl::DataLossError(absl::StrCat("result file ", path, " does not parse"));
  return result;
}

}  // namespace substrax
