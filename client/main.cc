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

}  // namespace

int main(int argc, char** argv) {
  using substrax::ctl::CommandContext;
  namespace ctl = substrax::ctl;

  CLI::App app{"substraxctl: submit, watch and inspect substrax training jobs"};
  app.require_subcommand(1);
  app.fallthrough();  // global flags may also follow the subcommand
  app.footer(kFooter);
  std::string coordinator;
  std::string timeout = "10s";
  std::string output = "table";
  app.add_option("--coordinator", coordinator,
                 "Coordinator address host:port (default: $SUBSTRAX_COORDINATOR, a local "
                 "cluster's address, or 127.0.0.1:7070)");
  app.add_option("--timeout", timeout, "Deadline of each RPC (e.g. 10s, 500ms); not `watch`")
      ->capture_default_str();
  substrax::TransportFlags transport;
  substrax::AddTransportFlags(&app, &transport, substrax::TransportRole::kClient);
  auto add_output = [&output](CLI::App* sub) {
    sub->add_option("-o,--output", output, "Output format: table, json or yaml")
        ->check(CLI::IsMember({"table", "json", "yaml"}))
        ->capture_default_str();
  };

  std::function<int(const CommandContext&)> run;
  std::string job;
  auto add_job = [&job](CLI::App* sub) {
    sub->add_option("JOB", job, "Job id (as `substraxctl list` shows it)")->required();
  };

  CLI::App* submit = app.add_subcommand(
      "submit", "Validate a job spec locally and submit it; prints the job id");
  std::string spec_file;
  bool watch = false;
  submit->add_option("FILE", spec_file, "TrainJob YAML (docs/job-spec.md)")->required();
  submit->add_flag("-w,--watch", watch, "Then follow the job as `watch` does");
  std::string resume_from;
  submit->add_option("--resume-from", resume_from,
                     "Start from a checkpoint: a job's checkpoint directory (its newest whole "
                     "checkpoint) or one step-... directory, on the workers, under their "
                     "--checkpoint-root; any mesh (sets spec.resume_from)")
      ->type_name("DIR");
  add_output(submit);
  submit->callback([&] {
    run = [&](auto& ctx) { return ctl::SubmitCommand(ctx, spec_file, watch, resume_from); };
  });

  CLI::App* list = app.add_subcommand("list", "List jobs, newest first");
  std::string states;
  list->add_option("--state", states,
                   "Only jobs in these states: pending,running,succeeded,failed,cancelled");
  add_output(list);
  list->callback([&] { run = [&](auto& ctx) { return ctl::ListCommand(ctx, states); }; });

  CLI::App* get = app.add_subcommand(
      "get", "Show a job: state, attempt, mesh, progress, final metrics, error, transitions");
  add_job(get);
  add_output(get);
  get->callback([&] { run = [&](auto& ctx) { return ctl::GetCommand(ctx, job); }; });

  CLI::App* checkpoints = app.add_subcommand(
      "checkpoints", "List a job's committed checkpoints, newest first: step, time, size, mesh, "
                     "path (as its runners last reported them)");
  add_job(checkpoints);
  add_output(checkpoints);
  checkpoints->callback([&] { run = [&](auto& ctx) { return ctl::CheckpointsCommand(ctx, job); }; });

  CLI::App* watch_cmd = app.add_subcommand(
      "watch", "Follow a job until it ends (a progress bar on a terminal, lines otherwise); "
               "exit 0 if it succeeded, 1 if it failed or was cancelled");
  add_job(watch_cmd);
  add_output(watch_cmd);
  watch_cmd->callback([&] { run = [&](auto& ctx) { return ctl::WatchCommand(ctx, job); }; });

  CLI::App* logs = app.add_subcommand(
      "logs", "Show the output (stdout and stderr) of a job's processes, each line prefixed by "
              "[p<process> <host>]; -f follows it until the job ends");
  ctl::LogsFlags logs_flags;
  add_job(logs);
  logs->add_option("--process", logs_flags.process,
                   "Only process N (0 is the first); default: all");
  logs->add_option("--attempt", logs_flags.attempt,
                   "Attempt N (1 is the first); default: the latest");
  logs->add_option("--tail", logs_flags.tail,
                   "Only the last N lines of each process (then, with -f, every new line)");
  logs->add_flag("-f,--follow", logs_flags.follow,
                 "Keep printing new lines until the attempt has ended and its logs are complete");
  add_output(logs);
  logs->callback([&] { run = [&](auto& ctx) { return ctl::LogsCommand(ctx, job, logs_flags); }; });

  CLI::App* cancel = app.add_subcommand("cancel", "Cancel a pending or running job");
  std::string reason;
  add_job(cancel);
  cancel->add_option("--reason", reason, "Recorded in the job's transition");
  add_output(cancel);
  cancel->callback([&] { run = [&](auto& ctx) { return ctl::CancelCommand(ctx, job, reason); }; });

  CLI::App* remove = app.add_subcommand(
      "delete", "Delete an ended job and its metrics (ended jobs also expire on their own)");
  add_job(remove);
  remove->callback([&] { run = [&](auto& ctx) { return ctl::DeleteCommand(ctx, job); }; });

  CLI::App* workers = app.add_subcommand(
      "workers", "List worker daemons: host, lease state, devices, last heartbeat, jobs");
  add_output(workers);
  workers->callback([&] { run = [](auto& ctx) { return ctl::WorkersCommand(ctx); }; });

  CLI::App* health = app.add_subcommand(
      "health", "Ask a coordinator or worker daemon whether it serves (grpc.health.v1 Check)");
  std::string health_address, health_service;
  health->add_option("--address", health_address,
                     "host:port to ask (default: the coordinator); a daemon's --health-listen");
  health->add_option("--service", health_service,
                     "Service to ask about; empty: the server; substrax.worker.ready: whether a "
                     "worker daemon has registered");
  health->callback([&] {
    run = [&](auto& ctx) { return ctl::HealthCommand(ctx, health_address, health_service); };
  });

  CLI::App* mesh = app.add_subcommand(
      "mesh", "Show a job's device mesh (grid with hosts) and its arrays' shard layouts");
  add_job(mesh);
  add_output(mesh);
  mesh->callback([&] { run = [&](auto& ctx) { return ctl::MeshCommand(ctx, job); }; });

  CLI::App* plan = app.add_subcommand(
      "plan", "Dry-run a job spec: its mesh, parameter shards, per-device memory and the "
              "collectives of one step; needs no running job");
  std::string plan_workers;
  plan->add_option("FILE", spec_file, "TrainJob YAML (docs/job-spec.md)")->required();
  plan->add_option("--workers", plan_workers,
                   "Plan for WORKERSxDEVICES CPU devices (2x2: hosts worker-0, worker-1 with 2 "
                   "devices each) instead of the coordinator's alive workers");
  add_output(plan);
  plan->callback(
      [&] { run = [&](auto& ctx) { return ctl::PlanCommand(ctx, spec_file, plan_workers); }; });

  CLI::App* metrics = app.add_subcommand(
      "metrics", "Query a job's metric series: one row per step, one column per series, or "
                 "a chart (--plot)");
  ctl::MetricsFlags metrics_flags;
  add_job(metrics);
  metrics->add_option("--name", metrics_flags.names,
                      "Metric names (repeat or comma-separate); default: all the job has")
      ->allow_extra_args(false);
  metrics->add_option("--reduce", metrics_flags.reduce,
                      "mean, sum, max, min or none (one series per device); default: the "
                      "reduction the job spec declares");
  metrics->add_option("--steps", metrics_flags.steps,
                      "Step range A:B (inclusive), A: (to the latest), :B or A; default: all");
  metrics->add_option("--group-by", metrics_flags.group_by, "device or host; default: none");
  metrics->add_option("--attempt", metrics_flags.attempt,
                      "Attempt N (1 is the first); default: the latest attempt with metrics");
  metrics->add_option("--tensorboard", metrics_flags.tensorboard,
                      "Write the series as a TensorBoard event file in DIR (created if missing) "
                      "instead of printing them")
      ->type_name("DIR");
  metrics->add_flag("--plot", metrics_flags.plot,
                    "Draw the series (default: loss) against the step as a chart sized to the "
                    "terminal, one line per series, instead of the table");
  metrics->add_option("--width", metrics_flags.width,
                      "Columns of the --plot chart (default: the terminal's, else $COLUMNS or 80)")
      ->type_name("N");
  metrics->add_option("--height", metrics_flags.height,
                      "Lines of the --plot chart (default: the terminal's less one, else $LINES "
                      "less one, or 20)")
      ->type_name("N");
  add_output(metrics);
  metrics->callback(
      [&] { run = [&](auto& ctx) { return ctl::MetricsCommand(ctx, job, metrics_flags); }; });

  CLI::App* local = app.add_subcommand(
      "local", "An embedded cluster on this machine: a coordinator and worker daemons");
  local->require_subcommand(1);
  ctl::LocalFlags local_flags;
  std::string start_timeout = "60s";
  auto add_state_dir = [&local_flags](CLI::App* sub) {
    sub->add_option("--state-dir", local_flags.state_dir,
                    "Directory for the pid file, address, logs and state")
        ->capture_default_str();
  };
  CLI::App* up = local->add_subcommand(
      "up", "Start a coordinator and worker daemons in the background and wait until all are "
            "alive; prints `export SUBSTRAX_COORDINATOR=ADDR`");
  add_state_dir(up);
  up->add_option("--workers", local_flags.workers, "Worker daemons to start")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  up->add_option("--cpu-devices", local_flags.cpu_devices, "CPU devices of each worker")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  up->add_option("--data-root", local_flags.data_roots,
                 "A directory every worker lets jobs read data files from (repeatable; each "
                 "worker's --data-root). None: synthetic data only")
      ->type_name("DIR");
  up->add_option("--checkpoint-root", local_flags.checkpoint_roots,
                 "A directory under which jobs may write and read checkpoints (repeatable; each "
                 "worker's --checkpoint-root). Default: <state-dir>/checkpoints")
      ->type_name("DIR");
  up->add_option("--programs-dir", local_flags.programs_dirs,
                 "A directory every worker runs program jobs' programs from (repeatable; each "
                 "worker's --programs-dir). None: no program jobs")
      ->type_name("DIR");
  up->add_option("--port", local_flags.port, "Coordinator gRPC port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  up->add_option("--metrics-port", local_flags.metrics_port,
                 "Coordinator Prometheus port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  up->add_option("--coordinator-binary", local_flags.coordinator_binary,
                 "substrax-coordinator to run (default: next to substraxctl or in bazel-bin)");
  up->add_option("--worker-binary", local_flags.worker_binary,
                 "substrax-worker to run (default: next to substraxctl or in bazel-bin)");
  up->add_option("--start-timeout", start_timeout, "How long to wait for the cluster to come up")
      ->capture_default_str();
  up->callback([&] { run = [&](auto& ctx) { return ctl::LocalUpCommand(ctx, local_flags); }; });
  CLI::App* down = local->add_subcommand(
      "down", "Stop the local cluster (SIGTERM, SIGKILL after 10s) and remove its pid file");
  add_state_dir(down);
  down->callback([&] { run = [&](auto& ctx) { return ctl::LocalDownCommand(ctx, local_flags); }; });
  CLI::App* status = local->add_subcommand(
      "status", "Show the local cluster's processes and, if the coordinator answers, workers");
  add_state_dir(status);
  add_output(status);
  status->callback(
      [&] { run = [&](auto& ctx) { return ctl::LocalStatusCommand(ctx, local_flags); }; });

  // certs: the CA, certificates and tokens of mutual TLS (client/certs_command.h); no RPC.
  CLI::App* certs = app.add_subcommand(
      "certs", "Create a CA, issue certificates, make bearer tokens, show a certificate");
  certs->require_subcommand(1);
  ctl::CertsInitFlags certs_init;
  ctl::CertsIssueFlags certs_issue;
  std::string certs_token_name, certs_token_role, certs_file;
  CLI::App* cert_init = certs->add_subcommand(
      "init", "Create a certificate authority: DIR/ca.crt (0644) and DIR/ca.key (0600)");
  cert_init->add_option("--dir", certs_init.dir, "Directory for ca.crt and ca.key")->required();
  cert_init->add_option("--days", certs_init.days, "Validity in days")
      ->check(CLI::Range(1, 36500))
      ->capture_default_str();
  cert_init->add_option("--name", certs_init.name, "The CA's CN")->capture_default_str();
  cert_init->add_flag("--force", certs_init.force,
                      "Replace an existing CA (what it issued stops verifying)");
  cert_init->callback(
      [&] { run = [&](auto& ctx) { return ctl::CertsInitCommand(ctx, certs_init); }; });
  CLI::App* cert_issue = certs->add_subcommand(
      "issue", "Issue a certificate signed by the CA: OUT/NAME.crt, OUT/NAME.key (0600), "
               "OUT/ca.crt");
  cert_issue->add_option("--ca-dir", certs_issue.ca_dir, "The CA's directory (certs init)")
      ->required();
  cert_issue->add_option("--out-dir", certs_issue.out_dir, "Directory for the new files")
      ->required();
  cert_issue->add_option("--name", certs_issue.name, "Identity (CN): a user name or worker id")
      ->required();
  cert_issue->add_option("--role", certs_issue.role, "admin, submitter, viewer, worker or server")
      ->required();
  cert_issue->add_option("--dns", certs_issue.dns, "DNS name of a server (repeatable)")
      ->allow_extra_args(false);
  cert_issue->add_option("--ip", certs_issue.ip, "IP address of a server (repeatable)")
      ->allow_extra_args(false);
  cert_issue->add_option("--days", certs_issue.days, "Validity in days")
      ->check(CLI::Range(1, 36500))
      ->capture_default_str();
  cert_issue->add_flag("--force", certs_issue.force, "Replace existing NAME.crt and NAME.key");
  cert_issue->callback(
      [&] { run = [&](auto& ctx) { return ctl::CertsIssueCommand(ctx, certs_issue); }; });
  CLI::App* cert_token = certs->add_subcommand(
      "token", "Make a bearer token: the token on stdout, its --auth-config entry on stderr");
  cert_token->add_option("--name", certs_token_name, "Identity the token stands for")->required();
  cert_token->add_option("--role", certs_token_role, "admin, submitter or viewer")->required();
  cert_token->callback([&] {
    run = [&](auto& ctx) {
      return ctl::CertsTokenCommand(ctx, certs_token_name, certs_token_role);
    };
  });
  CLI::App* cert_show = certs->add_subcommand(
      "show", "Show a certificate: subject, roles, names, issuer, validity, serial, expired?");
  cert_show->add_option("FILE", certs_file, "Certificate (PEM)")->required();
  cert_show->callback(
      [&] { run = [&](auto& ctx) { return ctl::CertsShowCommand(ctx, certs_file); }; });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? ctl::kExitOk : ctl::kExitUsage;
  }

  CommandContext ctx;
  ctx.working_directory = Env("BUILD_WORKING_DIRECTORY");
  ctx.coordinator = ctl::ResolveCoordinator(
      coordinator, Env(ctl::kCoordinatorEnv),
      ctl::UserPath(ctl::AddressFilePath(ctl::kDefaultLocalStateDir), ctx.working_directory));
  if (absl::Status s = substrax::FinishTransportFlags(&transport); !s.ok()) {
    std::cerr << "substraxctl: " << s.message() << "\n";
    return ctl::kExitUsage;
  }
  ctx.transport = ctl::ResolveTransport(
      transport.options, [](const char* name) { return Env(name); },
      ctl::UserPath(ctl::LocalTlsDir(ctl::kDefaultLocalStateDir), ctx.working_directory));
  absl::StatusOr<absl::Duration> parsed_timeout = ctl::ParseTimeout(timeout);
  absl::StatusOr<absl::Duration> parsed_start = ctl::ParseTimeout(start_timeout);
  for (const auto* d : {&parsed_timeout, &parsed_start}) {
    if (!d->ok()) {
      std::cerr << "substraxctl: " << d->status().message() << "\n";
      return ctl::kExitUsage;
    }
  }
  ctx.timeout = *parsed_timeout;
  local_flags.start_timeout = *parsed_start;
  local_flags.self_dir = ctl::SelfDirectory();
  ctx.format = *ctl::ParseOutputFormat(output);
  ctx.terminal = isatty(STDOUT_FILENO) == 1;
  ctx.columns = TerminalSize(&winsize::ws_col, "COLUMNS");
  if (ctx.columns == 0) ctx.columns = 80;
  ctx.rows = TerminalSize(&winsize::ws_row, "LINES");
  ctx.color = ctx.terminal && Env("NO_COLOR").empty() && Env("TERM") != "dumb";
  ctx.unicode = ctx.terminal && ctl::LocaleIsUtf8(Env("LC_ALL"), Env("LC_CTYPE"), Env("LANG"));
  return run(ctx);
}
