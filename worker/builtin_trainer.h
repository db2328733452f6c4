// The built-in trainer (`substrax-job run`): the process of one attempt of a built-in job, run
// as a program on the SDK (worker/sdk). It reads its launch as every job process does
// (contract/launch.h), trains its part of the job with the coordinator's store for rendezvous,
// sends every device's step reports to the coordinator, and writes how it ended to the launch's
// result file, which the agent reports (the agent is the one that reports attempt status: it
// also sees processes that crash before they can write anything).
#ifndef SUBSTRAX_WORKER_BUILTIN_TRAINER_H_
#define SUBSTRAX_WORKER_BUILTIN_TRAINER_H_

#include "absl/status/status.h"
#include "substrax/v1/program.pb.h"

namespace substrax {

// Trains the launch's part of its job. Errors: whatever joining the job or training returns
// (also written to the result file).
absl::Status RunBuiltinTrainer(v1::ProgramLaunch launch);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_BUILTIN_TRAINER_H_
