// `substrax-job export-checkpoint DIR --out FILE [--step N] [--include-optimizer]`: the
// command line of ExportCheckpoint (export.h). On success it prints to `out` what it wrote
//
//   wrote params.safetensors: step 200 of ckpt/step-000000000200, 3 arrays, 1234 bytes
//     dense_0/bias
//     ...
//   left out 3 arrays (only params/ is exported; --include-optimizer adds optimizer/)
//
// and to `err` every newer checkpoint it passed over, and why. Exit status: 0 written, 1 not
// (the reason on `err`); a bad command line is CLI11's to report.
#ifndef SUBSTRAX_WORKER_CHECKPOINT_EXPORT_COMMAND_H_
#define SUBSTRAX_WORKER_CHECKPOINT_EXPORT_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "CLI/CLI.hpp"

namespace substrax {

struct ExportCommandFlags {
  std::string checkpoint;
  std::string out;
  int64_t step = -1;
  bool include_optimizer = false;
};

// Adds the subcommand to `app`, its flags parsed into *flags.
CLI::App* AddExportCheckpointCommand(CLI::App* app, ExportCommandFlags* flags);

// Runs it; returns the exit status.
int RunExportCheckpoint(const ExportCommandFlags& flags, std::ostream& out, std::ostream& err);

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_CHECKPOINT_EXPORT_COMMAND_H_
