// substrax-agent: the host program of substrax (docs/architecture.md). One per host: it
// registers the host's devices with the coordinator, keeps its lease, starts the processes of
// the job attempts it is assigned through the launch contract (contract/launch.h: the built-in
// trainer `substrax-job run`, or a program job's program), ships their logs and reports how they
// ended.
//
//   substrax-agent --coordinator HOST:PORT --devices cuda|cpu:N [--worker-id NAME]
//                  [--data-root DIR ...] [--job-binary PATH] ...
//       (--cpu-devices N is the same as --devices cpu:N; give one of them.)
//
// Exit status: 0 stopped (SIGTERM, SIGINT); 1 failed (the health port cannot be bound); 2 bad
// command line. A refused registration is retried, never fatal.
#include <pthread.h>
#include <signal.h>

#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "agent/command_launch.h"
#include "agent/daemon.h"
#include "agent/supervisor.h"
#include "agent/work_files.h"
#include "base/mutex_mode.h"
#include "rpc/transport_flags.h"

namespace substrax {
namespace {

// The command line, before its durations and sizes are parsed into the options.
struct AgentFlags {
  WorkerDaemonOptions options;
  TransportFlags transport;
  std::string collective_timeout = "30s";
  std::string program_init_timeout = "60s";
  std::vector<std::string> python_envs;
  std::string command_ports;
  std::string stop_grace = "10s";
  std::string log_retention = "7d";
  std::string log_budget = "1GiB";
};

// Where the agent finds the coordinator and what this host offers.
void AddHostFlags(CLI::App* app, AgentFlags* flags) {
  app->add_option("--coordinator", flags->options.coordinator,
                  "Coordinator address host:port (its worker-facing listener)")
      ->capture_default_str();
  AddTransportFlags(app, &flags->transport, TransportRole::kDaemon);
  CLI::Option* devices_flag = app->add_option(
      "--devices", flags->options.devices,
      "Devices to offer: 'cuda' (every visible GPU; needs a --config=cuda build) or 'cpu:N'");
  app->add_option("--cpu-devices", flags->options.cpu_devices,
                  "CPU devices to offer (the same as --devices cpu:N)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str()
      ->excludes(devices_flag);
  app->add_option(
      "--worker-id", flags->options.worker_id,
      "This worker's name: its certificate's CN (the default); with --insecure, default the "
      "host name");
  app->add_option("--host", flags->options.host, "Host name to report (default: gethostname)");
  app->add_option("--listen-host", flags->options.listen_host,
                  "Address peers reach this host's job processes on")
      ->capture_default_str();
  app->add_option("--work-dir", flags->options.work_dir,
                  "Directory for the launch, result and log files of job processes: created "
                  "0700; refused when a symbolic link, not a directory, or owned by another "
                  "user than this agent's or root (default: $XDG_RUNTIME_DIR/substrax-agent, "
                  "else /var/lib/substrax-agent for root, else /tmp/substrax-agent-UID)")
      ->type_name("DIR");
  app->add_option("--job-binary", flags->options.job_binary,
                  "The job binary started for built-in jobs as `substrax-job run` (default: "
                  "substrax-job in this agent's directory)")
      ->type_name("PATH");
}

// What jobs may touch on this host, and how long the agent waits for them.
void AddJobFlags(CLI::App* app, AgentFlags* flags) {
  app->add_option("--data-root", flags->options.data_roots,
                  "A directory (absolute) under which jobs may read data files; repeat for "
                  "several. Reported to the coordinator, which refuses jobs whose data lies "
                  "elsewhere. None: the worker runs only jobs with synthetic data")
      ->type_name("DIR");
  app->add_option("--checkpoint-root", flags->options.checkpoint_roots,
                  "A directory (absolute) under which jobs may write and read checkpoints "
                  "(a file system every worker of a job shares); repeat for several. Reported "
                  "to the coordinator, which refuses jobs whose checkpoint directory or "
                  "resume_from lies elsewhere. None: the worker runs only jobs without "
                  "checkpoints")
      ->type_name("DIR");
  app->add_option("--programs-dir", flags->options.programs_dirs,
                  "A directory (absolute) from which program jobs (spec.program) may run "
                  "programs; repeat for several. Reported to the coordinator, which refuses "
                  "jobs whose program lies elsewhere; checked again, symlinks resolved, before "
                  "each program starts. Without --job-user, programs run as this agent's user "
                  "and can read what it can (its TLS key included): allow only directories "
                  "whose contents you trust. None: the worker runs no program jobs")
      ->type_name("DIR");
  app->add_option("--job-user", flags->options.job_user,
                  "Run job processes as this user and its groups, not as the agent's (which "
                  "must then be root, or have CAP_SETUID, CAP_SETGID, CAP_CHOWN, CAP_KILL and "
                  "CAP_DAC_OVERRIDE). The work dir and its parents must be searchable by it; "
                  "it needs read access to the data roots and programs, write access to the "
                  "checkpoint roots (docs/operations.md)")
      ->type_name("USER");
  app->add_option("--job-env-pass", flags->options.job_env_pass,
                  "Names of variables of this agent's environment to give every job process "
                  "(LD_LIBRARY_PATH for a CUDA image); job processes otherwise start from a "
                  "fixed environment (PATH, HOME, USER, LOGNAME, LANG) plus their spec's env")
      ->delimiter(',')
      ->type_name("NAME,...");
  app->add_option("--python-env", flags->python_envs,
                  "A Python environment command jobs may name (spec.command.python_env): "
                  "NAME=DIR, a venv or an installation prefix; argv[0] of such a job runs as "
                  "DIR/bin/argv[0] (python, torchrun). Repeat for several; reported to the "
                  "coordinator")
      ->type_name("NAME=DIR");
  app->add_flag("--allow-command-jobs", flags->options.allow_command_jobs,
                "Run command jobs (spec.command) as this agent's own user. A command runs any "
                "code its argv names, and as the agent's user it can read what the agent can, "
                "its TLS key included: without this flag, the agent runs command jobs only "
                "with --job-user (docs/command-jobs.md)");
  app->add_option("--command-ports", flags->command_ports,
                  "The ports a command job's process 0 picks its rendezvous ports from "
                  "(torch's master, JAX's coordinator), for firewalls: FIRST-LAST; default: "
                  "any free port")
      ->type_name("FIRST-LAST");
  app->add_option("--program-init-timeout", flags->program_init_timeout,
                  "A program that has not called substrax::Init this long after it started is "
                  "stopped and its attempt fails as stalled")
      ->capture_default_str();
  app->add_option("--health-listen", flags->options.health_listen,
                  "Plaintext grpc.health.v1 address for Kubernetes probes (service "
                  "substrax.worker.ready: registered); empty: none");
  app->add_option("--collective-timeout", flags->collective_timeout,
                  "Time every collective of a job process must finish in")
      ->capture_default_str();
  app->add_option("--stop-grace", flags->stop_grace,
                  "Time a job process gets to exit after SIGTERM before SIGKILL (a preempted "
                  "one: the coordinator's grace when longer)")
      ->capture_default_str();

  app->add_option("--log-retention", flags->log_retention,
                  "Delete the work-dir files (launch, log, result) of ended attempts older "
                  "than this: 7d, 36h, 90m; 0: no age limit")
      ->capture_default_str();
  app->add_option("--log-budget", flags->log_budget,
                  "Then delete ended attempts' files, oldest first, until the work dir's "
                  "attempt files take at most this: 1GiB, 512MiB, bytes; 0: no size limit. "
                  "Files of running attempts are never deleted")
      ->capture_default_str();
}

// The options the flags say. Errors: a message for the user (exit status 2).
absl::Status FinishFlags(AgentFlags* flags) {
  if (absl::Status s = FinishTransportFlags(&flags->transport); !s.ok()) return s;
  WorkerDaemonOptions& options = flags->options;
  options.transport = flags->transport.options;
  for (auto [flag, text, out] :
       {std::tuple{"--collective-timeout", &flags->collective_timeout, &options.collective_timeout},
        std::tuple{"--stop-grace", &flags->stop_grace, &options.stop_grace},
        std::tuple{"--program-init-timeout", &flags->program_init_timeout,
                   &options.program_init_timeout}}) {
    if (!absl::ParseDuration(*text, out) || *out <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, ": '", *text, "' is not a positive duration such as 30s"));
    }
  }
  absl::StatusOr<absl::Duration> retention = ParseRetention(flags->log_retention);
  if (!retention.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-retention: ", retention.status().message()));
  }
  for (const std::string& flag : flags->python_envs) {
    absl::StatusOr<std::pair<std::string, std::string>> env = ParsePythonEnv(flag);
    if (!env.ok()) return env.status();
    if (!options.python_envs.emplace(env->first, env->second).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("--python-env ", env->first, " is given twice; give each name once"));
    }
  }
  if (!flags->command_ports.empty()) {
    const std::pair<std::string, std::string> range =
        absl::StrSplit(flags->command_ports, absl::MaxSplits('-', 1));
    if (!absl::SimpleAtoi(range.first, &options.command_port_first) ||
        !absl::SimpleAtoi(range.second, &options.command_port_last)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--command-ports '", flags->command_ports, "': give FIRST-LAST, such as 29500-29599"));
    }
  }
  absl::StatusOr<int64_t> budget = ParseByteSize(flags->log_budget);
  if (!budget.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--log-budget: ", budget.status().message()));
  }
  options.log_retention.max_age = *retention;
  options.log_retention.max_bytes = *budget;
  return absl::OkStatus();
}

int RunAgent(WorkerDaemonOptions options) {
  // SIGTERM and SIGINT stop the agent and its job processes cleanly: they are taken by a thread
  // that waits for them (blocked everywhere else before any thread starts).
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  absl::StatusOr<std::unique_ptr<WorkerDaemon>> daemon = WorkerDaemon::Create(options);
  if (!daemon.ok()) {
    std::cerr << "substrax-agent: " << daemon.status().message() << "\n";
    return 2;
  }
  std::thread signal_waiter([&signals, d = daemon->get()] {
    int signal = 0;
    sigwait(&signals, &signal);
    std::cerr << "substrax-agent: " << strsignal(signal) << ": stopping\n";
    d->Stop();
  });
  signal_waiter.detach();
  absl::Status status = (*daemon)->Run();
  if (!status.ok() && !absl::IsCancelled(status)) {
    std::cerr << "substrax-agent: " << status.message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace substrax

int main(int argc, char** argv) {
  // A job process's supervisor (supervisor.h): the agent executes itself in this mode.
  if (argc >= 2 && std::strcmp(argv[1], substrax::kSupervisorMode) == 0) {
    return substrax::SupervisorMain(argc, argv);
  }
  substrax::base::DisableMutexDeadlockDetectionInOptimizedBuilds();
  // A write to a socket whose peer is gone (a gRPC channel) must fail with EPIPE instead of
  // killing the agent with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  CLI::App app{
      "substrax agent: registers this host's devices with the coordinator and runs the "
      "processes of the jobs it assigns"};
  substrax::AgentFlags flags;
  substrax::AddHostFlags(&app, &flags);
  substrax::AddJobFlags(&app, &flags);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (absl::Status s = substrax::FinishFlags(&flags); !s.ok()) {
    std::cerr << "substrax-agent: " << s.message() << "\n";
    return 2;
  }
  if (flags.options.transport.insecure) {
    std::cerr << substrax::InsecureWarning("substrax-agent") << "\n";
  }
  return substrax::RunAgent(flags.options);
}
