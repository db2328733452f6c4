#include "agent/daemon.h"

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

void Log(const std::string& message) {
  std::fprintf(stderr, "substrax-agent: %s\n", message.c_str());
  std::fflush(stderr);
}

// Time on the monotonic clock (never steps with the wall clock).
absl::Duration Monotonic() {
  return absl::FromChrono(std::chrono::steady_clock::now().time_since_epoch());
}

std::chrono::system_clock::time_point Deadline(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

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
    {
      absl::MutexLock lock(&mu_);
      request.set_incarnation(incarnation_);
      // Acknowledges the assignment events received so far (the coordinator drops them).
      request.set_watch_epoch(watch_epoch_);
      request.set_watch_cursor(watch_cursor_);
      for (const auto& [key, runner] : runners_) {
        v1::RunnerRef* ref = request.add_runners();
        ref->set_job_id(runner.job_id);
        ref->set_attempt(runner.attempt);
        ref->set_process_index(runner.process_index);
        ref->set_ended(runner.ended);
        ref->set_suspended(!runner.ended && IsSuspended(runner.pid));
      }
    }
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    // No longer than an interval: a dropped packet must not hold up the fencing check below.
    context.set_deadline(Deadline(std::max(interval, absl::Milliseconds(200))));
    v1::HeartbeatResponse response;
    const absl::Duration sent = Monotonic();
    grpc::Status status = stub_->Heartbeat(&context, request, &response);
    if (status.ok()) {
      absl::MutexLock lock(&mu_);
      last_renewal_ = sent;
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
                absl::StrCat("the coordinator says: ", stop.reason()));
    }
    if (status.error_code() == grpc::StatusCode::ABORTED ||
        status.error_code() == grpc::StatusCode::NOT_FOUND) {
      // The coordinator declared this incarnation dead (or forgot it): its attempts have been
      // failed, so their runners must go; then join again as a new incarnation.
      Log(absl::StrCat("lease lost (", status.error_message(), "); registering again"));
      SetReady(false);
      TerminateAll("the worker lost its lease");
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
        TerminateAll(why);
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
                  event.stop().reason());
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

void WorkerDaemon::Launch(const v1::Assignment& assignment) {
  const std::string key = absl::StrCat(assignment.job_id(), "/", assignment.attempt());
  {
    // slurmd's rule: a replayed launch is refused. Held across the fork so that two deliveries
    // of one event cannot both pass.
    absl::MutexLock lock(&mu_);
    if (!launched_.insert(absl::StrCat(key, "/", assignment.process_index())).second) {
      Log(absl::StrCat("job ", key, " process ", assignment.process_index(),
                       " was launched before; ignoring the repeated assignment"));
      return;
    }
  }
  const AttemptFiles files =
      FilesOfAttempt(options_.work_dir, assignment, launch_settings_.switch_user);
  const bool program = assignment.spec().has_program();
  Runner runner;
  runner.job_id = assignment.job_id();
  runner.attempt = assignment.attempt();
  runner.process_index = assignment.process_index();
  runner.result_path = files.result;
  runner.stderr_path = files.log;
  runner.started_path = files.started;
  if (program) runner.program = assignment.spec().program().path();
  const std::string what = program ? absl::StrCat("the program ", runner.program) : "a runner";
  if (absl::Status s = WriteAttemptFiles(launch_settings_, assignment, files); !s.ok()) {
    ReportLaunchFailure(runner, absl::StrCat("cannot start ", what, ": ", s.message()));
    return;
  }
  // The program checks (launch.h) name the program, host and worker themselves.
  absl::StatusOr<ChildCommand> command = BuildCommand(launch_settings_, assignment, files);
  if (!command.ok()) {
    ReportLaunchFailure(runner, std::string(command.status().message()));
    return;
  }
  // Opened here, not in the child, so that a failure (a full or read-only disk) is reported;
  // the agent's alone (a job user writes it through the descriptor it inherits).
  const int log_fd =
      open(files.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (log_fd < 0) {
    ReportLaunchFailure(runner, absl::StrCat("cannot start ", what, ": cannot create its log ",
                                             files.log, ": ", std::strerror(errno)));
    return;
  }
  Supervision supervision;
  supervision.grace = options_.stop_grace;
  supervision.label = files.launch;
  {
    absl::MutexLock lock(&mu_);
    supervision.deadline = FenceDeadlineLocked();
  }
  absl::StatusOr<SupervisedChild> child = StartSupervised(*command, log_fd, supervision);
  close(log_fd);
  if (!child.ok()) {
    ReportLaunchFailure(runner,
                        absl::StrCat("cannot start ", what, ": ", child.status().message()));
    return;
  }
  runner.pid = child->job;
  runner.supervisor = child->supervisor;
  runner.control_fd = child->control_fd;
  // Housekeeping wakes for the deadline and stops a program that has not joined its job by then.
  if (program) runner.init_deadline = absl::Now() + options_.program_init_timeout;
  Log(absl::StrCat("started ", program ? absl::StrCat("program ", runner.program) : "runner", " ",
                   runner.pid, " for job ", key, " process ", runner.process_index,
                   " (supervisor ", runner.supervisor, ")"));
  log_shipper_->Add(runner.job_id, runner.attempt, runner.process_index, files.log);
  absl::MutexLock lock(&mu_);
  runners_[key] = runner;
  const int64_t id = next_reaper_++;
  // Inserted under mu_, which the reaper needs before it can finish: never joined before this.
  reapers_[id] = std::thread([this, id, key, c = *child] { Reap(id, key, c); });
}

void WorkerDaemon::ReportLaunchFailure(const Runner& runner, const std::string& error) {
  Log(absl::StrCat("job ", runner.job_id, " attempt ", runner.attempt, " process ",
                   runner.process_index, ": ", error));
  v1::ReportAttemptStatusRequest failed;
  failed.set_job_id(runner.job_id);
  failed.set_attempt(runner.attempt);
  failed.set_worker_id(options_.worker_id);
  failed.set_process_index(runner.process_index);
  failed.set_state(v1::RUNNER_STATE_FAILED);
  failed.set_error(error);
  ReportStatus(failed);
}

void WorkerDaemon::Terminate(const std::string& key, const std::string& reason) {
  pid_t pid = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = runners_.find(key);
    if (it == runners_.end() || it->second.stop_requested || it->second.ended) return;
    it->second.stop_requested = true;
    it->second.stop_reason = reason;
    // Housekeeping sends SIGKILL then if the runner is still there (it wakes for the change).
    it->second.kill_at = absl::Now() + options_.stop_grace;
    pid = it->second.pid;
    // Its supervisor signals the group (the agent never signals a process it does not reap).
    SendSignal(it->second.control_fd, SIGTERM);
  }
  Log(absl::StrCat("stopping runner ", pid, " of job ", key, ": ", reason));
}

void WorkerDaemon::Housekeeping() {
  absl::Time next_cleanup = absl::Now();  // at start
  while (true) {
    std::vector<std::thread> done;
    std::vector<std::pair<std::string, pid_t>> to_kill;
    std::vector<std::string> init_due;
    bool clean = false;
    bool exit = false;
    {
      absl::MutexLock lock(&mu_);
      absl::Time wake = next_cleanup;
      for (const auto& [key, r] : runners_) {
        if (!r.ended && !r.killed) wake = std::min(wake, r.kill_at);
        if (!r.ended) wake = std::min(wake, r.init_deadline);
      }
      auto ready = [this, wake]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        if (!finished_reapers_.empty()) return true;
        bool running = false;
        for (const auto& [key, r] : runners_) {
          if (r.ended) continue;
          running = true;
          if (!r.killed && r.kill_at < wake) return true;  // a new stop: its deadline is first
          if (r.init_deadline < wake) return true;  // a new program: its init deadline is first
        }
        return stopped_.HasBeenNotified() && !running;
      };
      mu_.AwaitWithDeadline(absl::Condition(&ready), wake);
      const absl::Time now = absl::Now();
      bool running = false;
      for (auto& [key, r] : runners_) {
        if (r.ended) continue;
        running = true;
        if (!r.killed && r.kill_at <= now) {
          r.killed = true;
          SendSignal(r.control_fd, SIGKILL);
          to_kill.emplace_back(key, r.pid);
        }
        if (r.init_deadline <= now) init_due.push_back(key);
      }
      for (int64_t id : finished_reapers_) {
        done.push_back(std::move(reapers_[id]));
        reapers_.erase(id);
        clean = true;
      }
      finished_reapers_.clear();
      clean = clean || now >= next_cleanup;
      exit = stopped_.HasBeenNotified() && !running;
    }
    for (const auto& [key, pid] : to_kill) {
      Log(absl::StrCat("runner ", pid, " of job ", key, " still there after ",
                       absl::FormatDuration(options_.stop_grace), ": SIGKILL"));
    }
    CheckProgramInits(init_due);
    for (std::thread& t : done) t.join();
    if (clean && !exit) {
      CleanWorkDirNow();
      next_cleanup = absl::Now() + options_.cleanup_interval;
    }
    if (exit) return;
  }
}

void WorkerDaemon::CheckProgramInits(const std::vector<std::string>& due) {
  for (const std::string& key : due) {
    std::string started_path, program;
    {
      absl::MutexLock lock(&mu_);
      auto it = runners_.find(key);
      if (it == runners_.end()) continue;
      it->second.init_deadline = absl::InfiniteFuture();  // checked once
      if (it->second.ended || it->second.stop_requested) continue;
      started_path = it->second.started_path;
      program = it->second.program;
    }
    // Outside the lock: a file system lookup.
    if (access(started_path.c_str(), F_OK) == 0) continue;
    {
      absl::MutexLock lock(&mu_);
      auto it = runners_.find(key);
      if (it == runners_.end() || it->second.ended) continue;
      it->second.init_timed_out = true;
    }
    Terminate(key, absl::StrCat("the program ", program, " did not call substrax::Init within ",
                                absl::FormatDuration(options_.program_init_timeout),
                                " (--program-init-timeout)"));
  }
}

void WorkerDaemon::CleanWorkDirNow() {
  std::set<std::string> running;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, r] : runners_) running.insert(AttemptFilePrefix(r.job_id, r.attempt));
  }
  // A log still being shipped stays too.
  for (const auto& [job_id, attempt] : log_shipper_->Pending()) {
    running.insert(AttemptFilePrefix(job_id, attempt));
  }
  absl::StatusOr<CleanupResult> cleaned =
      CleanWorkDir(options_.work_dir, options_.log_retention, running, absl::Now());
  if (!cleaned.ok()) {
    Log(absl::StrCat("work dir cleanup: ", cleaned.status().message()));
    return;
  }
  if (cleaned->attempts_deleted > 0) {
    Log(absl::StrCat("work dir cleanup: deleted the files of ", cleaned->attempts_deleted,
                     " ended attempts (", cleaned->bytes_deleted, " bytes); ",
                     cleaned->bytes_kept, " bytes kept"));
  }
  for (const std::string& error : cleaned->errors) {
    Log(absl::StrCat("work dir cleanup: cannot delete ", error));
  }
}

bool WorkerDaemon::AwaitRunnersExited(absl::Duration timeout) {
  auto none_running = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [key, runner] : runners_) {
      if (!runner.ended) return false;
    }
    return true;
  };
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&none_running), timeout);
}

void WorkerDaemon::TerminateAll(const std::string& reason) {
  std::vector<std::string> keys;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, runner] : runners_) keys.push_back(key);
  }
  for (const std::string& key : keys) Terminate(key, reason);
}

void WorkerDaemon::Reap(int64_t reaper, std::string key, SupervisedChild child) {
  // The supervisor reports the job's exit and SIGKILLs what it left behind in its group.
  const SupervisedExit exited = AwaitExit(&child);
  const pid_t pid = child.job;
  if (!exited.reported) {
    Log(absl::StrCat("job ", key, ": the supervisor ", child.supervisor, " of runner ", pid,
                     " died without reporting its exit (",
                     WIFSIGNALED(exited.wait_status)
                         ? absl::StrCat("killed by signal ", WTERMSIG(exited.wait_status))
                         : absl::StrCat("exit status ", WEXITSTATUS(exited.wait_status)),
                     "); its process group got SIGKILL"));
  }
  Runner runner;
  {
    // Listed in heartbeats as ended until the coordinator has its outcome.
    absl::MutexLock lock(&mu_);
    Runner& r = runners_[key];
    r.ended = true;
    close(r.control_fd);
    r.control_fd = -1;
    if (exited.fence != FenceCause::kNone && !r.stop_requested) {
      r.stop_requested = true;
      r.stop_reason = absl::StrCat("fenced by its supervisor: ", FenceReason(exited.fence));
    }
    runner = r;
  }
  // The rest of its output reaches the coordinator before its outcome, so that the logs of an
  // ended job are complete (bounded: an unreachable coordinator gets the rest later).
  log_shipper_->Ended(runner.job_id, runner.attempt, runner.process_index);
  if (!log_shipper_->AwaitShipped(runner.job_id, runner.attempt, runner.process_index,
                                  options_.log_flush_timeout)) {
    Log(absl::StrCat("job ", key, ": the end of the runner's log is not shipped yet after ",
                     absl::FormatDuration(options_.log_flush_timeout),
                     "; it follows in the background"));
  }
  RunnerExit exit;
  exit.wait_status = exited.wait_status;
  exit.stop_requested = runner.stop_requested;
  exit.stop_reason = runner.stop_reason;
  exit.result_path = runner.result_path;
  exit.log_path = runner.stderr_path;
  exit.program = runner.program;
  exit.started_path = runner.started_path;
  exit.init_timed_out = runner.init_timed_out;
  exit.init_timeout = options_.program_init_timeout;
  std::string warning;
  v1::ReportAttemptStatusRequest report = RunnerOutcome(exit, &warning);
  if (!warning.empty()) Log(absl::StrCat("job ", key, ": ", warning));
  report.set_job_id(runner.job_id);
  report.set_attempt(runner.attempt);
  report.set_worker_id(options_.worker_id);
  report.set_process_index(runner.process_index);
  if (report.state() == v1::RUNNER_STATE_SUCCEEDED) {
    Log(absl::StrCat("runner ", pid, " of job ", key, " succeeded"));
  } else {
    Log(absl::StrCat("runner ", pid, " of job ", key, " failed: ", report.error()));
  }
  ReportStatus(report);
  absl::MutexLock lock(&mu_);
  runners_.erase(key);
  finished_reapers_.push_back(reaper);
}

void WorkerDaemon::ReportStatus(const v1::ReportAttemptStatusRequest& request) {
  // Retried while the coordinator is unreachable (UNAVAILABLE, DEADLINE_EXCEEDED): how a runner
  // ended must not be lost to an outage. Backoff doubles with jitter up to 1 s (a restarted
  // coordinator hears of it within about a second); the retries end when the daemon stops.
  // Other errors (the attempt already ended) are final.
  Backoff backoff({.initial = absl::Milliseconds(100), .max = absl::Seconds(1)});
  while (true) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(Deadline(absl::Seconds(2)));
    v1::ReportAttemptStatusResponse response;
    grpc::Status status = stub_->ReportAttemptStatus(&context, request, &response);
    if (status.ok()) return;
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Final: the attempt ended meanwhile (cancelled, failed elsewhere, or this worker was
      // declared dead and the report is stale), or the report itself is wrong.
      Log(absl::StrCat("status report of job ", request.job_id(), " attempt ", request.attempt(),
                       " process ", request.process_index(), " refused: ",
                       status.error_message()));
      return;
    }
    if (stopped_.WaitForNotificationWithTimeout(*backoff.Next())) {
      Log(absl::StrCat("could not report the status of job ", request.job_id(),
                       ": the agent stopped while the coordinator was unreachable"));
      return;
    }
  }
}

}  // namespace substrax
