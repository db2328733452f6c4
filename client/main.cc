// substraxctl: the command-line client of substrax (docs/cli.md). This file only parses the
// command line (CLI11) and the environment; the commands live in client/commands.h.
//
// Exit status: 0 ok; 1 the job failed or an error; 2 usage (bad flags, bad spec file);
// 3 the coordinator is unreachable.
#include <sys/ioctl.h>
#include <unistd.h>

#include <cstdlib>
#include <functional>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "base/mutex_mode.h"
#include "client/args.h"
#include "client/certs_command.h"
#include "client/commands.h"
#include "client/local_cluster.h"
#include "client/plot.h"
#include "rpc/transport_flags.h"

namespace {

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

// The terminal's size from stdout (TIOCGWINSZ), else $COLUMNS and $LINES; 0 where unknown.
int TerminalSize(unsigned short winsize::*field, const char* env) {
  struct winsize ws;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.*field > 0) return ws.*field;
  int size = 0;
  if (absl::SimpleAtoi(Env(env), &size) && size > 0) return size;
  return 0;
}

constexpr char kFooter[] =
    "Exit status: 0 ok; 1 the job failed or an error; 2 usage (bad flags, bad job spec); 3 the "
    "coordinator is unreachable.\n"
    "Coordinator address: --coordinator, else $SUBSTRAX_COORDINATOR, else the address in "
    "./.substrax-local/address (a `substraxctl local up` cluster), else 127.0.0.1:7070.\n"
    "Credentials: --tls-ca with --tls-cert/--tls-key or --token-file, else $SUBSTRAX_TLS_CA, "
    "$SUBSTRAX_TLS_CERT, $SUBSTRAX_TLS_KEY, $SUBSTRAX_TOKEN_FILE, else the admin credentials of "
    "./.substrax-local/tls (docs/security.md).\n"
    "Reference: docs/cli.md\n";

namespace ctl = substrax::ctl;
using ctl::CommandContext;

// What the command line says: every flag's value, and the command to run (set by the
// callback of the subcommand that was parsed).
struct CommandLine {
  std::function<int(const CommandContext&)> run;
  // Global flags.
  std::string coordinator;
  std::string timeout = "10s";
  std::string output = "table";
  substrax::TransportFlags transport;
  // Subcommands' flags and arguments.
  std::string job;
  std::string spec_file;
  bool watch = false;
  std::string resume_from;
  std::string states;
  ctl::LogsFlags logs_flags;
  std::string reason;
  std::string health_address;
  std::string health_service;
  std::string plan_workers;
  bool plan_env = false;
  ctl::MetricsFlags metrics_flags;
  ctl::LocalFlags local_flags;
  std::string start_timeout = "60s";
  ctl::CertsInitFlags certs_init;
  ctl::CertsIssueFlags certs_issue;
  std::string certs_token_name;
  std::string certs_token_role;
  std::string certs_file;
  std::vector<std::string> doctor_workers;
  std::string doctor_wait = "3m";
  std::string doctor_job;
};

void AddGlobalFlags(CLI::App& app, CommandLine& cl) {
  app.require_subcommand(1);
  app.fallthrough();  // global flags may also follow the subcommand
  app.footer(kFooter);
  app.add_option("--coordinator", cl.coordinator,
                 "Coordinator address host:port (default: $SUBSTRAX_COORDINATOR, a local "
                 "cluster's address, or 127.0.0.1:7070)");
  app.add_option("--timeout", cl.timeout, "Deadline of each RPC (e.g. 10s, 500ms); not `watch`")
      ->capture_default_str();
  substrax::AddTransportFlags(&app, &cl.transport, substrax::TransportRole::kClient);
}

void AddOutputFlag(CLI::App* sub, CommandLine& cl) {
  sub->add_option("-o,--output", cl.output, "Output format: table, json or yaml")
      ->check(CLI::IsMember({"table", "json", "yaml"}))
      ->capture_default_str();
}

void AddJobArgument(CLI::App* sub, CommandLine& cl) {
  sub->add_option("JOB", cl.job, "Job id (as `substraxctl list` shows it)")->required();
}

// A subcommand of `parent` that runs `command` with the context and takes JOB, and -o unless
// `output` is false.
CLI::App* AddJobCommand(CLI::App& parent, const std::string& name, const std::string& help,
                        CommandLine& cl, int (*command)(const CommandContext&, const std::string&),
                        bool output = true) {
  CLI::App* sub = parent.add_subcommand(name, help);
  AddJobArgument(sub, cl);
  if (output) AddOutputFlag(sub, cl);
  sub->callback([&cl, command] {
    cl.run = [&cl, command](const CommandContext& ctx) { return command(ctx, cl.job); };
  });
  return sub;
}

void AddSubmitCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* submit = app.add_subcommand(
      "submit", "Validate a job spec locally and submit it; prints the job id");
  submit->add_option("FILE", cl.spec_file, "TrainJob YAML (docs/job-spec.md)")->required();
  submit->add_flag("-w,--watch", cl.watch, "Then follow the job as `watch` does");
  submit->add_option("--resume-from", cl.resume_from,
                     "Start from a checkpoint: a job's checkpoint directory (its newest whole "
                     "checkpoint) or one step-... directory, on the workers, under their "
                     "--checkpoint-root; any mesh (sets spec.resume_from)")
      ->type_name("DIR");
  AddOutputFlag(submit, cl);
  submit->callback([&cl] {
    cl.run = [&cl](auto& ctx) {
      return ctl::SubmitCommand(ctx, cl.spec_file, cl.watch, cl.resume_from);
    };
  });
}

void AddListCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* list = app.add_subcommand("list", "List jobs, newest first");
  list->add_option("--state", cl.states,
                   "Only jobs in these states: pending,running,succeeded,failed,cancelled");
  AddOutputFlag(list, cl);
  list->callback([&cl] { cl.run = [&cl](auto& ctx) { return ctl::ListCommand(ctx, cl.states); }; });
}

void AddLogsCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* logs = app.add_subcommand(
      "logs", "Show the output (stdout and stderr) of a job's processes, each line prefixed by "
              "[p<process> <host>]; -f follows it until the job ends");
  ctl::LogsFlags& flags = cl.logs_flags;
  AddJobArgument(logs, cl);
  logs->add_option("--process", flags.process, "Only process N (0 is the first); default: all");
  logs->add_option("--attempt", flags.attempt,
                   "Attempt N (1 is the first); default: the latest");
  logs->add_option("--tail", flags.tail,
                   "Only the last N lines of each process (then, with -f, every new line)");
  logs->add_flag("-f,--follow", flags.follow,
                 "Keep printing new lines until the attempt has ended and its logs are complete");
  AddOutputFlag(logs, cl);
  logs->callback([&cl] {
    cl.run = [&cl](auto& ctx) { return ctl::LogsCommand(ctx, cl.job, cl.logs_flags); };
  });
}

void AddCancelCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a pending or running job");
  AddJobArgument(cancel, cl);
  cancel->add_option("--reason", cl.reason, "Recorded in the job's transition");
  AddOutputFlag(cancel, cl);
  cancel->callback([&cl] {
    cl.run = [&cl](auto& ctx) { return ctl::CancelCommand(ctx, cl.job, cl.reason); };
  });
}

void AddWorkersCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* workers = app.add_subcommand(
      "workers", "List worker daemons: host, lease state, devices, last heartbeat, jobs");
  AddOutputFlag(workers, cl);
  workers->callback([&cl] { cl.run = [](auto& ctx) { return ctl::WorkersCommand(ctx); }; });
}

void AddQueuesCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* queues = app.add_subcommand(
      "queues", "List the scheduling queues: quota, used, borrowed, pending jobs by priority");
  AddOutputFlag(queues, cl);
  queues->callback([&cl] { cl.run = [](auto& ctx) { return ctl::QueuesCommand(ctx); }; });
}

void AddDoctorCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* doctor = app.add_subcommand(
      "doctor", "Preflight the cluster (admins): on each worker, a job process checks the CPU, "
                "GPU, data, checkpoint and work directories, and its links to the others; with "
                "each agent's clock and certificate. A table of what to fix; exit 1 on problems");
  doctor->add_option("--worker", cl.doctor_workers,
                     "Test only this worker (repeat for more); default: every alive worker with "
                     "a free device");
  doctor->add_option("--wait", cl.doctor_wait,
                     "How long to wait for the doctor job (e.g. 3m); then it is cancelled and "
                     "what it reported is shown")
      ->capture_default_str();
  doctor->add_option("--job", cl.doctor_job, "Show an earlier doctor job's report instead");
  AddOutputFlag(doctor, cl);
  doctor->callback([&cl] {
    cl.run = [&cl](auto& ctx) {
      absl::StatusOr<absl::Duration> wait = ctl::ParseTimeout(cl.doctor_wait);
      if (!wait.ok()) {
        *ctx.err << "substraxctl: --wait: " << wait.status().message() << "\n";
        return ctl::kExitUsage;
      }
      return ctl::DoctorCommand(ctx, cl.doctor_workers, *wait, cl.doctor_job);
    };
  });
}

void AddHealthCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* health = app.add_subcommand(
      "health", "Ask a coordinator or worker daemon whether it serves (grpc.health.v1 Check)");
  health->add_option("--address", cl.health_address,
                     "host:port to ask (default: the coordinator); a daemon's --health-listen");
  health->add_option("--service", cl.health_service,
                     "Service to ask about; empty: the server; substrax.worker.ready: whether a "
                     "worker daemon has registered");
  health->callback([&cl] {
    cl.run = [&cl](auto& ctx) {
      return ctl::HealthCommand(ctx, cl.health_address, cl.health_service);
    };
  });
}

void AddPlanCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* plan = app.add_subcommand(
      "plan", "Dry-run a job spec: its mesh, parameter shards, per-device memory and the "
              "collectives of one step; needs no running job");
  plan->add_option("FILE", cl.spec_file, "TrainJob YAML (docs/job-spec.md)")->required();
  plan->add_option("--workers", cl.plan_workers,
                   "Plan for WORKERSxDEVICES CPU devices (2x2: hosts worker-0, worker-1 with 2 "
                   "devices each) instead of the coordinator's alive workers");
  plan->add_flag("--env", cl.plan_env,
                 "For a command job (spec.command): print the environment each process gets "
                 "(docs/command-jobs.md) instead of the plan");
  AddOutputFlag(plan, cl);
  plan->callback([&cl] {
    cl.run = [&cl](auto& ctx) {
      return ctl::PlanCommand(ctx, cl.spec_file, cl.plan_workers, cl.plan_env);
    };
  });
}

void AddMetricsCommand(CLI::App& app, CommandLine& cl) {
  CLI::App* metrics = app.add_subcommand(
      "metrics", "Query a job's metric series: one row per step, one column per series, or "
                 "a chart (--plot)");
  ctl::MetricsFlags& flags = cl.metrics_flags;
  AddJobArgument(metrics, cl);
  metrics->add_option("--name", flags.names,
                      "Metric names (repeat or comma-separate); default: all the job has")
      ->allow_extra_args(false);
  metrics->add_option("--reduce", flags.reduce,
                      "mean, sum, max, min or none (one series per device); default: the "
                      "reduction the job spec declares");
  metrics->add_option("--steps", flags.steps,
                      "Step range A:B (inclusive), A: (to the latest), :B or A; default: all");
  metrics->add_option("--group-by", flags.group_by, "device or host; default: none");
  metrics->add_option("--attempt", flags.attempt,
                      "Attempt N (1 is the first); default: the latest attempt with metrics");
  metrics->add_option("--tensorboard", flags.tensorboard,
                      "Write the series as a TensorBoard event file in DIR (created if missing) "
                      "instead of printing them")
      ->type_name("DIR");
  metrics->add_flag("--plot", flags.plot,
                    "Draw the series (default: loss) against the step as a chart sized to the "
                    "terminal, one line per series, instead of the table");
  metrics->add_option("--width", flags.width,
                      "Columns of the --plot chart (default: the terminal's, else $COLUMNS or 80)")
      ->type_name("N");
  metrics->add_option("--height", flags.height,
                      "Lines of the --plot chart (default: the terminal's less one, else $LINES "
                      "less one, or 20)")
      ->type_name("N");
  AddOutputFlag(metrics, cl);
  metrics->callback([&cl] {
    cl.run = [&cl](auto& ctx) { return ctl::MetricsCommand(ctx, cl.job, cl.metrics_flags); };
  });
}

void AddStateDirFlag(CLI::App* sub, CommandLine& cl) {
  sub->add_option("--state-dir", cl.local_flags.state_dir,
                  "Directory for the pid file, address, logs and state")
      ->capture_default_str();
}

void AddLocalUpCommand(CLI::App* local, CommandLine& cl) {
  ctl::LocalFlags& flags = cl.local_flags;
  CLI::App* up = local->add_subcommand(
      "up", "Start a coordinator and worker daemons in the background and wait until all are "
            "alive; prints `export SUBSTRAX_COORDINATOR=ADDR`");
  AddStateDirFlag(up, cl);
  up->add_option("--workers", flags.workers, "Worker daemons to start")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  CLI::Option* cpu = up->add_option("--cpu-devices", flags.cpu_devices,
                                     "CPU devices of each worker")
                          ->check(CLI::Range(1, 256))
                          ->capture_default_str();
  up->add_flag("--gpus", flags.gpus,
               "The worker offers this machine's GPUs (its agent's --devices cuda; needs a "
               "--config=cuda build and --workers 1) instead of CPU devices")
      ->excludes(cpu);
  up->add_option("--data-root", flags.data_roots,
                 "A directory every worker lets jobs read data files from (repeatable; each "
                 "worker's --data-root). None: synthetic data only")
      ->type_name("DIR");
  up->add_option("--checkpoint-root", flags.checkpoint_roots,
                 "A directory under which jobs may write and read checkpoints (repeatable; each "
                 "worker's --checkpoint-root). Default: <state-dir>/checkpoints")
      ->type_name("DIR");
  up->add_option("--programs-dir", flags.programs_dirs,
                 "A directory every worker runs program jobs' programs from (repeatable; each "
                 "worker's --programs-dir). None: no program jobs. Command jobs (spec.command) "
                 "may run from there too: the local cluster's agents run them as your user "
                 "(--allow-command-jobs)")
      ->type_name("DIR");
  up->add_option("--python-env", flags.python_envs,
                 "A Python environment command jobs may name in spec.command.python_env "
                 "(repeatable; each worker's --python-env): NAME=DIR, a venv or /usr")
      ->type_name("NAME=DIR");
  up->add_option("--port", flags.port, "Coordinator gRPC port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  up->add_option("--metrics-port", flags.metrics_port,
                 "Coordinator Prometheus port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  up->add_option("--coordinator-binary", flags.coordinator_binary,
                 "substrax-coordinator to run (default: next to substraxctl or in bazel-bin)");
  up->add_option("--agent-binary,--worker-binary", flags.agent_binary,
                 "substrax-agent to run on each worker (default: next to substraxctl or in "
                 "bazel-bin; --worker-binary is its name before the agent and the job binary were "
                 "split)");
  up->add_option("--job-binary", flags.job_binary,
                 "substrax-job the agents start for built-in jobs (default: next to substraxctl "
                 "or in bazel-bin)");
  up->add_option("--start-timeout", cl.start_timeout,
                 "How long to wait for the cluster to come up")
      ->capture_default_str();
  up->callback(
      [&cl] { cl.run = [&cl](auto& ctx) { return ctl::LocalUpCommand(ctx, cl.local_flags); }; });
}

void AddLocalCommands(CLI::App& app, CommandLine& cl) {
  CLI::App* local = app.add_subcommand(
      "local", "An embedded cluster on this machine: a coordinator and worker daemons");
  local->require_subcommand(1);
  AddLocalUpCommand(local, cl);
  CLI::App* down = local->add_subcommand(
      "down", "Stop the local cluster (SIGTERM, SIGKILL after 10s) and remove its pid file");
  AddStateDirFlag(down, cl);
  down->callback([&cl] {
    cl.run = [&cl](auto& ctx) { return ctl::LocalDownCommand(ctx, cl.local_flags); };
  });
  CLI::App* status = local->add_subcommand(
      "status", "Show the local cluster's processes and, if the coordinator answers, workers");
  AddStateDirFlag(status, cl);
  AddOutputFlag(status, cl);
  status->callback([&cl] {
    cl.run = [&cl](auto& ctx) { return ctl::LocalStatusCommand(ctx, cl.local_flags); };
  });
}

void AddCertsInitCommand(CLI::App* certs, CommandLine& cl) {
  ctl::CertsInitFlags& flags = cl.certs_init;
  CLI::App* init = certs->add_subcommand(
      "init", "Create a certificate authority: DIR/ca.crt (0644) and DIR/ca.key (0600)");
  init->add_option("--dir", flags.dir, "Directory for ca.crt and ca.key")->required();
  init->add_option("--days", flags.days, "Validity in days")
      ->check(CLI::Range(1, 36500))
      ->capture_default_str();
  init->add_option("--name", flags.name, "The CA's CN")->capture_default_str();
  init->add_flag("--force", flags.force, "Replace an existing CA (what it issued stops verifying)");
  init->callback(
      [&cl] { cl.run = [&cl](auto& ctx) { return ctl::CertsInitCommand(ctx, cl.certs_init); }; });
}

void AddCertsIssueCommand(CLI::App* certs, CommandLine& cl) {
  ctl::CertsIssueFlags& flags = cl.certs_issue;
  CLI::App* issue = certs->add_subcommand(
      "issue", "Issue a certificate signed by the CA: OUT/NAME.crt, OUT/NAME.key (0600), "
               "OUT/ca.crt");
  issue->add_option("--ca-dir", flags.ca_dir, "The CA's directory (certs init)")->required();
  issue->add_option("--out-dir", flags.out_dir, "Directory for the new files")->required();
  issue->add_option("--name", flags.name, "Identity (CN): a user name or worker id")
      ->required();
  issue->add_option("--role", flags.role, "admin, submitter, viewer, worker or server")
      ->required();
  issue->add_option("--dns", flags.dns, "DNS name of a server (repeatable)")
      ->allow_extra_args(false);
  issue->add_option("--ip", flags.ip, "IP address of a server (repeatable)")
      ->allow_extra_args(false);
  issue->add_option("--days", flags.days, "Validity in days")
      ->check(CLI::Range(1, 36500))
      ->capture_default_str();
  issue->add_flag("--force", flags.force, "Replace existing NAME.crt and NAME.key");
  issue->callback([&cl] {
    cl.run = [&cl](auto& ctx) { return ctl::CertsIssueCommand(ctx, cl.certs_issue); };
  });
}

// certs: the CA, certificates and tokens of mutual TLS (client/certs_command.h); no RPC.
void AddCertsCommands(CLI::App& app, CommandLine& cl) {
  CLI::App* certs = app.add_subcommand(
      "certs", "Create a CA, issue certificates, make bearer tokens, show a certificate");
  certs->require_subcommand(1);
  AddCertsInitCommand(certs, cl);
  AddCertsIssueCommand(certs, cl);
  CLI::App* token = certs->add_subcommand(
      "token", "Make a bearer token: the token on stdout, its --auth-config entry on stderr");
  token->add_option("--name", cl.certs_token_name, "Identity the token stands for")->required();
  token->add_option("--role", cl.certs_token_role, "admin, submitter or viewer")->required();
  token->callback([&cl] {
    cl.run = [&cl](auto& ctx) {
      return ctl::CertsTokenCommand(ctx, cl.certs_token_name, cl.certs_token_role);
    };
  });
  CLI::App* show = certs->add_subcommand(
      "show", "Show a certificate: subject, roles, names, issuer, validity, serial, expired?");
  show->add_option("FILE", cl.certs_file, "Certificate (PEM)")->required();
  show->callback(
      [&cl] { cl.run = [&cl](auto& ctx) { return ctl::CertsShowCommand(ctx, cl.certs_file); }; });
}

// Every subcommand, in the order `--help` lists them.
void AddCommands(CLI::App& app, CommandLine& cl) {
  AddSubmitCommand(app, cl);
  AddListCommand(app, cl);
  AddJobCommand(app, "get",
                "Show a job: state, attempt, mesh, progress, final metrics, error, transitions",
                cl, ctl::GetCommand);
  AddJobCommand(app, "diagnose",
                "Why a job is stuck or slow: which rank the others wait for and what it does, "
                "stragglers, each device's phase and each communicator's collective counts",
                cl, ctl::DiagnoseCommand);
  AddJobCommand(app, "checkpoints",
                "List a job's committed checkpoints, newest first: step, time, size, mesh, "
                "path (as its runners last reported them)",
                cl, ctl::CheckpointsCommand);
  AddJobCommand(app, "watch",
                "Follow a job until it ends (a progress bar on a terminal, lines otherwise); "
                "exit 0 if it succeeded, 1 if it failed or was cancelled",
                cl, ctl::WatchCommand);
  AddLogsCommand(app, cl);
  AddCancelCommand(app, cl);
  AddJobCommand(app, "delete",
                "Delete an ended job and its metrics (ended jobs also expire on their own)", cl,
                ctl::DeleteCommand, /*output=*/false);
  AddWorkersCommand(app, cl);
  AddQueuesCommand(app, cl);
  AddDoctorCommand(app, cl);
  AddHealthCommand(app, cl);
  AddJobCommand(app, "mesh",
                "Show a job's device mesh (grid with hosts) and its arrays' shard layouts", cl,
                ctl::MeshCommand);
  AddPlanCommand(app, cl);
  AddMetricsCommand(app, cl);
  AddLocalCommands(app, cl);
  AddCertsCommands(app, cl);
}

// Runs the parsed command with a context from the flags, the environment and the terminal;
// bad global flags are a usage error.
int RunCommand(CommandLine& cl) {
  CommandContext ctx;
  ctx.working_directory = Env("BUILD_WORKING_DIRECTORY");
  ctx.coordinator = ctl::ResolveCoordinator(
      cl.coordinator, Env(ctl::kCoordinatorEnv),
      ctl::UserPath(ctl::AddressFilePath(ctl::kDefaultLocalStateDir), ctx.working_directory));
  if (absl::Status s = substrax::FinishTransportFlags(&cl.transport); !s.ok()) {
    std::cerr << "substraxctl: " << s.message() << "\n";
    return ctl::kExitUsage;
  }
  ctx.transport = ctl::ResolveTransport(
      cl.transport.options, [](const char* name) { return Env(name); },
      ctl::UserPath(ctl::LocalTlsDir(ctl::kDefaultLocalStateDir), ctx.working_directory));
  absl::StatusOr<absl::Duration> parsed_timeout = ctl::ParseTimeout(cl.timeout);
  absl::StatusOr<absl::Duration> parsed_start = ctl::ParseTimeout(cl.start_timeout);
  for (const auto* d : {&parsed_timeout, &parsed_start}) {
    if (!d->ok()) {
      std::cerr << "substraxctl: " << d->status().message() << "\n";
      return ctl::kExitUsage;
    }
  }
  ctx.timeout = *parsed_timeout;
  cl.local_flags.start_timeout = *parsed_start;
  cl.local_flags.self_dir = ctl::SelfDirectory();
  ctx.format = *ctl::ParseOutputFormat(cl.output);
  ctx.terminal = isatty(STDOUT_FILENO) == 1;
  ctx.columns = TerminalSize(&winsize::ws_col, "COLUMNS");
  if (ctx.columns == 0) ctx.columns = 80;
  ctx.rows = TerminalSize(&winsize::ws_row, "LINES");
  ctx.color = ctx.terminal && Env("NO_COLOR").empty() && Env("TERM") != "dumb";
  ctx.unicode = ctx.terminal && ctl::LocaleIsUtf8(Env("LC_ALL"), Env("LC_CTYPE"), Env("LANG"));
  return cl.run(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  substrax::base::DisableMutexDeadlockDetectionInOptimizedBuilds();
  CLI::App app{"substraxctl: submit, watch and inspect substrax training jobs"};
  CommandLine cl;
  AddGlobalFlags(app, cl);
  AddCommands(app, cl);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? ctl::kExitOk : ctl::kExitUsage;
  }
  return RunCommand(cl);
}
