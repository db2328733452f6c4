#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "core/device.h"
#include "core/device_mesh_manager.h"
#include "core/metric_reductions.h"
#include "core/status.h"
#include "rpc/keepalive.h"
#include "rpc/proto_time.h"
#include "rpc/transport.h"
#include "contract/activity.h"
#include "contract/cpu_features.h"
#include "worker/collectives/job_failpoints.h"
#include "worker/runtime/preemption.h"
#include "worker/sdk/coordinator_store.h"
#include "base/files.h"
#include "base/mutex_mode.h"
#include "worker/sdk/program_impl.h"

namespace substrax {
namespace {

// How long Finish waits for the last step reports to reach the coordinator.
constexpr absl::Duration kFinalFlush = absl::Seconds(10);

std::string VersionString(int major, int minor) { return absl::StrCat(major, ".", minor); }

// The spec's settings a program reads.
JobSettings SettingsOf(const v1::Assignment& assignment) {
  const v1::JobSpec& spec = assignment.spec();
  JobSettings settings;
  settings.job_id = assignment.job_id();
  settings.attempt = assignment.attempt();
  settings.seed = spec.seed();
  settings.global_batch_size = spec.batch().global_batch_size();
  settings.steps = spec.length_case() == v1::JobSpec::kSteps ? spec.steps() : 0;
  settings.epochs = spec.length_case() == v1::JobSpec::kEpochs ? spec.epochs() : 0;
  if (spec.report_every_steps() > 0) settings.report_every_steps = spec.report_every_steps();
  if (spec.has_checkpoint()) {
    settings.checkpoint_directory = spec.checkpoint().directory();
    settings.checkpoint_every_steps = spec.checkpoint().every_steps();
    settings.checkpoint_at_end = !spec.checkpoint().has_at_end() || spec.checkpoint().at_end();
    settings.checkpoint_keep_last = spec.checkpoint().keep_last();
  }
  settings.resume_from = spec.resume_from();
  if (!spec.metrics().empty()) {
    settings.metrics.clear();
    for (const auto& [name, reduction] : spec.metrics()) {
      absl::StatusOr<ReduceOp> op = ReduceOpFromProto(reduction);
      settings.metrics[name] = op.ok() ? ReduceOpName(*op) : "mean";
    }
  }
  return settings;
}

// TLS that verifies the coordinator, with the attempt token as the call credential (no client
// certificate: the process holds no worker identity); or plaintext under --insecure, where the
// coordinator asks for nothing. Errors: FAILED_PRECONDITION when a TLS launch has no token.
absl::StatusOr<TransportOptions> TransportOf(const v1::TransportSettings& t) {
  TransportOptions options;
  options.insecure = t.insecure();
  if (options.insecure) return options;
  if (t.attempt_token().empty()) {
    return absl::FailedPreconditionError(
        "the launch file has no attempt token (transport.attempt_token) to call the "
        "coordinator with: the coordinator is older than this worker's agent; upgrade it");
  }
  options.ca_file = t.ca_file();
  options.server_name = t.server_name();
  options.token = t.attempt_token();
  if (t.has_reload_interval()) options.reload_interval = FromProtoDuration(t.reload_interval());
  return options;
}

// The standalone device count: SUBSTRAX_DEVICES when set, else the options'.
absl::StatusOr<int> StandaloneDevices(int from_options) {
  const char* env = std::getenv(kDevicesEnv);
  int devices = from_options;
  if (env != nullptr && !absl::SimpleAtoi(env, &devices)) {
    return absl::InvalidArgumentError(
        absl::StrCat(kDevicesEnv, "=", env, ": not a number of devices"));
  }
  if (devices < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "standalone devices must be >= 1, got ", devices,
        env != nullptr ? absl::StrCat(" (", kDevicesEnv, ")") : " (InitOptions)"));
  }
  return devices;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgramImpl>> ProgramImpl::Standalone(int devices,
                                                                      JobSettings settings) {
  std::vector<Device> local = MakeUniformCluster(1, devices);
  for (Device& d : local) d.host = d.worker_id = "localhost";
  SUBSTRAX_ASSIGN_OR_RETURN(Mesh mesh, DeviceMeshManager::CreateDataParallelMesh(local));
  std::unique_ptr<ProgramImpl> program(new ProgramImpl(std::move(mesh), std::move(settings)));
  program->process_of_position_.assign(devices, 0);
  program->store_ = std::make_unique<InMemoryStore>();
  return program;
}

namespace {

// The activity file (contract/activity.h) at `path`, unless the launch names none or the
// process's environment turns the counters off (SUBSTRAX_ACTIVITY=off: the benchmark's switch).
// A file that cannot be created costs the job its hang attribution, not its training.
void PublishActivity(const std::string& path) {
  const char* setting = std::getenv("SUBSTRAX_ACTIVITY");
  if (path.empty() || (setting != nullptr && std::string(setting) == "off")) return;
  absl::StatusOr<std::unique_ptr<ActivityBoard>> board = ActivityBoard::Create(path);
  if (!board.ok()) {
    std::fprintf(stderr, "substrax: %s; hangs of this process will not be attributed\n",
                 std::string(board.status().message()).c_str());
    return;
  }
  InstallProcessActivityBoard(std::move(*board));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgramImpl>> ProgramImpl::FromLaunch(const std::string& path) {
  SUBSTRAX_ASSIGN_OR_RETURN(v1::ProgramLaunch launch, ReadLaunchFile(path));
  return FromLaunchProto(std::move(launch));
}

absl::StatusOr<std::unique_ptr<ProgramImpl>> ProgramImpl::FromLaunchProto(
    v1::ProgramLaunch launch) {
  if (launch.sdk_version_major() != SUBSTRAX_VERSION_MAJOR) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the agent that started this program speaks SDK ", launch.sdk_version_major(),
        ".x, but the program runs with the SDK library ", SUBSTRAX_VERSION_STRING,
        ": rebuild the program against the SDK of the agents' release, or run it on agents of "
        "release ", SUBSTRAX_VERSION_MAJOR, ".x"));
  }
  const v1::Assignment& assignment = launch.assignment();
  absl::StatusOr<Mesh> mesh_or = Mesh::FromProto(assignment.mesh());
  if (!mesh_or.ok()) return Annotate(mesh_or.status(), "the launch's mesh");
  const Mesh& mesh = *mesh_or;
  std::unique_ptr<ProgramImpl> program(new ProgramImpl(mesh, SettingsOf(assignment)));
  // Process p drives the devices of the p-th distinct worker in mesh order (the coordinator
  // numbers processes by the same rule).
  std::map<std::string, int> index;
  for (const Device& d : mesh.devices()) {
    program->process_of_position_.push_back(
        index.emplace(d.worker_id, static_cast<int>(index.size())).first->second);
  }
  program->process_index_ = assignment.process_index();
  absl::StatusOr<TransportOptions> transport = TransportOf(launch.transport());
  if (!transport.ok()) return Annotate(transport.status(), "the coordinator's channel");
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannel(launch.coordinator(), *transport, KeepaliveChannelArguments());
  if (!channel.ok()) return Annotate(channel.status(), "the coordinator's channel");
  program->stub_ = v1::CoordinatorService::NewStub(*channel);
  program->store_ = std::make_unique<CoordinatorStore>(
      program->stub_, assignment.job_id(), assignment.attempt(), assignment.rendezvous_secret());
  program->sender_ = std::make_unique<GrpcStepSender>(program->stub_);
  StepReporterOptions reporting;
  reporting.job_id = assignment.job_id();
  reporting.attempt = assignment.attempt();
  ProgramImpl* self = program.get();
  program->reporter_ = std::make_unique<StepReporter>(
      reporting, program->sender_.get(), [self](const absl::Status& status) {
        // The coordinator says this attempt has ended: stop now, wherever the device threads
        // are (they may be blocked in a collective that will never finish).
        std::fprintf(stderr, "substrax: stopping: %s\n", std::string(status.message()).c_str());
        v1::ReportAttemptStatusRequest stopped;
        stopped.set_state(v1::RUNNER_STATE_FAILED);
        stopped.set_error(absl::StrCat("stopped by the coordinator: ", status.message()));
        self->WriteResult(std::move(stopped));
        std::fflush(stderr);
        std::_Exit(1);
      });
  // Every process of a job says in its log which part of which attempt it runs.
  std::fprintf(stderr, "substrax: %s\n", DescribeLaunch(launch).c_str());
  SetJobFailpointProcess(assignment.process_index());
  PublishActivity(launch.activity_path());
  program->launch_ = std::move(launch);
  // Tells the daemon the program is connected to its job (it stops programs that never are).
  if (const std::string& started = program->launch_->started_path(); !started.empty()) {
    SUBSTRAX_RETURN_IF_ERROR(
        Annotate(WriteFileAtomically(started, absl::StrCat(getpid(), "\n")),
                 "telling the worker the program started"));
  }
  return program;
}

ProgramImpl::~ProgramImpl() = default;

std::vector<int> ProgramImpl::local_device_ids() const {
  std::vector<int> local;
  for (int64_t i = 0; i < mesh_.size(); ++i) {
    if (process_of_position_[i] == process_index_) local.push_back(mesh_.devices()[i].id);
  }
  return local;
}

ConnectionOptions ProgramImpl::connection_options() const {
  ConnectionOptions options;
  options.mesh = &mesh_;
  options.process_of_position = &process_of_position_;
  options.process_index = process_index_;
  options.store = store_.get();
  if (launch_.has_value()) {
    options.listen_host = launch_->listen_host();
    if (launch_->has_collective_timeout()) {
      options.collective_timeout = FromProtoDuration(launch_->collective_timeout());
    }
  }
  return options;
}

absl::Status ProgramImpl::RunOnDevices(const std::function<absl::Status(DeviceContext&)>& fn) {
  LocalDeviceOptions local;
  // The program's checkpoints (ConfigureCheckpoints) are committed before RunOnDevices returns.
  local.checkpoints = checkpointer_.get();
  return RunOnDevices(fn, local);
}

absl::Status ProgramImpl::RunOnDevices(const std::function<absl::Status(DeviceContext&)>& fn,
                                       const LocalDeviceOptions& local) {
  if (ran_) return absl::FailedPreconditionError("Program::RunOnDevices was called before");
  ran_ = true;
  if (!fn) return absl::InvalidArgumentError("Program::RunOnDevices: no function given");
  {
    absl::MutexLock lock(&mu_);
    printed_at_ = absl::Now();  // throughput counts from here
  }
  return RunOnLocalDevices(connection_options(), local, fn);
}

void ProgramImpl::SetTotalSteps(int64_t total_steps) {
  absl::MutexLock lock(&mu_);
  total_steps_ = total_steps;
}

absl::Status ProgramImpl::ReportMetrics(const DeviceContext& ctx, int64_t step,
                                        const Metrics& metrics, const ReportTiming& timing) {
  const std::vector<int> local = local_device_ids();
  if (std::find(local.begin(), local.end(), ctx.device.id) == local.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReportMetrics: ", ctx.device.ToString(), " is not driven by process ", process_index_));
  }
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("ReportMetrics: step ", step, " < 0"));
  }
  for (const auto& [name, value] : metrics) {
    if (name.empty()) return absl::InvalidArgumentError("ReportMetrics: an empty metric name");
  }
  if (standalone()) {
    PrintWhenComplete(ctx.device.id, step, metrics, timing);
    return absl::OkStatus();
  }
  v1::StepReport report;
  report.set_step(step);
  report.set_device_id(ctx.device.id);
  report.set_host(ctx.device.host);
  report.set_process_index(process_index_);
  for (const auto& [name, value] : metrics) (*report.mutable_values())[name] = value;
  report.set_samples_per_second(timing.samples_per_second);
  report.set_data_wait_seconds(timing.data_wait_seconds);
  report.set_compute_seconds(timing.compute_seconds);
  report.set_collective_seconds(timing.collective_seconds);
  EnqueueStepReport(std::move(report));
  return absl::OkStatus();
}

void ProgramImpl::EnqueueStepReport(v1::StepReport report) {
  if (reporter_ == nullptr) return;
  {
    absl::MutexLock lock(&mu_);
    if (report.total_steps() == 0) report.set_total_steps(total_steps_);
  }
  if (!report.has_time()) *report.mutable_time() = ToProtoTime(absl::Now());
  reporter_->Enqueue(std::move(report));
}

double ProgramImpl::SamplesPerSecondLocked(int64_t step, double reported) {
  const absl::Time now = absl::Now();
  const double seconds = absl::ToDoubleSeconds(now - printed_at_);
  // The devices' own measurements where they give them; else the steps since the previous line
  // times the global batch (JobSettings::global_batch_size).
  double per_second = reported;
  if (per_second <= 0 && settings_.global_batch_size > 0 && step > printed_step_ && seconds > 0) {
    per_second =
        static_cast<double>((step - printed_step_) * settings_.global_batch_size) / seconds;
  }
  if (per_second > 0 && seconds > 0) {
    measured_samples_ += per_second * seconds;
    measured_time_ += now - printed_at_;
  }
  printed_step_ = std::max(printed_step_, step);
  printed_at_ = now;
  return per_second;
}

void ProgramImpl::PrintWhenComplete(int device_id, int64_t step, const Metrics& metrics,
                                    const ReportTiming& timing) {
  std::map<int, Metrics> devices;
  int64_t total = 0;
  double samples_per_second = 0;
  {
    absl::MutexLock lock(&mu_);
    pending_[step][device_id] = metrics;
    pending_samples_per_second_[step] += std::max(0.0, timing.samples_per_second);
    if (pending_[step].size() < local_device_ids().size()) return;
    devices = std::move(pending_[step]);
    pending_.erase(step);
    samples_per_second = SamplesPerSecondLocked(step, pending_samples_per_second_[step]);
    pending_samples_per_second_.erase(step);
    total = total_steps_;
  }
  StackedMetrics stacked;
  for (const auto& [id, values] : devices) {
    for (const auto& [name, value] : values) stacked[name].push_back(value);
  }
  std::map<std::string, std::string> reductions;
  for (const auto& [name, values] : stacked) {
    auto declared = settings_.metrics.find(name);
    reductions[name] = declared == settings_.metrics.end() ? "mean" : declared->second;
  }
  absl::StatusOr<Metrics> reduced = ReduceCustom(stacked, reductions);
  std::string line = absl::StrCat("step ", step);
  if (total > 0) absl::StrAppend(&line, "/", total);
  if (!reduced.ok()) {
    absl::StrAppend(&line, ": metrics not reduced: ", reduced.status().message());
  } else {
    for (const auto& [name, value] : *reduced) absl::StrAppend(&line, " ", name, "=", value);
  }
  if (samples_per_second > 0) {
    absl::StrAppend(&line, " samples/s=", absl::StrFormat("%.0f", samples_per_second));
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

void ProgramImpl::PrintThroughput() {
  absl::MutexLock lock(&mu_);
  if (measured_time_ <= absl::ZeroDuration()) return;
  std::fprintf(stderr, "substrax: samples/s=%.0f (this process, over its reports to step %lld)\n",
               measured_samples_ / absl::ToDoubleSeconds(measured_time_),
               static_cast<long long>(printed_step_));
}

void ProgramImpl::SetFinalMetrics(const Metrics& metrics) {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, value] : metrics) final_metrics_[name] = value;
}

void ProgramImpl::WriteResult(v1::ReportAttemptStatusRequest result) const {
  if (!launch_.has_value()) return;
  WriteAttemptResult(*launch_, std::move(result));
}


int ProgramImpl::Finish(const absl::Status& trained) {
  absl::Status status = trained;
  // The job has not succeeded until its last checkpoint is committed.
  if (checkpointer_ != nullptr) {
    absl::Status flushed = checkpointer_->Flush();
    if (status.ok()) status = flushed;
  }
  if (reporter_ != nullptr) {
    if (absl::Status flushed = reporter_->Flush(kFinalFlush); !flushed.ok()) {
      std::fprintf(stderr, "substrax: %s\n", flushed.ToString().c_str());
    }
  }
  if (standalone()) PrintThroughput();
  v1::ReportAttemptStatusRequest result;
  if (status.ok()) {
    result.set_state(v1::RUNNER_STATE_SUCCEEDED);
    absl::MutexLock lock(&mu_);
    for (const auto& [name, value] : final_metrics_) (*result.mutable_final_metrics())[name] = value;
  } else {
    result.set_state(v1::RUNNER_STATE_FAILED);
    result.set_error(std::string(status.message()));
    result.set_error_code(static_cast<int32_t>(status.code()));
    std::fprintf(stderr, "substrax: %s failed: %s\n",
                 standalone() ? "the program" : absl::StrCat("process ", process_index_).c_str(),
                 status.ToString().c_str());
  }
  WriteResult(std::move(result));
  std::fflush(stderr);
  return status.ok() ? 0 : 1;
}

namespace internal {

absl::StatusOr<std::unique_ptr<Program>> InitForVersion(int header_major, int header_minor,
                                                        const InitOptions& options) {
  // A program built with -c opt gets the coordinator's and agent's mutex mode (base/mutex_mode.h).
  base::DisableMutexDeadlockDetectionInOptimizedBuilds();
  if (header_major != SUBSTRAX_VERSION_MAJOR || header_minor > SUBSTRAX_VERSION_MINOR) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this program was built against the substrax SDK ",
        VersionString(header_major, header_minor), " but runs with the SDK library ",
        SUBSTRAX_VERSION_STRING, " (", header_major != SUBSTRAX_VERSION_MAJOR
                                           ? "another major version"
                                           : "an older minor version",
        "): rebuild it against the installed SDK ", SUBSTRAX_VERSION_MAJOR,
        ".x (pkg-config --modversion substrax), or install the SDK it was built for"));
  }
  // A program's devices are CPU devices: their kernels need this host's vector units.
  SUBSTRAX_RETURN_IF_ERROR(CheckCpuKernels());
  // The agent's SIGTERM (a cancel or a preemption) sets StopRequested instead of ending the
  // program, so that it can save a checkpoint first.
  InstallSigtermFlag();
  if (const char* launch = std::getenv(kLaunchEnv); launch != nullptr && *launch != '\0') {
    SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<ProgramImpl> program,
                              ProgramImpl::FromLaunch(launch));
    return std::unique_ptr<Program>(std::move(program));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(int devices, StandaloneDevices(options.standalone_devices));
  SUBSTRAX_ASSIGN_OR_RETURN(std::unique_ptr<ProgramImpl> program,
                            ProgramImpl::Standalone(devices, options.standalone_settings));
  return std::unique_ptr<Program>(std::move(program));
}

}  // namespace internal

const char* LibraryVersion() { return SUBSTRAX_VERSION_STRING; }

bool StopRequested() { return SigtermReceived(); }

int ExitWithError(const absl::Status& status) {
  std::fprintf(stderr, "substrax: %s\n", status.ToString().c_str());
  std::fflush(stderr);
  return 1;
}

}  // namespace substrax
