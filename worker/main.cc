// substrax-job: the job process, in three modes. The agent (//agent) starts it for built-in
// jobs; users run `train` and `export-checkpoint` themselves.
//
//   substrax-job run
//       One process of a job attempt, started by the agent: everything it needs is in the launch
//       file that SUBSTRAX_LAUNCH names (contract/launch.h), as for every job process. A doctor
//       job's process (`substraxctl doctor`) checks its host and links instead of training.
//   substrax-job train --job FILE.yaml --local-devices N [--cpu-collectives auto|gloo]
//                      [--cpu-affinity auto|none] [--activity-file PATH]
//       A whole job in this process on N CPU devices (one thread each, connected by the host's
//       local communicator, or flat Gloo with --cpu-collectives=gloo), without a coordinator:
//       progress lines on stderr, the evaluation on stdout ("test_accuracy=0.8812"). The user's
//       own process: it reads any data path given. SIGTERM stops it after the next report's
//       step, with a checkpoint of that step when the job has them (exit status 1). With
//       --activity-file it publishes what its devices and communicators do there, as a process
//       of a job does for its agent (contract/activity.h).
//   substrax-job export-checkpoint DIR --out FILE [--step N] [--include-optimizer]
//       A checkpoint's parameters, whole, in one safetensors file (docs/checkpoints.md).
//
// Exit status: 0 ok; 1 failed (training, export); 2 bad command line, job spec or launch.
#include <unistd.h>

#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <csignal>
#include <fstream>
#include <thread>
#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "base/mutex_mode.h"
#include "worker/command_launcher.h"
#include "worker/doctor/doctor.h"
#include "core/data_paths.h"
#include "core/device_mesh_manager.h"
#include "contract/activity.h"
#include "contract/devices.h"
#include "contract/launch.h"
#include "core/job_spec.h"
#include "worker/builtin_trainer.h"
#include "worker/checkpoint/export_command.h"
#include "worker/collectives/cpu_group_connector.h"
#include "worker/collectives/store.h"
#include "worker/runtime/preemption.h"
#include "worker/runtime/trainer.h"

namespace substrax {
namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// `bazel run` starts binaries in their runfiles directory; paths on the command line are meant
// relative to where the user typed them, which Bazel passes in BUILD_WORKING_DIRECTORY.
std::string UserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr || cwd[0] == '\0') return path;
  return std::string(cwd) + "/" + path;
}

std::string FormatEta(absl::Duration d) {
  const int64_t s = absl::ToInt64Seconds(d);
  if (s >= 3600) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  if (s >= 60) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  return absl::StrFormat("%ds", s);
}

void PrintProgress(const ProgressReport& r) {
  std::string metrics;
  for (const auto& [name, value] : r.metrics) {
    if (name == "step") continue;
    absl::StrAppendFormat(&metrics, "  %s=%.4f", name, value);
  }
  const double per_step = absl::ToDoubleSeconds(r.elapsed) / std::max<int64_t>(1, r.step);
  const absl::Duration eta = absl::Seconds(per_step * (r.total_steps - r.step));
  std::fprintf(stderr,
               "step %lld/%lld  epoch %lld/%lld%s  samples/s=%.0f  time: data %.0f%% compute "
               "%.0f%% collectives %.0f%%  eta %s\n",
               static_cast<long long>(r.step), static_cast<long long>(r.total_steps),
               static_cast<long long>(r.epoch), static_cast<long long>(r.total_epochs),
               metrics.c_str(), r.samples_per_second, 100 * r.data_wait_fraction,
               100 * r.compute_fraction, 100 * r.collective_fraction, FormatEta(eta).c_str());
  std::fflush(stderr);
}

int RunTrain(const std::string& job_path, int local_devices, const std::string& devices_flag,
             const std::string& timeout_flag, bool explicit_collectives,
             const std::string& cpu_collectives_flag, const std::string& cpu_affinity,
             const std::string& activity_file) {
  absl::Duration timeout;
  if (!absl::ParseDuration(timeout_flag, &timeout) || timeout <= absl::ZeroDuration()) {
    std::cerr << "substrax-job: --collective-timeout: '" << timeout_flag
              << "' is not a positive duration such as 30s\n";
    return 2;
  }
  absl::StatusOr<CpuCollectives> cpu_collectives = ParseCpuCollectives(cpu_collectives_flag);
  if (!cpu_collectives.ok()) {
    std::cerr << "substrax-job: --cpu-collectives: " << cpu_collectives.status().message()
              << "\n";
    return 2;
  }
  if (cpu_affinity != "auto" && cpu_affinity != "none") {
    std::cerr << "substrax-job: --cpu-affinity: '" << cpu_affinity
              << "' is not 'auto' (each device thread on its own CPU when there are enough) or "
                 "'none'\n";
    return 2;
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(UserPath(job_path));
  if (!spec.ok()) {
    std::cerr << "substrax-job: invalid job spec:\n" << spec.status().message() << "\n";
    return 2;
  }
  // The devices of this process: --devices (cuda, cpu:N), or --local-devices N CPU devices.
  const std::string host = HostName();
  const std::string device_spec =
      devices_flag.empty() ? absl::StrCat("cpu:", local_devices) : devices_flag;
  absl::StatusOr<std::vector<v1::Device>> found = DiscoverDevices(device_spec, host);
  if (!found.ok()) {
    std::cerr << "substrax-job: --devices " << device_spec << ": " << found.status().message()
              << "\n";
    return 2;
  }
  std::vector<Device> devices;
  for (size_t i = 0; i < found->size(); ++i) {
    Device d = DeviceFromProto((*found)[i]);
    d.id = static_cast<int>(i);
    d.worker_id = "local";
    devices.push_back(d);
  }
  const int64_t needed = RequiredDevices(*spec);
  if (needed > static_cast<int64_t>(devices.size())) {
    std::cerr << "substrax-job: " << job_path << ": the job's mesh needs " << needed
              << " devices, but this process has " << devices.size() << " (" << device_spec
              << ")\n";
    return 2;
  }
  absl::StatusOr<Mesh> mesh =
      CreateMeshForJob(spec->mesh(), DevicesForBackend(spec->backend(), devices));
  if (!mesh.ok()) {
    std::cerr << "substrax-job: " << job_path << ": " << mesh.status().message() << "\n";
    return 2;
  }
  if (needed < static_cast<int64_t>(devices.size())) {
    std::cerr << "substrax-job: the job's mesh uses " << needed << " of the " << devices.size()
              << " devices\n";
  }
  std::cerr << DeviceMeshManager::GetMeshInfo(*mesh);
  if (!activity_file.empty()) {
    absl::StatusOr<std::unique_ptr<ActivityBoard>> board =
        ActivityBoard::Create(UserPath(activity_file));
    if (!board.ok()) {
      std::cerr << "substrax-job: --activity-file: " << board.status().message() << "\n";
      return 2;
    }
    InstallProcessActivityBoard(std::move(*board));
  }

  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = *spec;
  options.process_of_position.assign(mesh->size(), 0);
  options.store = &store;
  options.collective_timeout = timeout;
  // The user's own process, reading what the user may read: no data roots. Errors still never
  // quote a data file's contents.
  options.data_access = DataAccess::Unconfined();
  options.explicit_collectives = explicit_collectives;
  options.cpu_collectives = *cpu_collectives;
  options.pin_device_threads = cpu_affinity == "auto";
  options.on_progress = PrintProgress;
  // Checkpoints go wherever the user's own process may write.
  options.checkpoint_roots = std::nullopt;
  options.on_resume = [](const v1::CheckpointResume& resume) {
    for (const std::string& skipped : resume.skipped()) {
      std::cerr << "substrax-job: checkpoint skipped: " << skipped << "\n";
    }
    if (resume.step() > 0) {
      std::cerr << "substrax-job: resuming from the checkpoint of step " << resume.step()
                << " (" << resume.path() << ")\n";
    }
  };
  options.on_checkpoint = [](const v1::CheckpointListing& listing) {
    if (listing.checkpoints_size() == 0) return;
    const v1::CheckpointRecord& newest = listing.checkpoints(0);
    std::cerr << "substrax-job: checkpoint of step " << newest.step() << " committed ("
              << newest.path() << ", " << newest.size_bytes() << " bytes)\n";
  };
  // SIGTERM stops every device after the same step, with a final checkpoint when the job has
  // them; a second SIGTERM kills.
  InstallSigtermFlag();
  options.stop_requested = SigtermReceived;
  absl::StatusOr<TrainResult> result = substrax::Train(options);
  if (IsStoppedBySigterm(result.status())) {
    std::cerr << "substrax-job: " << result.status().message() << "\n";
    return 1;
  }
  if (!result.ok()) {
    std::cerr << "substrax-job: training failed: " << result.status() << "\n";
    return 1;
  }
  for (const auto& [name, value] : result->evaluation) {
    std::cout << name << "=" << absl::StrFormat("%.4f", value) << "\n";
  }
  return 0;
}

// `substrax-job run`: the process of one attempt of a built-in job, started by the agent with its
// launch in SUBSTRAX_LAUNCH (contract/launch.h), as every job process is.
int RunLaunched() {
  // A file-size limit (RLIMIT_FSIZE) makes writes fail with EFBIG, which the job's error names,
  // instead of killing the process with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  const char* path = std::getenv(kLaunchEnv);
  if (path == nullptr || *path == '\0') {
    std::cerr << "substrax-job run: " << kLaunchEnv
              << " is not set: `run` is the process of a job attempt, started by a substrax "
                 "agent; to train a job in this process, use `substrax-job train`\n";
    return 2;
  }
  absl::StatusOr<v1::ProgramLaunch> launch = ReadLaunchFile(path);
  if (!launch.ok()) {
    std::cerr << "substrax-job run: " << launch.status().message() << "\n";
    return 2;
  }
  const std::string who = DescribeLaunch(*launch);
  // A doctor job (`substraxctl doctor`) checks the host and its links instead of training.
  absl::Status status = launch->assignment().spec().has_doctor()
                            ? doctor::RunDoctorProcess(*std::move(launch))
                            : RunBuiltinTrainer(*std::move(launch));
  if (!status.ok()) {
    std::cerr << "substrax-job run: " << who << " failed: " << status << "\n";
    return 1;
  }
  return 0;
}

// `substrax-job command`: the launcher of a command job's processes on one worker.
int RunCommand() {
  const char* path = std::getenv(kLaunchEnv);
  if (path == nullptr || *path == '\0') {
    std::cerr << "substrax-job command: " << kLaunchEnv
              << " is not set: `command` runs a command job's processes for the substrax agent "
                 "that starts it; to try a command locally, use `substraxctl local up`\n";
    return 2;
  }
  return RunCommandLauncher(path);
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  substrax::base::DisableMutexDeadlockDetectionInOptimizedBuilds();
  // A write to a socket whose peer is gone (a Gloo pair when another runner dies, a gRPC
  // channel) must fail with EPIPE, which the collectives turn into an error naming the dead
  // peer, instead of killing this process with SIGPIPE and hiding the root cause.
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{"substrax job: the process of a substrax training job (its device-local compute "
               "and collectives)"};
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand(
      "train", "Run a whole job in this process on local CPU devices (one thread each, "
               "connected as --cpu-collectives says)");
  std::string job;
  int local_devices = 1;
  std::string train_devices;
  std::string timeout = "30s";
  bool explicit_collectives = false;
  train->add_option("--job", job, "Job spec (TrainJob YAML, see docs/job-spec.md)")
      ->required();
  train->add_option("--devices", train_devices,
                    "Devices to run on: cuda (every GPU) or cpu:N; default cpu:<--local-devices>");
  train->add_option("--local-devices", local_devices, "CPU devices to run on")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  train->add_option("--collective-timeout", timeout,
                    "Time every collective must finish in (e.g. 30s, 2m)")
      ->capture_default_str();
  train->add_flag("--explicit-collectives", explicit_collectives,
                  "Reduce gradients with the explicit collective step (the guide's pmap path) "
                  "instead of SpmdTrainStep");
  std::string cpu_collectives = "auto";
  train->add_option("--cpu-collectives", cpu_collectives,
                    "How CPU devices' groups connect: 'auto' (per group: the host's local "
                    "communicator when it is on one host, flat Gloo when each rank is on its own "
                    "host, else in levels: inside each host, then Gloo between hosts) or 'gloo' "
                    "(flat Gloo over TCP for every group; for comparison)")
      ->capture_default_str();
  std::string cpu_affinity = "auto";
  train->add_option("--cpu-affinity", cpu_affinity,
                    "'auto': each device thread (with its input pipeline) on its own CPU when "
                    "the process may use at least as many CPUs as it has devices; 'none': let "
                    "the kernel place them")
      ->capture_default_str();
  std::string activity_file;
  train->add_option("--activity-file", activity_file,
                    "Publish the devices' phases and the collectives' counts in this file, as a "
                    "job's process does for its agent (docs/diagnosis.md)");
  CLI::App* run = app.add_subcommand(
      "run", "Run one process of a built-in job's attempt, as its launch file (SUBSTRAX_LAUNCH) "
             "says (the agent starts this; not for direct use)");

  CLI::App* command = app.add_subcommand(
      "command", "Run a command job's processes on this worker of its attempt, as its launch "
                 "file (SUBSTRAX_LAUNCH) says: rendezvous, the environment contract, the report "
                 "file (docs/command-jobs.md; the agent starts this; not for direct use)");

  substrax::ExportCommandFlags export_flags;
  CLI::App* export_checkpoint = substrax::AddExportCheckpointCommand(&app, &export_flags);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (*export_checkpoint) {
    export_flags.checkpoint = substrax::UserPath(export_flags.checkpoint);
    export_flags.out = substrax::UserPath(export_flags.out);
    return substrax::RunExportCheckpoint(export_flags, std::cout, std::cerr);
  }
  if (*run) return substrax::RunLaunched();
  if (*command) return substrax::RunCommand();
  return substrax::RunTrain(job, local_devices, train_devices, timeout, explicit_collectives,
                            cpu_collectives, cpu_affinity, activity_file);
}
