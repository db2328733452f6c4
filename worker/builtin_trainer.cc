#include "worker/builtin_trainer.h"
#include <cstdio>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/status.h"
#include "core/tensorboard_writer.h"
#include "rpc/proto_time.h"
#include "substrax/v1/coordinator_service.grpc.pb.h"
#include "substrax/v1/program.pb.h"
#include "contract/launch.h"
#include "worker/runtime/checkpointing.h"
#include "worker/runtime/preemption.h"
#include "worker/runtime/trainer.h"
#include "worker/sdk/program_impl.h"

namespace substrax {
namespace {

// The StepReport of one device report.
v1::StepReport ToStepReport(const DeviceReport& r, const Mesh& mesh, int process_index) {
  v1::StepReport report;
  report.set_step(r.step);
  report.set_device_id(r.device_id);
  report.set_host(mesh.DeviceAt(*mesh.CoordinatesOf(r.device_id)).host);
  report.set_process_index(process_index);
  for (const auto& [name, value] : r.values) (*report.mutable_values())[name] = value;
  report.set_samples_per_second(r.samples_per_second);
  report.set_data_wait_seconds(r.data_wait_seconds);
  report.set_compute_seconds(r.compute_seconds);
  report.set_collective_seconds(r.collective_seconds);
  report.set_total_steps(r.total_steps);
  report.set_input_features(r.input_features);
  *report.mutable_time() = ToProtoTime(absl::Now());
  return report;
}

// spec.tensorboard's scalars of one progress report: the job's metrics as reduced across
// devices, the throughput of all devices and the slowest device's time fractions.
std::vector<TensorBoardScalar> TensorBoardScalars(const ProgressReport& r) {
  std::vector<TensorBoardScalar> scalars;
  for (const auto& [name, value] : r.metrics) scalars.push_back({name, value});
  scalars.push_back({"samples_per_second", r.samples_per_second});
  scalars.push_back({"data_wait_fraction", r.data_wait_fraction});
  scalars.push_back({"compute_fraction", r.compute_fraction});
  scalars.push_back({"collective_fraction", r.collective_fraction});
  return scalars;
}

// The event file of spec.tensorboard, opened by the process that holds mesh position 0 (the
// one the step loop gives progress reports to); null for the other processes and for a job
// without spec.tensorboard. The directory is checked against the daemon's checkpoint roots
// first, on the file system, as checkpoint directories are.
absl::StatusOr<std::unique_ptr<TensorBoardWriter>> OpenTensorBoard(
    const v1::JobSpec& spec, const ProgramImpl& program, const std::vector<std::string>& roots) {
  if (!spec.has_tensorboard() || program.process_of_position().empty() ||
      program.process_of_position().front() != program.process_index()) {
    return nullptr;
  }
  const std::string& dir = spec.tensorboard().directory();
  SUBSTRAX_RETURN_IF_ERROR(
      CheckCheckpointDirectory("spec.tensorboard.directory", dir, roots));
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
      TensorBoardWriter::Create(dir, absl::Now());
  if (!writer.ok()) return Annotate(writer.status(), "spec.tensorboard.directory");
  return writer;
}

// The process's part of the job: prepared once, then each device's part inside the program's
// RunOnDevices (its threads, connections and the last checkpoint's commit).
absl::StatusOr<TrainResult> TrainOnProgram(ProgramImpl& program, TrainerOptions options) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<TrainingProcess> process,
                            TrainingProcess::Prepare(std::move(options)));
  SUBSTRAX_RETURN_IF_ERROR(program.RunOnDevices(
      [&process](DeviceContext& ctx) { return process->RunDevice(ctx); },
      process->local_device_options()));
  return process->Result();
}

}  // namespace

// The built-in trainer, run as a program on the SDK: Init's launch path connects it to its job,
// and its reports and result go out through the Program as a user's program's do.
absl::Status RunBuiltinTrainer(v1::ProgramLaunch launch) {
  // The agent's SIGTERM (a cancel, a preemption) stops every device after the same step, with a
  // final checkpoint when the job has them (step_loop.h), instead of killing the process.
  InstallSigtermFlag();
  const v1::Assignment& assignment = launch.assignment();
  const std::vector<std::string> data_roots(launch.data_roots().begin(),
                                            launch.data_roots().end());
  const std::vector<std::string> checkpoint_roots(launch.checkpoint_roots().begin(),
                                                  launch.checkpoint_roots().end());
  absl::StatusOr<std::unique_ptr<ProgramImpl>> started = ProgramImpl::FromLaunchProto(launch);
  if (!started.ok()) {
    WriteAttemptFailure(launch, started.status());
    return started.status();
  }
  ProgramImpl& program = **started;
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> tensorboard =
      OpenTensorBoard(assignment.spec(), program, checkpoint_roots);
  if (!tensorboard.ok()) {
    program.Finish(tensorboard.status());
    return tensorboard.status();
  }

  TrainerOptions trainer(program.mesh());
  trainer.spec = assignment.spec();
  trainer.job_id = assignment.job_id();
  trainer.process_of_position = program.process_of_position();
  trainer.process_index = program.process_index();
  trainer.store = program.store();
  // (How the devices connect is the program's: its launch's listen host and collective timeout.)
  trainer.data_access = DataAccess::Confined(data_roots);
  trainer.checkpoint_roots = checkpoint_roots;
  trainer.stop_requested = SigtermReceived;
  trainer.on_resume = [&program](const v1::CheckpointResume& resume) {
    program.ReportResume(resume);
  };
  trainer.on_checkpoint = [&program](const v1::CheckpointListing& listing) {
    v1::ReportCheckpointsRequest request;
    *request.mutable_listing() = listing;
    program.ReportCheckpoints(std::move(request));
  };
  // Step reports leave the step loop at once: a slow coordinator must not slow training
  // (worker/sdk/step_reporter.h has the bounds).
  trainer.on_device_report = [&](const DeviceReport& r) {
    program.EnqueueStepReport(ToStepReport(r, program.mesh(), program.process_index()));
  };
  bool tensorboard_failed = false;
  trainer.on_progress = [&](const ProgressReport& r) {
    std::fprintf(stderr, "step %lld/%lld\n", static_cast<long long>(r.step),
                 static_cast<long long>(r.total_steps));
    if (*tensorboard == nullptr) return;
    // Flushed at every report, so that TensorBoard shows the job live. A failed write (a full
    // disk) does not stop training: the runner's log says it once, and later reports retry it.
    (*tensorboard)->AddStep(r.step, absl::Now(), TensorBoardScalars(r));
    const absl::Status flushed = (*tensorboard)->Flush();
    if (!flushed.ok() && !tensorboard_failed) {
      std::fprintf(stderr, "spec.tensorboard: %s; training goes on\n",
                   std::string(flushed.message()).c_str());
    }
    tensorboard_failed = !flushed.ok();
  };
  absl::StatusOr<TrainResult> trained = TrainOnProgram(program, std::move(trainer));
  if (trained.ok()) program.SetFinalMetrics(trained->evaluation);
  // Waits for the last reports, then writes the result: in the normal case no final step is
  // lost.
  program.Finish(trained.status());
  return trained.status();
}

}  // namespace substrax
