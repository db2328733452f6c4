// substrax-worker: the worker binary. Today it has one mode:
//
//   substrax-worker train --job FILE.yaml --local-devices N
//
// which runs a whole job in this process on N CPU devices (one thread each, Gloo between them),
// prints a progress line every report interval on stderr and, at the end, the evaluation on
// stdout ("test_accuracy=0.8812", "test_loss=..."). The daemon mode (register with a
// coordinator, run assigned jobs) arrives with the control plane.
//
// Exit status: 0 trained; 1 training failed; 2 bad command line or job spec.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "core/device_mesh_manager.h"
#include "core/job_spec.h"
#include "worker/collectives/store.h"
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

int RunTrain(const std::string& job_path, int local_devices, const std::string& timeout_flag,
          bool explicit_collectives) {
  absl::Duration timeout;
  if (!absl::ParseDuration(timeout_flag, &timeout) || timeout <= absl::ZeroDuration()) {
    std::cerr << "substrax-worker: --collective-timeout: '" << timeout_flag
              << "' is not a positive duration such as 30s\n";
    return 2;
  }
  absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(UserPath(job_path));
  if (!spec.ok()) {
    std::cerr << "substrax-worker: invalid job spec:\n" << spec.status().message() << "\n";
    return 2;
  }
  const int64_t needed = RequiredDevices(*spec);
  if (needed > local_devices) {
    std::cerr << "substrax-worker: " << job_path << ": the job's mesh needs " << needed
              << " devices, but --local-devices is " << local_devices << "\n";
    return 2;
  }
  std::vector<Device> devices;
  const std::string host = HostName();
  for (int i = 0; i < local_devices; ++i) devices.push_back({i, host, i, DeviceKind::kCpu, "local"});
  absl::StatusOr<Mesh> mesh = CreateMeshForJob(spec->mesh(), devices);
  if (!mesh.ok()) {
    std::cerr << "substrax-worker: " << job_path << ": " << mesh.status().message() << "\n";
    return 2;
  }
  if (needed < local_devices) {
    std::cerr << "substrax-worker: the job's mesh uses " << needed << " of the " << local_devices
              << " local devices\n";
  }
  std::cerr << DeviceMeshManager::GetMeshInfo(*mesh);

  InMemoryStore store;
  TrainerOptions options(*mesh);
  options.spec = *spec;
  options.process_of_position.assign(mesh->size(), 0);
  options.store = &store;
  options.collective_timeout = timeout;
  options.explicit_collectives = explicit_collectives;
  options.on_progress = PrintProgress;
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

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  CLI::App app{"substrax worker: runs the device-local part of substrax training jobs"};
  app.require_subcommand(1);
  CLI::App* train = app.add_subcommand(
      "train", "Run a whole job in this process on local CPU devices (one thread each, Gloo "
               "between them)");
  std::string job;
  int local_devices = 1;
  std::string timeout = "30s";
  bool explicit_collectives = false;
  train->add_option("--job", job, "Job spec (TrainJob YAML, see docs/job-spec.md)")
      ->required();
  train->add_option("--local-devices", local_devices, "CPU devices to run on")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  train->add_option("--collective-timeout", timeout,
                    "Time every collective must finish in (e.g. 30s, 2m)")
      ->capture_default_str();
  train->add_flag("--explicit-collectives", explicit_collectives,
                  "Reduce gradients with the explicit collective step (the guide's pmap path) "
                  "instead of SpmdTrainStep");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return substrax::RunTrain(job, local_devices, timeout, explicit_collectives);
}
