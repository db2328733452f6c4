// The environment variable that names a process's launch file (v1::ProgramLaunch): the worker
// daemon sets it (worker/daemon/launch.h), substrax::Init reads it (worker/sdk).
#ifndef SUBSTRAX_WORKER_SDK_LAUNCH_ENV_H_
#define SUBSTRAX_WORKER_SDK_LAUNCH_ENV_H_

namespace substrax {

inline constexpr char kLaunchEnv[] = "SUBSTRAX_LAUNCH";

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_SDK_LAUNCH_ENV_H_
