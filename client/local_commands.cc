// substraxctl local up|down|status: an embedded cluster of one coordinator and N worker daemons
// on this machine, recorded in a state directory (client/local_cluster.h).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/commands.h"
#include "client/command_util.h"
#include "client/local_cluster.h"
#include "client/local_credentials.h"
#include "rpc/transport_flags.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "substrax/v1/job_service.grpc.pb.h"

namespace substrax::ctl {
namespace {

constexpr char kCoordinatorName[] = "coordinator";

std::string WorkerName(int i) { return absl::StrCat("local-", i); }

std::string ReadAddress(const std::string& state_dir) {
  std::ifstream in(AddressFilePath(state_dir));
  std::string line;
  if (!std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

// The state dir as an absolute path, so the pid file, the logs and every message agree on it.
std::string StateDir(const CommandContext& ctx, const LocalFlags& flags) {
  std::error_code ec;
  std::filesystem::path path =
      std::filesystem::absolute(UserPath(flags.state_dir, ctx.working_directory), ec);
  return ec ? flags.state_dir : path.lexically_normal().string();
}

// " --state-dir DIR" as the user gave it, or "" for the default: for the commands we suggest.
std::string StateDirFlag(const LocalFlags& flags) {
  return flags.state_dir == kDefaultLocalStateDir ? ""
                                                   : absl::StrCat(" --state-dir ", flags.state_dir);
}

// ListWorkers with a short deadline, as the local cluster's admin: the liveness probe of `up`
// and the table of `status`.
grpc::Status ListWorkers(const std::string& state_dir, const std::string& address,
                         absl::Duration timeout, v1::ListWorkersResponse* response) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannel(address, LocalTransport(LocalTlsDir(state_dir), kLocalAdminIdentity));
  if (!channel.ok()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        std::string(channel.status().message()));
  }
  std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(*channel);
  grpc::ClientContext context;
  SetDeadline(&context, timeout);
  return stub->ListWorkers(&context, v1::ListWorkersRequest(), response);
}

// Polls `ready` with exponential backoff (20 ms up to 500 ms) until it returns true, `failed`
// returns a non-empty reason, or `deadline` passes. Returns "" on success, else why not.
template <typename Ready, typename Failed>
std::string PollUntil(absl::Time deadline, Ready ready, Failed failed) {
  absl::Duration delay = absl::Milliseconds(20);
  while (true) {
    if (ready()) return "";
    std::string reason = failed();
    if (!reason.empty()) return reason;
    if (absl::Now() >= deadline) return "timed out";
    absl::SleepFor(std::min(delay, std::max(absl::ZeroDuration(), deadline - absl::Now())));
    delay = std::min(delay * 2, absl::Milliseconds(500));
  }
}

// What happened to a process that should be running, or "" while it runs.
std::string ExitedReason(const LocalProcess& p, const std::string& state_dir) {
  if (IsAlive(p)) return "";
  return absl::StrCat(p.name, " (pid ", p.pid, ") exited; the end of its log ",
                      LogPath(state_dir, p.name), ":\n", TailFile(LogPath(state_dir, p.name), 15));
}

// Whether `local up` may start a cluster in `dir`: nothing when it may (a dead cluster recorded
// there is cleared away), else the exit code, having said why not.
std::optional<int> RefuseOrClearRecordedCluster(const CommandContext& ctx,
                                                const LocalFlags& flags, const std::string& dir) {
  absl::StatusOr<std::vector<LocalProcess>> existing = ReadPidFile(dir);
  if (existing.ok()) {
    const int alive = static_cast<int>(std::count_if(existing->begin(), existing->end(),
                                                     [](const auto& p) { return IsAlive(p); }));
    if (alive > 0) {
      const std::string address = ReadAddress(dir);
      *ctx.err << "substraxctl: a local cluster is already running in " << dir
               << (address.empty() ? "" : absl::StrCat(" (coordinator at ", address, ")")) << ", "
               << alive << " of " << existing->size()
               << " processes alive; `substraxctl local down" << StateDirFlag(flags)
               << "` stops it\n";
      return kExitError;
    }
    *ctx.err << "the cluster recorded in " << dir << " is gone; starting a new one\n";
  } else if (existing.status().code() != absl::StatusCode::kNotFound) {
    *ctx.err << "substraxctl: " << existing.status().message() << "\n";
    return kExitError;
  }
  RemoveClusterFiles(dir);
  return std::nullopt;
}

struct LocalBinaries {
  std::string coordinator;
  std::string agent;
  std::string job;
};

// The coordinator, agent and job binaries `local up` runs: the flags', else next to substraxctl
// or in bazel-bin.
absl::StatusOr<LocalBinaries> FindLocalBinaries(const LocalFlags& flags) {
  absl::StatusOr<std::string> coordinator = FindBinary(
      "substrax-coordinator", flags.coordinator_binary,
      SiblingCandidates(flags.self_dir, "coordinator", "substrax-coordinator"),
      "bazel build //coordinator:substrax-coordinator", "--coordinator-binary");
  if (!coordinator.ok()) return coordinator.status();
  absl::StatusOr<std::string> agent =
      FindBinary("substrax-agent", flags.agent_binary,
                 SiblingCandidates(flags.self_dir, "agent", "substrax-agent"),
                 "bazel build //agent:substrax-agent", "--agent-binary");
  if (!agent.ok()) return agent.status();
  absl::StatusOr<std::string> job =
      FindBinary("substrax-job", flags.job_binary,
                 SiblingCandidates(flags.self_dir, "worker", "substrax-job"),
                 "bazel build //worker:substrax-job", "--job-binary");
  if (!job.ok()) return job.status();
  return LocalBinaries{*coordinator, *agent, *job};
}

absl::Status CreateStateDirectories(const std::string& dir) {
  std::error_code ec;
  for (const std::string& sub : {std::string("logs"), std::string("coordinator"),
                                 std::string("workers")}) {
    std::filesystem::create_directories(absl::StrCat(dir, "/", sub), ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, "/", sub, ": ",
                                                    ec.message()));
  }
  return absl::OkStatus();
}

// The checkpoint roots every worker shares (one machine, one file system): the flags', else
// DIR/checkpoints (created); absolute.
absl::StatusOr<std::vector<std::string>> CheckpointRoots(const LocalFlags& flags,
                                                         const std::string& dir) {
  std::vector<std::string> roots;
  for (const std::string& root : flags.checkpoint_roots) {
    roots.push_back(std::filesystem::absolute(root).lexically_normal().string());
  }
  if (roots.empty()) {
    roots.push_back(
        std::filesystem::absolute(absl::StrCat(dir, "/checkpoints")).lexically_normal().string());
    std::error_code ec;
    std::filesystem::create_directories(roots.back(), ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create ", roots.back(), ": ",
                                                    ec.message()));
  }
  return roots;
}

// A local cluster as `local up` starts it. Each process is recorded in the pid file as soon as
// it runs (so `local down` can clean up even after a failed start); a failure stops it all
// again and explains why.
class LocalClusterStart {
 public:
  LocalClusterStart(const CommandContext& ctx, const LocalFlags& flags, std::string dir)
      : ctx_(ctx), flags_(flags), dir_(std::move(dir)), tls_dir_(LocalTlsDir(dir_)) {}

  const std::vector<LocalProcess>& processes() const { return processes_; }
  const std::string& tls_dir() const { return tls_dir_; }

  // Starts `argv` as process `name` with the mutual-TLS flags of `identity`, and records it.
  absl::Status Start(const std::string& name, std::vector<std::string> argv,
                     const std::string& identity) {
    for (std::string& a : TransportArguments(LocalTransport(tls_dir_, identity))) {
      argv.push_back(std::move(a));
    }
    absl::StatusOr<pid_t> pid = SpawnDaemon(argv, LogPath(dir_, name));
    if (!pid.ok()) return pid.status();
    processes_.push_back({name, *pid, argv[0]});
    return WritePidFile(dir_, processes_);
  }

  // Stops what runs, removes the cluster's files and says why; the exit code.
  int Fail(const std::string& why) {
    *ctx_.err << "substraxctl: the local cluster did not start: " << why << "\n";
    StopProcesses(processes_, flags_.stop_grace);
    RemoveClusterFiles(dir_);
    return kExitError;
  }

 private:
  const CommandContext& ctx_;
  const LocalFlags& flags_;
  const std::string dir_;
  const std::string tls_dir_;
  std::vector<LocalProcess> processes_;
};

// The command line of worker `name`: each poses as its own host, so meshes look like those of
// a multi-host cluster.
std::vector<std::string> WorkerArgv(const LocalFlags& flags, const LocalBinaries& binaries,
                                    const std::string& dir, const std::string& name,
                                    const std::string& address,
                                    const std::vector<std::string>& checkpoint_roots,
                                    const std::vector<std::string>& programs_dirs) {
  std::vector<std::string> argv = {binaries.agent, "--job-binary", binaries.job, "--coordinator",
                                   address,
                                   "--devices",
                                   flags.gpus ? std::string("cuda")
                                              : absl::StrCat("cpu:", flags.cpu_devices),
                                   "--worker-id", name, "--host", name, "--listen-host",
                                   "127.0.0.1", "--work-dir",
                                   absl::StrCat(dir, "/workers/", name)};
  for (const std::string& root : flags.data_roots) {
    // Relative to where `local up` runs, not to the daemon's directory.
    argv.push_back("--data-root");
    argv.push_back(std::filesystem::absolute(root).lexically_normal().string());
  }
  for (const std::string& root : checkpoint_roots) {
    argv.push_back("--checkpoint-root");
    argv.push_back(root);
  }
  for (const std::string& programs_dir : programs_dirs) {
    argv.push_back("--programs-dir");
    argv.push_back(programs_dir);
  }
  for (const std::string& env : flags.python_envs) {
    argv.push_back("--python-env");
    argv.push_back(env);
  }
  // A cluster run by and for the user who starts it: command jobs run as that user, who can
  // read what the agents can anyway (PrintClusterUp says so).
  argv.push_back("--allow-command-jobs");
  return argv;
}

// Waits until the coordinator answers ListWorkers and lists every worker of `processes` as
// ALIVE; "" then, else why not.
std::string WaitForWorkers(const LocalFlags& flags, const std::string& dir,
                           const std::string& address, const std::vector<LocalProcess>& processes,
                           absl::Time deadline) {
  int alive_workers = 0;
  grpc::Status last_error;
  std::string why = PollUntil(
      deadline,
      [&] {
        v1::ListWorkersResponse response;
        last_error = ListWorkers(dir, address, absl::Seconds(2), &response);
        if (!last_error.ok()) return false;
        alive_workers = 0;
        for (const v1::Worker& w : response.workers()) {
          if (w.state() != v1::WORKER_STATE_ALIVE) continue;
          for (const LocalProcess& p : processes) alive_workers += (p.name == w.worker_id());
        }
        return alive_workers == flags.workers;
      },
      [&] {
        for (const LocalProcess& p : processes) {
          std::string reason = ExitedReason(p, dir);
          if (!reason.empty()) return reason;
        }
        return std::string();
      });
  if (why.empty()) return "";
  if (!last_error.ok()) {
    absl::StrAppend(&why, " (the coordinator at ", address, " answered ListWorkers with ",
                    last_error.error_message(), ")");
  }
  return absl::StrCat("waiting for ", flags.workers, " workers to register (", alive_workers,
                      " alive): ", why, "; logs are in ", dir, "/logs");
}

// The export line on stdout, and on stderr what runs where and how to use and stop it.
void PrintClusterUp(const CommandContext& ctx, const LocalFlags& flags, const std::string& dir,
                    const std::string& address, const std::string& tls_dir,
                    const std::vector<std::string>& checkpoint_roots,
                    const std::vector<std::string>& programs_dirs) {
  const TransportOptions admin = LocalTransport(tls_dir, kLocalAdminIdentity);
  *ctx.out << "export " << kCoordinatorEnv << "=" << address << " " << kTlsCaEnv << "="
           << admin.ca_file << " " << kTlsCertEnv << "=" << admin.cert_file << " " << kTlsKeyEnv
           << "=" << admin.key_file << "\n";
  ctx.out->flush();
  *ctx.err << "local cluster up: coordinator at " << address << ", " << flags.workers
           << " workers with "
           << (flags.gpus ? std::string("this machine's GPUs")
                          : absl::StrCat(flags.cpu_devices, " CPU devices each"))
           << "; state and logs in "
           << dir << "; mutual TLS with the credentials in " << tls_dir << "\n"
           << "checkpoints: jobs may write them under " << absl::StrJoin(checkpoint_roots, ", ")
           << "\n"
           << "programs: "
           << (programs_dirs.empty()
                   ? std::string("none (give --programs-dir DIR to run program jobs)")
                   : absl::StrCat("program jobs may run programs from ",
                                  absl::StrJoin(programs_dirs, ", ")))
           << "\n"
           << "commands: command jobs (spec.command) run as your user, from the programs dirs"
           << (flags.python_envs.empty()
                   ? std::string(" (give --python-env NAME=DIR for python_env)")
                   : absl::StrCat(" and the Python environments ",
                                  absl::StrJoin(flags.python_envs, ", ")))
           << "\n"
           << "use it:   the export line on stdout sets the address and the admin's "
              "credentials (eval \"$(substraxctl local up)\"); from the directory holding "
           << kDefaultLocalStateDir << " no setting is needed\n"
           << "          substraxctl workers\n"
           << "stop it:  substraxctl local down" << StateDirFlag(flags) << "\n";
}

}  // namespace

int LocalUpCommand(const CommandContext& ctx, const LocalFlags& flags) {
  if (flags.gpus && flags.workers != 1) {
    *ctx.err << "substraxctl: --gpus needs --workers 1: each worker would offer the same GPUs\n";
    return kExitUsage;
  }
  const std::string dir = StateDir(ctx, flags);
  if (std::optional<int> refused = RefuseOrClearRecordedCluster(ctx, flags, dir)) return *refused;
  absl::StatusOr<LocalBinaries> binaries = FindLocalBinaries(flags);
  absl::Status prepared = binaries.ok() ? CreateStateDirectories(dir) : binaries.status();
  if (!prepared.ok()) {
    *ctx.err << "substraxctl: " << prepared.message() << "\n";
    return kExitError;
  }

  // Mutual TLS, as on a real cluster: a CA of the cluster's own and a certificate for each
  // process and for the admin this substraxctl acts as.
  LocalClusterStart cluster(ctx, flags, dir);
  std::vector<std::string> worker_names;
  for (int i = 0; i < flags.workers; ++i) worker_names.push_back(WorkerName(i));
  if (absl::Status s = IssueLocalCredentials(cluster.tls_dir(), worker_names); !s.ok()) {
    return cluster.Fail(absl::StrCat("cannot make its credentials: ", s.message()));
  }

  const absl::Time deadline = absl::Now() + flags.start_timeout;
  absl::Status started = cluster.Start(
      kCoordinatorName,
      {binaries->coordinator, "--listen", absl::StrCat("127.0.0.1:", flags.port), "--address-file",
       AddressFilePath(dir), "--metrics-listen", absl::StrCat("127.0.0.1:", flags.metrics_port),
       "--state-dir", absl::StrCat(dir, "/coordinator")},
      kLocalCoordinatorIdentity);
  if (!started.ok()) return cluster.Fail(std::string(started.message()));
  // The coordinator writes its address once it serves.
  std::string address;
  std::string why = PollUntil(
      deadline, [&] { return !(address = ReadAddress(dir)).empty(); },
      [&] { return ExitedReason(cluster.processes()[0], dir); });
  if (!why.empty()) {
    return cluster.Fail(absl::StrCat("waiting for the coordinator to write ",
                                     AddressFilePath(dir), ": ", why));
  }
  absl::StatusOr<std::vector<std::string>> checkpoint_roots = CheckpointRoots(flags, dir);
  if (!checkpoint_roots.ok()) return cluster.Fail(std::string(checkpoint_roots.status().message()));
  // Relative to where `local up` runs; every worker runs programs from the same directories.
  std::vector<std::string> programs_dirs;
  for (const std::string& programs_dir : flags.programs_dirs) {
    programs_dirs.push_back(std::filesystem::absolute(programs_dir).lexically_normal().string());
  }
  for (const std::string& name : worker_names) {
    std::error_code ec;
    std::filesystem::create_directories(absl::StrCat(dir, "/workers/", name), ec);
    started = cluster.Start(name,
                            WorkerArgv(flags, *binaries, dir, name, address,
                                       *checkpoint_roots, programs_dirs),
                            name);
    if (!started.ok()) return cluster.Fail(std::string(started.message()));
  }
  why = WaitForWorkers(flags, dir, address, cluster.processes(), deadline);
  if (!why.empty()) return cluster.Fail(why);
  PrintClusterUp(ctx, flags, dir, address, cluster.tls_dir(), *checkpoint_roots, programs_dirs);
  return kExitOk;
}

int LocalDownCommand(const CommandContext& ctx, const LocalFlags& flags) {
  const std::string dir = StateDir(ctx, flags);
  absl::StatusOr<std::vector<LocalProcess>> processes = ReadPidFile(dir);
  if (!processes.ok()) {
    if (processes.status().code() == absl::StatusCode::kNotFound) {
      *ctx.err << "no local cluster in " << dir << ": nothing to stop\n";
      return kExitOk;
    }
    *ctx.err << "substraxctl: " << processes.status().message() << "\n";
    return kExitError;
  }
  std::vector<std::string> running;
  for (const LocalProcess& p : *processes) {
    if (IsAlive(p)) running.push_back(absl::StrCat(p.name, " (pid ", p.pid, ")"));
  }
  const std::vector<std::string> killed = StopProcesses(*processes, flags.stop_grace);
  RemoveClusterFiles(dir);
  if (running.empty()) {
    *ctx.err << "the local cluster in " << dir << " was not running; removed its pid file\n";
  } else {
    *ctx.err << "stopped " << absl::StrJoin(running, ", ") << "\n";
  }
  if (!killed.empty()) {
    *ctx.err << "killed with SIGKILL after " << absl::FormatDuration(flags.stop_grace) << ": "
             << absl::StrJoin(killed, ", ") << "\n";
  }
  return kExitOk;
}

int LocalStatusCommand(const CommandContext& ctx, const LocalFlags& flags) {
  const std::string dir = StateDir(ctx, flags);
  absl::StatusOr<std::vector<LocalProcess>> processes = ReadPidFile(dir);
  if (!processes.ok()) {
    *ctx.err << "substraxctl: " << processes.status().message()
             << (processes.status().code() == absl::StatusCode::kNotFound
                     ? "; start one with `substraxctl local up`"
                     : "")
             << "\n";
    return kExitError;
  }
  const std::string address = ReadAddress(dir);
  bool all_alive = true;
  std::vector<bool> alive;
  for (const LocalProcess& p : *processes) {
    alive.push_back(IsAlive(p));
    all_alive = all_alive && alive.back();
  }
  v1::ListWorkersResponse workers;
  grpc::Status workers_status = grpc::Status(grpc::StatusCode::UNAVAILABLE, "no address");
  if (!address.empty()) workers_status = ListWorkers(dir, address, ctx.timeout, &workers);

  if (ctx.format != OutputFormat::kTable) {
    google::protobuf::Struct status;
    auto& fields = *status.mutable_fields();
    fields["state_dir"].set_string_value(dir);
    fields["address"].set_string_value(address);
    auto* list = fields["processes"].mutable_list_value();
    for (size_t i = 0; i < processes->size(); ++i) {
      auto& p = *list->add_values()->mutable_struct_value()->mutable_fields();
      p["name"].set_string_value((*processes)[i].name);
      p["pid"].set_number_value((*processes)[i].pid);
      p["alive"].set_bool_value(alive[i]);
      p["log"].set_string_value(LogPath(dir, (*processes)[i].name));
    }
    if (workers_status.ok()) {
      std::string json;
      (void)google::protobuf::util::MessageToJsonString(workers, &json);
      (void)google::protobuf::util::JsonStringToMessage(json, &fields["workers"]);
    }
    *ctx.out << FormatMessage(status, ctx.format);
    return all_alive ? kExitOk : kExitError;
  }
  *ctx.out << "state dir: " << dir << "\n"
           << "coordinator address: " << (address.empty() ? "-" : address) << "\n\n";
  Table table({"NAME", "PID", "STATE", "LOG"});
  for (size_t i = 0; i < processes->size(); ++i) {
    const LocalProcess& p = (*processes)[i];
    table.AddRow({p.name, absl::StrCat(p.pid),
                  alive[i] ? Cell("alive", kGreen) : Cell("dead", kRed), LogPath(dir, p.name)});
  }
  *ctx.out << table.Render(ctx.color);
  if (workers_status.ok()) {
    *ctx.out << "\n" << FormatWorkersTable(workers, FormatOptionsOf(ctx));
  } else {
    *ctx.err << "the coordinator does not answer"
             << (address.empty() ? "" : absl::StrCat(" at ", address)) << ": "
             << workers_status.error_message() << "\n";
  }
  return all_alive ? kExitOk : kExitError;
}

}  // namespace substrax::ctl
