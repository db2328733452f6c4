// substrax-worker: the worker binary, in four modes.
//
//   substrax-worker daemon --coordinator HOST:PORT --devices cuda|cpu:N [--worker-id NAME]
//                          [--data-root DIR ...] ...
//       (--cpu-devices N is the same as --devices cpu:N; give one of them.)
//       The agent on a host: registers its devices, keeps its lease, runs assigned jobs, whose
//       data files must lie under a --data-root (none: synthetic data only).
//   substrax-worker run --assignment FILE --coordinator HOST:PORT --result FILE
//                       [--data-root DIR ...]
//       One runner process of one job attempt (started by the daemon).
//   substrax-worker train --job FILE.yaml --local-devices N [--cpu-collectives auto|gloo]
//                         [--cpu-affinity auto|none]
//       A whole job in this process on N CPU devices (one thread each, connected by the host's
//       local communicator, or flat Gloo with --cpu-collectives=gloo), without a coordinator:
//       progress lines on stderr, the evaluation on stdout ("test_accuracy=0.8812"). The user's
//       own process: it reads any data path given.
//   substrax-worker export-checkpoint DIR --out FILE [--step N] [--include-optimizer]
//       A checkpoint's parameters, whole, in one safetensors file (docs/checkpoints.md).
//
// Exit status: 0 ok; 1 failed (training, registration, export); 2 bad command line or job spec.
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
#include "rpc/transport_flags.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "core/data_paths.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "worker/checkpoint/export_command.h"
#include "worker/collectives/cpu_group_connector.h"
#include "worker/collectives/store.h"
#include "worker/daemon/daemon.h"
#include "worker/daemon/devices.h"
#include "worker/daemon/runner.h"
#include "worker/daemon/work_files.h"
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
             const std::string& cpu_collectives_flag, const std::string& cpu_affinity) {
  absl::Duration timeout;
  if (!absl::ParseDuration(timeout_flag, &timeout) || timeout <= absl::ZeroDuration()) {
    std::cerr << "substrax-worker: --collective-timeout: '" << timeout_flag
              << "' is not a positive duration such as 30s\n";
    return 2;
  }
  absl::StatusOr<CpuCollectives> cpu_collectives = ParseCpuCollectives(cpu_collectives_flag);
  if (!cpu_collectives.ok()) {
    std::cerr << "substrax-worker: --cpu-collectives: " << cpu_collectives.status().message()
              << "\n";
    return 2;
  }
  if (cpu_affinity != "auto" && cpu_affinity != "none") {
    std::cerr << "substrax-worker: --cpu-affinity: '" << cpu_affinity
              << "' is not 'auto' (each device thread on its own CPU when there are enough) or "
                 "'none'\n";
    return 2;
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(UserPath(job_path));
  if (!spec.ok()) {
    std::cerr << "substrax-worker: invalid job spec:\n" << spec.status().message() << "\n";
    return 2;
  }
  // The devices of this process: --devices (cuda, cpu:N), or --local-devices N CPU devices.
  const std::string host = HostName();
  const std::string device_spec =
      devices_flag.empty() ? absl::StrCat("cpu:", local_devices) : devices_flag;
  absl::StatusOr<std::vector<v1::Device>> found = DiscoverDevices(device_spec, host);
  if (!found.ok()) {
    std::cerr << "substrax-worker: --devices " << device_spec << ": " << found.status().message()
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
    std::cerr << "substrax-worker: " << job_path << ": the job's mesh needs " << needed
              << " devices, but this process has " << devices.size() << " (" << device_spec
              << ")\n";
    return 2;
  }
  absl::StatusOr<Mesh> mesh =
      CreateMeshForJob(spec->mesh(), DevicesForBackend(spec->backend(), devices));
  if (!mesh.ok()) {
    std::cerr << "substrax-worker: " << job_path << ": " << mesh.status().message() << "\n";
    return 2;
  }
  if (needed < static_cast<int64_t>(devices.size())) {
    std::cerr << "substrax-worker: the job's mesh uses " << needed << " of the " << devices.size()
              << " devices\n";
  }
  std::cerr << DeviceMeshManager::GetMeshInfo(*mesh);

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
      std::cerr << "substrax-worker: checkpoint skipped: " << skipped << "\n";
    }
    if (resume.step() > 0) {
      std::cerr << "substrax-worker: resuming from the checkpoint of step " << resume.step()
                << " (" << resume.path() << ")\n";
    }
  };
  options.on_checkpoint = [](const v1::CheckpointListing& listing) {
    if (listing.checkpoints_size() == 0) return;
    const v1::CheckpointRecord& newest = listing.checkpoints(0);
    std::cerr << "substrax-worker: checkpoint of step " << newest.step() << " committed ("
              << newest.path() << ", " << newest.size_bytes() << " bytes)\n";
  };
  absl::StatusOr<TrainResult> result = substrax::Train(options);
  if (!result.ok()) {
    std::cerr << "substrax-worker: training failed: " << result.status() << "\n";
    return 1;
  }
  for (const auto& [name, value] : result->evaluation) {
    std::cout << name << "=" << absl::StrFormat("%.4f", value) << "\n";
  }
  return 0;
}

bool ParseTimeout(const std::string& flag, absl::Duration* out) {
  if (absl::ParseDuration(flag, out) && *out > absl::ZeroDuration()) return true;
  std::cerr << "substrax-worker: '" << flag << "' is not a positive duration such as 30s\n";
  return false;
}

int RunDaemon(WorkerDaemonOptions options, const std::string& timeout_flag) {
  if (!ParseTimeout(timeout_flag, &options.collective_timeout)) return 2;
  // SIGTERM and SIGINT stop the daemon and its runners cleanly: they are taken by a thread
  // that waits for them (blocked everywhere else before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon = WorkerDaemon::Create(options);
  if (!daemon.ok()) {
    std::cerr << "substrax-worker: " << daemon.status().message() << "\n";
    return 2;
  }
  std::thread signal_waiter([&signals, d = daemon->get()] {
    int signal = 0;
    sigwait(&signals, &signal);
    std::cerr << "substrax-worker: " << strsignal(signal) << ": stopping\n";
    d->Stop();
  });
  signal_waiter.detach();
  absl::Status status = (*daemon)->Run();
  if (!status.ok() && !absl::IsCancelled(status)) {
    std::cerr << "substrax-worker: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

int RunRunner(const std::string& assignment_path, RunnerOptions options,
              const std::string& timeout_flag) {
  if (!ParseTimeout(timeout_flag, &options.collective_timeout)) return 2;
  // A file-size limit (RLIMIT_FSIZE) makes writes fail with EFBIG, which the job's error names,
  // instead of killing the runner with SIGXFSZ.
  std::signal(SIGXFSZ, SIG_IGN);
  v1::Assignment assignment;
  std::ifstream in(assignment_path, std::ios::binary);
  if (!in || !assignment.ParseFromIstream(&in)) {
    std::cerr << "substrax-worker run: cannot read assignment " << assignment_path << "\n";
    return 2;
  }
  for (const auto& [flag, roots] : {std::pair{"--data-root", &options.data_roots},
                                     std::pair{"--checkpoint-root", &options.checkpoint_roots}}) {
    for (std::string& root : *roots) {
      absl::StatusOr<std::string> normalized = NormalizeAbsolute(root);
      if (!normalized.ok()) {
        std::cerr << "substrax-worker run: " << flag << " " << root << ": "
                  << normalized.status().message() << "\n";
        return 2;
      }
      root = *std::move(normalized);
    }
  }
  absl::Status status = RunAssignment(assignment, options);
  if (!status.ok()) {
    std::cerr << "substrax-worker run: job " << assignment.job_id() << " attempt "
              << assignment.attempt() << " process " << assignment.process_index()
              << " failed: " << status << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  // A write to a socket whose peer is gone (a Gloo pair when another runner dies, a gRPC
  // channel) must fail with EPIPE, which the collectives turn into an error naming the dead
  // peer, instead of killing this process with SIGPIPE and hiding the root cause.
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{"substrax worker: runs the device-local part of substrax training jobs"};
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
  substrax::WorkerDaemonOptions daemon_options;
  std::string daemon_timeout = "30s";
  CLI::App* daemon = app.add_subcommand(
      "daemon", "Run the worker agent: register this host's devices with the coordinator and run "
                "the jobs it assigns");
  daemon->add_option("--coordinator", daemon_options.coordinator,
                     "Coordinator address host:port (its worker-facing listener)")
      ->capture_default_str();
  substrax::TransportFlags daemon_transport;
  substrax::AddTransportFlags(daemon, &daemon_transport, substrax::TransportRole::kDaemon);
  CLI::Option* devices_flag = daemon->add_option(
      "--devices", daemon_options.devices,
      "Devices to offer: 'cuda' (every visible GPU; needs a --config=cuda build) or 'cpu:N'");
  daemon->add_option("--cpu-devices", daemon_options.cpu_devices,
                     "CPU devices to offer (the same as --devices cpu:N)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str()
      ->excludes(devices_flag);
  daemon->add_option("--worker-id", daemon_options.worker_id,
                     "This worker's name: its certificate's CN (the default); with --insecure, default the "
                     "host name");
  daemon->add_option("--host", daemon_options.host, "Host name to report (default: gethostname)");
  daemon->add_option("--listen-host", daemon_options.listen_host,
                     "Address peers reach this host's runners on")
      ->capture_default_str();
  daemon->add_option("--work-dir", daemon_options.work_dir,
                     "Directory for assignments, results and runner logs")
      ->capture_default_str();
  daemon->add_option("--data-root", daemon_options.data_roots,
                     "A directory (absolute) under which jobs may read data files; repeat for "
                     "several. Reported to the coordinator, which refuses jobs whose data lies "
                     "elsewhere. None: the worker runs only jobs with synthetic data")
      ->type_name("DIR");
  daemon->add_option("--checkpoint-root", daemon_options.checkpoint_roots,
                     "A directory (absolute) under which jobs may write and read checkpoints "
                     "(a file system every worker of a job shares); repeat for several. Reported "
                     "to the coordinator, which refuses jobs whose checkpoint directory or "
                     "resume_from lies elsewhere. None: the worker runs only jobs without "
                     "checkpoints")
      ->type_name("DIR");
  daemon->add_option("--programs-dir", daemon_options.programs_dirs,
                     "A directory (absolute) from which program jobs (spec.program) may run "
                     "programs; repeat for several. Reported to the coordinator, which refuses "
                     "jobs whose program lies elsewhere; checked again, symlinks resolved, before "
                     "each program starts. Programs run as this daemon's user with its "
                     "environment and credentials: allow only directories whose contents you "
                     "trust. None: the worker runs no program jobs")
      ->type_name("DIR");
  std::string program_init_timeout = "60s";
  daemon->add_option("--program-init-timeout", program_init_timeout,
                     "A program that has not called substrax::Init this long after it started is "
                     "stopped and its attempt fails as stalled")
      ->capture_default_str();
  daemon->add_option("--health-listen", daemon_options.health_listen,
                     "Plaintext grpc.health.v1 address for Kubernetes probes (service "
                     "substrax.worker.ready: registered); empty: none");
  daemon->add_option("--collective-timeout", daemon_timeout,
                     "Time every collective of a runner must finish in")
      ->capture_default_str();
  std::string stop_grace = "10s";
  daemon->add_option("--stop-grace", stop_grace,
                     "Time a runner gets to exit after SIGTERM before SIGKILL")
      ->capture_default_str();

  std::string log_retention = "7d";
  daemon->add_option("--log-retention", log_retention,
                     "Delete the work-dir files (assignment, log, result) of ended attempts older "
                     "than this: 7d, 36h, 90m; 0: no age limit")
      ->capture_default_str();
  std::string log_budget = "1GiB";
  daemon->add_option("--log-budget", log_budget,
                     "Then delete ended attempts' files, oldest first, until the work dir's "
                     "attempt files take at most this: 1GiB, 512MiB, bytes; 0: no size limit. "
                     "Files of running attempts are never deleted")
      ->capture_default_str();

  std::string assignment;
  substrax::RunnerOptions runner_options;
  std::string runner_timeout = "30s";
  CLI::App* run = app.add_subcommand("run", "Run one process of a job attempt (the daemon starts "
                                            "this; not for direct use)");
  run->add_option("--assignment", assignment, "Serialized substrax.v1.Assignment")->required();
  run->add_option("--coordinator", runner_options.coordinator, "Coordinator address host:port")
      ->required();
  substrax::TransportFlags run_transport;
  substrax::AddTransportFlags(run, &run_transport, substrax::TransportRole::kDaemon);
  run->add_option("--listen-host", runner_options.listen_host, "Address peers reach this runner on")
      ->capture_default_str();
  run->add_option("--result", runner_options.result_path, "Where to write the outcome")->required();
  run->add_option("--collective-timeout", runner_timeout, "Time every collective must finish in")
      ->capture_default_str();
  run->add_option("--data-root", runner_options.data_roots,
                  "A directory data files may be read from (repeatable; none: no data files)")
      ->type_name("DIR");
  run->add_option("--checkpoint-root", runner_options.checkpoint_roots,
                  "A directory checkpoints may be written and read under (repeatable; none: no "
                  "checkpoints)")
      ->type_name("DIR");

  substrax::ExportCommandFlags export_flags;
  CLI::App* export_checkpoint = substrax::AddExportCheckpointCommand(&app, &export_flags);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  for (auto [sub, flags] : {std::pair{daemon, &daemon_transport}, std::pair{run, &run_transport}}) {
    if (!*sub) continue;
    if (absl::Status s = substrax::FinishTransportFlags(flags); !s.ok()) {
      std::cerr << "substrax-worker: " << s.message() << "\n";
      return 2;
    }
  }
  daemon_options.transport = daemon_transport.options;
  runner_options.transport = run_transport.options;
  if (*daemon) {
    if (daemon_options.transport.insecure) {
      std::cerr << substrax::InsecureWarning("substrax-worker daemon") << "\n";
    }
    if (!substrax::ParseTimeout(stop_grace, &daemon_options.stop_grace)) return 2;
    if (!substrax::ParseTimeout(program_init_timeout, &daemon_options.program_init_timeout)) {
      return 2;
    }
    absl::StatusOr<absl::Duration> retention = substrax::ParseRetention(log_retention);
    absl::StatusOr<int64_t> budget = substrax::ParseByteSize(log_budget);
    if (!retention.ok() || !budget.ok()) {
      std::cerr << "substrax-worker: "
                << (retention.ok() ? "--log-budget: " + std::string(budget.status().message())
                                   : "--log-retention: " +
                                         std::string(retention.status().message()))
                << "\n";
      return 2;
    }
    daemon_options.log_retention.max_age = *retention;
    daemon_options.log_retention.max_bytes = *budget;
    return substrax::RunDaemon(daemon_options, daemon_timeout);
  }
  if (*export_checkpoint) {
    export_flags.checkpoint = substrax::UserPath(export_flags.checkpoint);
    export_flags.out = substrax::UserPath(export_flags.out);
    return substrax::RunExportCheckpoint(export_flags, std::cout, std::cerr);
  }
  if (*run) return substrax::RunRunner(assignment, runner_options, runner_timeout);
  return substrax::RunTrain(job, local_devices, train_devices, timeout, explicit_collectives,
                            cpu_collectives, cpu_affinity);
}
