// The launch contract: how the agent hands the process of one job attempt its part, and how
// that process answers. The agent (//agent) writes; the job process reads: the built-in trainer
// (`substrax-job run`), a program on the SDK (substrax::Init) and any other executable alike.
// Neither side includes the other; both include this (docs/launch.md is the reference).
//
// One message, v1::ProgramLaunch (proto/substrax/v1/program.proto), in one file, named by one
// environment variable, SUBSTRAX_LAUNCH. The file is the message in protobuf's JSON mapping with
// the proto's field names (`{"sdk_version_major": 1, "assignment": {"job_id": ...}, ...}`), so a
// program in any language reads it with a JSON parser; it is written 0600 (it holds the
// attempt's rendezvous secret and the process's attempt token; never a credential of the
// worker) before the process starts and never changes after.
//
// What the process writes back, at the paths the launch names:
//   started_path  created once the process has joined its job (SDK: by substrax::Init). A
//                 program that ends without it failed before joining.
//   result_path   how it ended: a serialized v1::ReportAttemptStatusRequest (WriteAttemptResult).
//                 Optional: without it, exit status 0 is success.
#ifndef SUBSTRAX_CONTRACT_LAUNCH_H_
#define SUBSTRAX_CONTRACT_LAUNCH_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/program.pb.h"

namespace substrax {

// The environment variable that names the launch file.
inline constexpr char kLaunchEnv[] = "SUBSTRAX_LAUNCH";

// The launch as the file holds it (JSON, proto field names, one line).
std::string EncodeLaunch(const v1::ProgramLaunch& launch);

// Writes `launch` to `path` atomically, readable by its owner only. Errors: the path and the
// system's reason (base/files.h).
absl::Status WriteLaunchFile(const std::string& path, const v1::ProgramLaunch& launch);

// Reads the launch file at `path`. Fields this release does not know are ignored (a newer agent
// may add some); the major version is for the reader to check. Errors: INVALID_ARGUMENT when the
// file cannot be read or holds no launch (the message names kLaunchEnv and the path).
absl::StatusOr<v1::ProgramLaunch> ReadLaunchFile(const std::string& path);

// One line a process prints when it starts, so that its log says which part of which attempt it
// runs: "job mnist attempt 0 process 1 of 2, devices 2,3, rendezvous /jobs/mnist/0/, result
// /var/lib/substrax/mnist-attempt-0-process-1.result".
std::string DescribeLaunch(const v1::ProgramLaunch& launch);

// Writes `result` (with the launch's job, attempt and process) to the launch's result path.
// A failure is printed on stderr: the agent then reports from the exit status alone.
void WriteAttemptResult(const v1::ProgramLaunch& launch, v1::ReportAttemptStatusRequest result);
// WriteAttemptResult of a FAILED result with `status`'s message and code.
void WriteAttemptFailure(const v1::ProgramLaunch& launch, const absl::Status& status);

// The largest result file read.
inline constexpr int64_t kMaxResultFileBytes = int64_t{4} << 20;

// The result file at `path`, never through a symbolic link. Errors: NOT_FOUND when there is
// none, DATA_LOSS when it does not parse (the process died while writing, or wrote something
// else) or is not a regular file of at most kMaxResultFileBytes, otherwise open's (a symbolic
// link: ELOOP's code).
absl::StatusOr<v1::ReportAttemptStatusRequest> ReadAttemptResult(const std::string& path);

}  // namespace substrax

#endif  // SUBSTRAX_CONTRACT_LAUNCH_H_
