#include "agent/daemon.h"
#include "agent/clock_sample.h"
#include "agent/daemon_internal.h"
#include "agent/command_launch.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "contract/activity.h"
#include "core/data_paths.h"
#include "core/job_env.h"
#include "core/status.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"
#include "rpc/keepalive.h"
#include "rpc/pki.h"
#include "rpc/proto_time.h"
#include "rpc/transport.h"
#include "rpc/transport_flags.h"
#include "contract/cpu_features.h"
#include "contract/devices.h"
#include "agent/runner_outcome.h"
#include "base/backoff.h"

namespace substrax {
namespace {

// Normalizes the directories of a root flag (--data-root, --checkpoint-root); each must exist.
absl::Status NormalizeRoots(const std::string& flag, std::vector<std::string>* roots) {
  for (std::string& root : *roots) {
    absl::StatusOr<std::string> normalized = NormalizeAbsolute(root);
    if (!normalized.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " ", root, ": ", normalized.status().message()));
    }
    struct stat st;
    if (stat(normalized->c_str(), &st) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", root, ": ", std::strerror(errno),
                                                     "; give an existing directory"));
    }
    if (!S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, " ", root, ": not a directory"));
    }
    root = *std::move(normalized);
  }
  return absl::OkStatus();
}

// The command-job options: the port range, and each Python environment's bin/ (ParsePythonEnv
// checked the flags; options set in code are checked here too).
absl::Status CheckCommandOptions(const WorkerDaemonOptions& options) {
  const int first = options.command_port_first, last = options.command_port_last;
  if (!(first == 0 && last == 0) && (first < 1 || last > 65535 || first + 1 > last)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--command-ports ", first, "-", last, ": give FIRST-LAST with 1 <= FIRST < LAST <= "
        "65535 (the rendezvous takes two ports: torch's master and JAX's coordinator)"));
  }
  for (const auto& [name, dir] : options.python_envs) {
    SUBSTRAX_RETURN_IF_ERROR(ParsePythonEnv(absl::StrCat(name, "=", dir)).status());
  }
  return absl::OkStatus();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::string NewIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen), absl::Uniform<uint64_t>(gen));
}

// Whether `pid` is stopped by a signal (state T in /proc/<pid>/stat).
bool IsSuspended(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  const size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'T';
}

using agent_internal::Log;

// Time on the monotonic clock (never steps with the wall clock).
absl::Duration Monotonic() {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

using agent_internal::Deadline;

// The job binary the agent starts for built-in jobs: `*path`, or when empty `substrax-job` in
// the agent's own directory (where the images install both), or in Bazel's output tree. Checked here, so that a
// missing binary stops the agent at start rather than failing every built-in job.
absl::Status FindJobBinary(std::string* path) {
  if (path->empty()) {
    std::error_code error;
    const std::filesystem::path dir =
        std::filesystem::read_symlink("/proc/self/exe", error).parent_path();
    // Beside the agent (an install), else in Bazel's output tree (bazel-bin/agent, .../worker).
    *path = (dir / "substrax-job").string();
    const std::string in_bazel_bin = (dir.parent_path() / "worker" / "substrax-job").string();
    if (!error && access(path->c_str(), X_OK) != 0 && access(in_bazel_bin.c_str(), X_OK) == 0) {
      *path = in_bazel_bin;
    }
  }
  if (access(path->c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--job-binary ", *path, " cannot be executed (", std::strerror(errno),
        "): install substrax-job beside substrax-agent, or name it with --job-binary"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Create(WorkerDaemonOptions options) {
  if (options.devices.empty() && options.cpu_devices < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cpu-devices must be >= 1, got ", options.cpu_devices));
  }
  if (options.host.empty()) options.host = HostName();
  if (options.devices.empty()) options.devices = absl::StrCat("cpu:", options.cpu_devices);
  absl::StatusOr<std::vector<v1::Device>> devices = DiscoverDevices(options.devices, options.host);
  if (!devices.ok()) return devices.status();
  for (const v1::Device& device : *devices) {
    // Refused at start, not at a job's first step: CPU devices run the CPU kernels.
    if (device.kind() == v1::DEVICE_KIND_CPU) {
      SUBSTRAX_RETURN_IF_ERROR(Annotate(CheckCpuKernels(), "--devices: CPU devices"));
      break;
    }
  }
  SUBSTRAX_RETURN_IF_ERROR(ValidateTransport(options.transport, /*server=*/false));
  if (!options.transport.insecure) {
    // The certificate is the worker's identity: its CN is the worker id.
    if (options.transport.cert_file.empty()) {
      return absl::InvalidArgumentError(
          "--tls-cert and --tls-key are required: a worker's certificate (CN: its worker id, "
          "O: substrax:worker) is its identity; `substraxctl certs issue --role worker` makes "
          "one");
    }
    std::ifstream in(options.transport.cert_file);
    std::stringstream pem;
    pem << in.rdbuf();
    absl::StatusOr<pki::CertificateInfo> cert = pki::ParseCertificate(pem.str());
    if (!cert.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls-cert ", options.transport.cert_file, ": ", cert.status().message()));
    }
    if (options.worker_id.empty()) options.worker_id = cert->common_name;
    if (options.worker_id != cert->common_name) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--worker-id ", options.worker_id, " but the certificate ",
          options.transport.cert_file, " is worker ", cert->common_name,
          "'s: the coordinator accepts a worker only under its certificate's name"));
    }
  }
  if (options.worker_id.empty()) options.worker_id = options.host;
  SUBSTRAX_RETURN_IF_ERROR(NormalizeRoots("--data-root", &options.data_roots));
  SUBSTRAX_RETURN_IF_ERROR(NormalizeRoots("--checkpoint-root", &options.checkpoint_roots));
  SUBSTRAX_RETURN_IF_ERROR(NormalizeRoots("--programs-dir", &options.programs_dirs));
  if (options.program_init_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--program-init-timeout must be a positive duration such as 60s, got ",
                     absl::FormatDuration(options.program_init_timeout)));
  }

  SUBSTRAX_RETURN_IF_ERROR(CheckCommandOptions(options));
  SUBSTRAX_RETURN_IF_ERROR(FindJobBinary(&options.job_binary));
  for (const std::string& name : options.job_env_pass) {
    if (std::string problem = JobEnvNameProblem(name); !problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job-env-pass '", name, "': ", problem));
    }
  }
  JobUser job_user = CurrentUser();
  if (!options.job_user.empty()) {
    SUBSTRAX_ASSIGN_OR_RETURN(job_user, ResolveJobUser(options.job_user));
  }
  if (options.work_dir.empty()) options.work_dir = DefaultWorkDir();
  SUBSTRAX_RETURN_IF_ERROR(PrepareWorkDir(options.work_dir));
  // The job user reaches its attempts' directories through the work dir, and nothing else in
  // it: search, no listing (the logs and the other attempts' files are the agent's, 0600).
  if (!options.job_user.empty() && chmod(options.work_dir.c_str(), 0711) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot make work dir ", options.work_dir,
                                               " 0711 for --job-user: ", std::strerror(errno)));
  }
  return std::unique_ptr<WorkerDaemon>(
      new WorkerDaemon(std::move(options), std::move(job_user), *std::move(devices)));
}

namespace {

LaunchSettings SettingsOf(const WorkerDaemonOptions& options, JobUser job_user) {
  LaunchSettings settings;
  settings.job_user = std::move(job_user);
  settings.switch_user = !options.job_user.empty();
  settings.job_env_pass = options.job_env_pass;
  settings.worker_id = options.worker_id;
  settings.host = options.host;
  settings.coordinator = options.coordinator;
  settings.transport = options.transport;
  settings.listen_host = options.listen_host;
  settings.collective_timeout = options.collective_timeout;
  settings.data_roots = options.data_roots;
  settings.checkpoint_roots = options.checkpoint_roots;
  settings.programs_dirs = options.programs_dirs;
  settings.job_binary = options.job_binary;
  settings.python_envs = options.python_envs;
  settings.allow_command_jobs = options.allow_command_jobs;
  settings.command_port_first = options.command_port_first;
  settings.command_port_last = options.command_port_last;
  settings.stop_grace = options.stop_grace;
  settings.agent_cuda_visible_devices = AgentCudaVisibleDevices();
  return settings;
}

}  // namespace

WorkerDaemon::WorkerDaemon(WorkerDaemonOptions options, JobUser job_user,
                           std::vector<v1::Device> devices)
    : options_(std::move(options)),
      launch_settings_(SettingsOf(options_, std::move(job_user))),
      devices_(std::move(devices)) {
  // Validated by Create.
  stub_ = v1::CoordinatorService::NewStub(
      *MakeChannel(options_.coordinator, options_.transport, KeepaliveChannelArguments()));
  log_sink_ = std::make_unique<GrpcLogSink>(stub_);
  LogShipperOptions shipper;
  shipper.worker_id = options_.worker_id;
  shipper.host = options_.host;
  shipper.log = [](const std::string& line) { Log(line); };
  log_shipper_ = std::make_unique<LogShipper>(std::move(shipper), log_sink_.get());
}

WorkerDaemon::~WorkerDaemon() {
  Stop();
  // Housekeeping returns once every runner has exited (SIGKILL after the stop grace).
  if (housekeeping_.joinable()) housekeeping_.join();
  std::map<int64_t, std::thread> reapers;
  {
    absl::MutexLock lock(&mu_);
    reapers.swap(reapers_);
  }
  for (auto& [id, t] : reapers) t.join();
}

std::string WorkerDaemon::Incarnation() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

absl::Duration WorkerDaemon::FenceDeadlineLocked() const {
  // The coordinator counts the lease from its receipt of the heartbeat, later than its sending:
  // the margin covers the two hosts' monotonic clocks running at slightly different rates and
  // the supervisor's own reaction.
  const absl::Duration margin = std::min(heartbeat_timeout_ / 10, absl::Seconds(1));
  return last_renewal_ + heartbeat_timeout_ - margin;
}

absl::Status WorkerDaemon::Register() {
  v1::RegisterWorkerRequest request;
  request.set_worker_id(options_.worker_id);
  request.set_host(options_.host);
  const std::string incarnation = NewIncarnation();
  request.set_incarnation(incarnation);
  request.set_address(options_.listen_host);
  for (const v1::Device& d : devices_) *request.add_devices() = d;
  for (const std::string& root : options_.data_roots) request.add_data_roots(root);
  for (const std::string& root : options_.checkpoint_roots) request.add_checkpoint_roots(root);
  for (const std::string& dir : options_.programs_dirs) request.add_programs_dirs(dir);
  for (const auto& [name, dir] : options_.python_envs) request.add_python_envs(name);
  request.set_runs_commands(RunsCommands(launch_settings_));
  // Retries every failure, forever, until stopped: an agent that gives up is a host lost until
  // someone restarts it, whereas what refuses it now usually passes (a coordinator restarting,
  // the worker cap reached until dead workers are removed, a certificate being renewed, an old
  // incarnation still being expired). Unreachable (UNAVAILABLE, DEADLINE_EXCEEDED): backoff up
  // to 5 s, so that a restarted coordinator is found quickly; refused (any other code): up to
  // 60 s, so that a fleet refused together does not hammer the coordinator. Both with jitter,
  // and each failure logged with what to check.
  Backoff unreachable({.initial = absl::Milliseconds(100), .max = absl::Seconds(5)});
  Backoff refused({.initial = absl::Seconds(1), .max = absl::Seconds(60)});
  while (!stopped_.HasBeenNotified()) {
    grpc::ClientContext context;
    // Wait (up to the deadline) for a connection rather than fail at once with the last
    // connection error: a restarted coordinator is found as soon as it listens.
    context.set_wait_for_ready(true);
    context.set_deadline(Deadline(absl::Seconds(10)));
    v1::RegisterWorkerResponse response;
    const absl::Duration sent = Monotonic();
    grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    if (status.ok()) {
      absl::MutexLock lock(&mu_);
      incarnation_ = incarnation;
      last_renewal_ = sent;
      fenced_ = false;
      heartbeat_timeout_ = FromProtoDuration(response.heartbeat_timeout());
      if (heartbeat_timeout_ <= absl::ZeroDuration()) heartbeat_timeout_ = absl::Seconds(10);
      watch_epoch_.clear();
      watch_cursor_ = 0;
      heartbeat_interval_ = FromProtoDuration(response.heartbeat_interval());
      if (heartbeat_interval_ <= absl::ZeroDuration()) heartbeat_interval_ = absl::Seconds(1);
      Log(absl::StrCat("registered as ", options_.worker_id, " incarnation ", incarnation,
                       " (host ", options_.host, ", ",
                       devices_.size(), " devices from '", options_.devices, "', data roots: ",
                       options_.data_roots.empty() ? "none, synthetic data only"
                                                   : absl::StrJoin(options_.data_roots, ", "),
                       "; checkpoint roots: ",
                       options_.checkpoint_roots.empty()
                           ? "none, no checkpoints"
                           : absl::StrJoin(options_.checkpoint_roots, ", "),
                       "; programs dirs: ",
                       options_.programs_dirs.empty()
                           ? "none, no program jobs"
                           : absl::StrJoin(options_.programs_dirs, ", "),
                       ") with ", options_.coordinator));
      return absl::OkStatus();
    }
    const bool is_unreachable = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
    const absl::Duration wait = is_unreachable ? *unreachable.Next() : *refused.Next();
    if (is_unreachable) {
      Log(absl::StrCat("coordinator ", options_.coordinator, " unreachable (",
                       status.error_message(), "); retrying in ",
                       absl::FormatDuration(absl::Trunc(wait, absl::Milliseconds(10)))));
    } else {
      Log(absl::StrCat(
          "registration as ", options_.worker_id, " refused by ", options_.coordinator, " (",
          FromGrpcStatus(status, "registering").ToString(),
          "): check the coordinator's log and this worker's flags and certificate; retrying in ",
          absl::FormatDuration(absl::Trunc(wait, absl::Milliseconds(10)))));
    }
    stopped_.WaitForNotificationWithTimeout(wait);
  }
  return absl::CancelledError("stopped before registering");
}

void WorkerDaemon::SetReady(bool ready) {
  if (health_ != nullptr) health_->SetServing(kWorkerReadyService, ready);
}

absl::Status WorkerDaemon::Run() {
  if (!housekeeping_.joinable()) housekeeping_ = std::thread([this] { Housekeeping(); });
  if (!options_.health_listen.empty()) {
    absl::StatusOr<std::unique_ptr<HealthServer>> health = HealthServer::Start(options_.health_listen);
    if (!health.ok()) return health.status();
    health_ = *std::move(health);
    SetReady(false);
  }
  if (absl::Status s = Register(); !s.ok()) return s;
  SetReady(true);
  std::thread heartbeats([this] { HeartbeatLoop(); });
  std::thread watcher([this] { WatchLoop(); });
  stopped_.WaitForNotification();
  heartbeats.join();
  watcher.join();
  return absl::OkStatus();
}

void WorkerDaemon::Stop() {
  if (!stopped_.HasBeenNotified()) stopped_.Notify();
  TerminateAll("the worker daemon is stopping");
}

void WorkerDaemon::HeartbeatLoop() {
  while (!stopped_.HasBeenNotified()) {
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      interval = heartbeat_interval_;
    }
    v1::HeartbeatRequest request;
    request.set_worker_id(options_.worker_id);
    // Outside the lock: a file read (at most once per reload interval).
    if (std::optional<absl::Time> expiry = certificate_expiry_.NotAfter(absl::Now());
        expiry.has_value()) {
      *request.mutable_certificate_not_after() = ToProtoTime(*expiry);
    }
    std::vector<std::pair<v1::RunnerRef*, std::string>> activity_files;
    {
      absl::MutexLock lock(&mu_);
      request.set_incarnation(incarnation_);
      // Acknowledges the assignment events received so far (the coordinator drops them).
      request.set_watch_epoch(watch_epoch_);
      request.set_watch_cursor(watch_cursor_);
      if (clock_.has_value()) *request.mutable_clock() = *clock_;
      for (const auto& [key, runner] : runners_) {
        v1::RunnerRef* ref = request.add_runners();
        ref->set_job_id(runner.job_id);
        ref->set_attempt(runner.attempt);
        ref->set_process_index(runner.process_index);
        ref->set_ended(runner.ended);
        ref->set_suspended(!runner.ended && IsSuspended(runner.pid));
        if (!runner.ended && !runner.activity_path.empty()) {
          activity_files.emplace_back(ref, runner.activity_path);
        }
      }
    }
    // What each runner's devices and communicators are doing, read outside the lock: a few
    // tens of kilobytes per runner, no call into the runner (it may be blocked or stopped).
    for (auto& [ref, path] : activity_files) {
      absl::StatusOr<v1::ProcessActivity> activity = ReadActivityFile(path);
      if (!activity.ok()) continue;  // not published (yet), or not an activity file
      *activity->mutable_read_time() = ToProtoTime(absl::Now());
      *ref->mutable_activity() = std::move(*activity);
    }
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    // No longer than an interval: a dropped packet must not hold up the fencing check below.
    context.set_deadline(Deadline(std::max(interval, absl::Milliseconds(200))));
    v1::HeartbeatResponse response;
    const absl::Duration sent = Monotonic();
    const absl::Time sent_wall = absl::Now();
    grpc::Status status = stub_->Heartbeat(&context, request, &response);
    if (status.ok()) {
      const absl::Time received_wall = absl::Now();
      absl::MutexLock lock(&mu_);
      last_renewal_ = sent;
      if (response.has_server_time()) {
        clock_ = MeasureClock(sent_wall, received_wall, FromProtoTime(response.server_time()));
      }
      // Each runner's supervisor may let it run until the lease's new end (supervisor.h).
      const absl::Duration deadline = FenceDeadlineLocked();
      for (const auto& [key, runner] : runners_) {
        if (!runner.ended && runner.control_fd >= 0) SendRenewal(runner.control_fd, deadline);
      }
      if (fenced_) {
        fenced_ = false;
        Log("the coordinator is reachable again");
      }
    }
    for (const v1::StopAttempt& stop : response.stop()) {
      if (!CheckJobId(stop.job_id(), "a heartbeat's stop")) continue;
      Terminate(absl::StrCat(stop.job_id(), "/", stop.attempt()),
                StopOrderOf(stop, options_.stop_grace, "the coordinator says: "));
    }
    if (status.error_code() == grpc::StatusCode::ABORTED ||
        status.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The coordinator declared this incarnation dead (or forgot it): its attempts have been
      // failed, so their runners must go; then join again as a new incarnation.
      Log(absl::StrCat("lease lost (", status.error_message(), "); registering again"));
      SetReady(false);
      TerminateAll("the worker lost its lease", /*fence=*/true);
      // Never offer the devices again while an old runner still uses them.
      if (!AwaitRunnersExited(options_.stop_grace + absl::Seconds(5))) {
        Log("runners still alive after SIGKILL; registering anyway");
      }
      if (!Register().ok()) return;
      SetReady(true);
    } else if (!status.ok()) {
      Log(absl::StrCat("heartbeat failed: ", status.error_message()));
      absl::Duration unrenewed, timeout;
      bool fence = false;
      {
        absl::MutexLock lock(&mu_);
        unrenewed = Monotonic() - last_renewal_;
        timeout = heartbeat_timeout_;
        fence = !fenced_ && unrenewed >= timeout;
        if (fence) fenced_ = true;
      }
      if (fence) {
        const std::string why = absl::StrCat(
            "coordinator unreachable for ", absl::FormatDuration(absl::Trunc(unrenewed,
                                                                             absl::Milliseconds(100))),
            " (the heartbeat timeout is ", absl::FormatDuration(timeout),
            "): fencing, since the coordinator may restart these attempts elsewhere");
        Log(why);
        TerminateAll(why, /*fence=*/true);
      }
    }
    stopped_.WaitForNotificationWithTimeout(interval);
  }
}

void WorkerDaemon::WatchLoop() {
  // Re-opens the stream whenever it ends (coordinator restart, network), after a short backoff.
  while (!stopped_.HasBeenNotified()) {
    grpc::ClientContext context;
    v1::WatchAssignmentsRequest request;
    request.set_worker_id(options_.worker_id);
    {
      // Resume after the last event received, so that nothing is replayed (Kubernetes' watch
      // from a resourceVersion).
      absl::MutexLock lock(&mu_);
      request.set_incarnation(incarnation_);
      request.set_epoch(watch_epoch_);
      request.set_cursor(watch_cursor_);
    }
    std::unique_ptr<grpc::ClientReader<v1::WatchAssignmentsResponse>> reader =
        stub_->WatchAssignments(&context, request);
    // Cancels the stream when the daemon stops; ends with the stream otherwise.
    std::atomic<bool> stream_done{false};
    std::thread canceller([&] {
      while (!stream_done.load()) {
        if (stopped_.WaitForNotificationWithTimeout(absl::Milliseconds(200))) {
          context.TryCancel();
          return;
        }
      }
    });
    v1::WatchAssignmentsResponse event;
    while (reader->Read(&event)) {
      {
        absl::MutexLock lock(&mu_);
        if (incarnation_ != request.incarnation()) break;  // re-registered: a new queue
        watch_epoch_ = event.epoch();
        watch_cursor_ = event.cursor();
      }
      if (event.has_start() && CheckJobId(event.start().job_id(), "an assignment")) {
        Launch(event.start());
      }
      if (event.has_stop() && CheckJobId(event.stop().job_id(), "a stop event")) {
        Terminate(absl::StrCat(event.stop().job_id(), "/", event.stop().attempt()),
                  StopOrderOf(event.stop(), options_.stop_grace));
      }
    }
    context.TryCancel();  // no-op unless the loop left early
    grpc::Status status = reader->Finish();
    stream_done = true;
    canceller.join();
    if (stopped_.HasBeenNotified()) break;
    SkipUnreceivableEvent(status, request.incarnation());
    Log(absl::StrCat("assignment stream ended (", status.error_message(), "); reopening"));
    stopped_.WaitForNotificationWithTimeout(absl::Seconds(1));
  }
}

void WorkerDaemon::SkipUnreceivableEvent(const grpc::Status& status,
                                         const std::string& incarnation) {
  // gRPC ends a stream whose next message is over the channel's receive limit with
  // RESOURCE_EXHAUSTED "Received message larger than max": reopened at the same cursor, the same
  // event would end it again, forever. Events are numbered one by one (the next is cursor + 1),
  // so resume after it. The coordinator never sends one that large (kMaxAssignmentEventBytes);
  // this guards a daemon with a smaller limit. Before the first event (no epoch yet) the
  // coordinator would resend from the start whatever cursor is asked, so nothing is skipped.
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED ||
      !absl::StrContains(status.error_message(), "larger than max")) {
    return;
  }
  int64_t skipped = 0;
  {
    absl::MutexLock lock(&mu_);
    if (incarnation_ != incarnation || watch_epoch_.empty()) return;
    skipped = ++watch_cursor_;
  }
  Log(absl::StrCat("skipped assignment event ", skipped,
                   ": larger than this daemon receives (", status.error_message(),
                   "); an attempt it started or stopped is not run here. Check the "
                   "coordinator's version (it cuts events to 4 MiB)"));
}

bool WorkerDaemon::CheckJobId(const std::string& job_id, absl::string_view what) const {
  if (IsDns1123Label(job_id)) return true;
  // Not quoted as it came: it may hold anything, control characters included.
  std::string shown;
  for (char c : job_id.substr(0, 80)) {
    const unsigned char byte = static_cast<unsigned char>(c);
    shown += absl::ascii_isprint(byte) ? std::string(1, c) : absl::StrFormat("\\x%02x", byte);
  }
  Log(absl::StrCat("refused ", what, " for job id '", shown, "'",
                   job_id.size() > 80 ? "..." : "", ": not a DNS-1123 label of at most ",
                   kMaxDnsLabelLength,
                   " characters (lowercase letters, digits, '-'); job ids name files, so nothing "
                   "is run or written for it. Check the coordinator's version and address (",
                   options_.coordinator, ")"));
  return false;
}

}  // namespace substrax
