#include "worker/checkpoint/export_command.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "worker/checkpoint/export.h"

namespace substrax {
namespace {

// "1 array", "3 arrays".
std::string Arrays(size_t n) { return absl::StrCat(n, n == 1 ? " array" : " arrays"); }

}  // namespace

CLI::App* AddExportCheckpointCommand(CLI::App* app, ExportCommandFlags* flags) {
  CLI::App* command = app->add_subcommand(
      "export-checkpoint",
      "Write a checkpoint's parameters, whole, into one safetensors file (numpy, PyTorch, JAX "
      "load it; see docs/checkpoints.md)");
  command
      ->add_option("checkpoint", flags->checkpoint,
                   "A committed checkpoint (a step-NNNNNNNNNNNN directory) or a job's checkpoint "
                   "directory (its newest whole checkpoint)")
      ->required()
      ->type_name("DIR");
  command->add_option("--out", flags->out, "The safetensors file to write (replaced atomically)")
      ->required()
      ->type_name("FILE");
  command
      ->add_option("--step", flags->step,
                   "In a job's checkpoint directory, the step to export instead of the newest")
      ->check(CLI::Range(int64_t{0}, std::numeric_limits<int64_t>::max()))
      ->type_name("N");
  command->add_flag("--include-optimizer", flags->include_optimizer,
                    "Also write the optimizer's state (optimizer/<param>/<slot>)");
  return command;
}

int RunExportCheckpoint(const ExportCommandFlags& flags, std::ostream& out, std::ostream& err) {
  ExportOptions options;
  options.step = flags.step;
  options.include_optimizer = flags.include_optimizer;
  absl::StatusOr<ExportResult> result = ExportCheckpoint(flags.checkpoint, flags.out, options);
  if (!result.ok()) {
    err << "substrax-job export-checkpoint: " << result.status().message() << "\n";
    return 1;
  }
  for (const std::string& why : result->skipped) {
    err << "substrax-job export-checkpoint: passed over " << why << "\n";
  }
  out << "wrote " << flags.out << ": step " << result->step << " of " << result->checkpoint_dir
      << ", " << Arrays(result->tensors.size()) << ", " << result->bytes << " bytes\n";
  for (const std::string& name : result->tensors) out << "  " << name << "\n";
  if (!result->left_out.empty()) {
    out << "left out " << Arrays(result->left_out.size()) << " ("
        << (flags.include_optimizer ? "neither params/ nor optimizer/"
                                    : "only params/ is exported; --include-optimizer adds "
                                      "optimizer/")
        << ")\n";
  }
  return 0;
}

}  // namespace substrax
