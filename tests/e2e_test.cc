// End to end with the real binaries: a coordinator, two worker daemons with two CPU devices
// each, and substraxctl. A data-parallel job trains to SUCCEEDED and its metrics can be queried;
// a job's logs are followed while it runs and read again after its runners exited;
// a worker killed with SIGKILL mid-job fails the job with a message naming it within 15 s; a
// coordinator restarted after a job finished still answers get and metrics with the same data.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "substrax/v1/job.pb.h"
#include "tests/proc.h"
#include "tests/credentials.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: NAME}
spec:
  model: {type: mlp, hidden_sizes: [32, 32], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 4096, num_test_examples: 512,
                num_features: 16, noise: 0.3}
  optimizer: {type: adam, learning_rate: 0.01}
  mesh: {data_parallel_size: 4}
  batch: {global_batch_size: 64}
  steps: STEPS
  report_every_steps: 10
)";

// A port nothing listens on now (bound and released; the daemon binds it next).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class LocalCluster {
 public:
  // Mutual TLS, as users run it: the coordinator's certificate, one per worker, an admin's.
  explicit LocalCluster(const std::string& name)
      : dir_(TempDir(name)), pki_(dir_ + "/tls"), admin_(pki_.Issue("admin", "admin")) {
    StartCoordinator();
    for (int w = 0; w < 2; ++w) StartWorker(w);
  }
  // The daemons stop their runners on SIGTERM; then nothing may be left that names the
  // cluster's directory (a runner outliving a killed daemon would).
  ~LocalCluster() {
    for (auto& worker : workers_) {
      if (worker && worker->Running()) {
        worker->Signal(SIGTERM);
        worker->Wait(absl::Seconds(30));
      }
    }
    if (coordinator_ && coordinator_->Running()) {
      coordinator_->Signal(SIGTERM);
      coordinator_->Wait(absl::Seconds(30));
    }
    EXPECT_TRUE(PollUntil([&] { return ProcessesMentioning(dir_).empty(); }, absl::Seconds(10)))
        << "processes outlived the test under " << dir_;
  }

  void StartCoordinator() {
    std::remove((dir_ + "/address").c_str());
    std::vector<std::string> argv = {Runfile("coordinator/substrax-coordinator"), "--listen",
                                     "127.0.0.1:0", "--metrics-listen", "", "--state-dir",
                                     dir_ + "/state", "--address-file", dir_ + "/address"};
    for (std::string& flag : pki_.CoordinatorFlags()) argv.push_back(std::move(flag));
    coordinator_ = std::make_unique<Process>(argv, dir_ + "/coordinator.log");
    EXPECT_TRUE(PollUntil(
        [&] {
          std::ifstream in(dir_ + "/address");
          return static_cast<bool>(std::getline(in, address_)) && !address_.empty();
        },
        absl::Seconds(30)))
        << coordinator_->Log();
  }

  void StartWorker(int w) {
    health_ports_[w] = FreePort();
    const std::string id = absl::StrCat("w-", w + 1);
    std::vector<std::string> argv = {Runfile("agent/substrax-agent"), "--coordinator",
                                     address_, "--cpu-devices", "2", "--worker-id", id, "--host",
                                     std::string("host-") + char('a' + w), "--work-dir",
                                     absl::StrCat(dir_, "/worker-", w + 1),
                                     "--collective-timeout", "20s", "--health-listen",
                                     absl::StrCat("127.0.0.1:", health_ports_[w]),
                                     // Fashion-MNIST (tools/install_deps.sh) is read from here.
                                     "--data-root", "/usr/share/datasets"};
    for (std::string& flag : TestPki::Flags(pki_.Issue(id, "worker"))) {
      argv.push_back(std::move(flag));
    }
    workers_[w] = std::make_unique<Process>(argv, absl::StrCat(dir_, "/worker-", w + 1, ".log"));
  }

  // substraxctl with `args`, as the admin (or as `as`).
  std::vector<std::string> CtlArgv(std::vector<std::string> args,
                                   const std::optional<TransportOptions>& as = std::nullopt) {
    args.insert(args.begin(), {Runfile("client/substraxctl"), "--coordinator", address_});
    const std::vector<std::string> credentials = TestPki::Flags(as.value_or(admin_));
    args.insert(args.begin() + 3, credentials.begin(), credentials.end());
    return args;
  }
  CommandResult Ctl(std::vector<std::string> args, absl::Duration timeout = absl::Seconds(60),
                    const std::optional<TransportOptions>& as = std::nullopt) {
    return Run(CtlArgv(std::move(args), as), timeout);
  }
  // Credentials of another caller.
  TransportOptions Issue(const std::string& name, const std::string& role) {
    return pki_.Issue(name, role);
  }

  std::string WriteJob(const std::string& name, int steps) {
    const std::string path = absl::StrCat(dir_, "/", name, ".yaml");
    std::ofstream(path) << absl::StrReplaceAll(kJob, {{"NAME", name},
                                                      {"STEPS", std::to_string(steps)}});
    return path;
  }

  // The job as `substraxctl get -o json` prints it.
  std::optional<v1::Job> Get(const std::string& id) {
    CommandResult r = Ctl({"get", id, "-o", "json"});
    if (r.exit_code != 0) return std::nullopt;
    v1::Job job;
    google::protobuf::util::JsonParseOptions options;
    options.ignore_unknown_fields = true;
    if (!google::protobuf::util::JsonStringToMessage(r.out, &job, options).ok()) return std::nullopt;
    return job;
  }

  bool WorkersAlive(int n) {
    CommandResult r = Ctl({"workers", "-o", "json"}, absl::Seconds(10));
    size_t alive = 0, pos = 0;
    while ((pos = r.out.find("WORKER_STATE_ALIVE", pos)) != std::string::npos) ++alive, ++pos;
    return r.exit_code == 0 && static_cast<int>(alive) >= n;
  }

  std::string Logs() {
    std::string all = "--- coordinator ---\n" + coordinator_->Log();
    for (int w = 0; w < 2; ++w) {
      if (workers_[w]) absl::StrAppend(&all, "\n--- worker ", w + 1, " ---\n", workers_[w]->Log());
    }
    return all;
  }

  // grpc.health.v1 of worker w's --health-listen: "SERVING" / "NOT_SERVING".
  std::string WorkerHealth(int w, const std::string& service) {
    CommandResult r = Ctl({"health", "--address", absl::StrCat("127.0.0.1:", health_ports_[w]),
                           "--service", service},
                          absl::Seconds(10));
    return std::string(absl::StripAsciiWhitespace(r.out));
  }

  Process& coordinator() { return *coordinator_; }
  Process& worker(int w) { return *workers_[w]; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  TestPki pki_;
  TransportOptions admin_;
  std::string address_;
  std::unique_ptr<Process> coordinator_;
  std::unique_ptr<Process> workers_[2];
  int health_ports_[2] = {0, 0};
};

std::string SubmittedId(const CommandResult& r) {
  return std::string(absl::StripAsciiWhitespace(r.out.substr(0, r.out.find('\n'))));
}

TEST(EndToEndTest, TrainsToSucceededAndServesMetricsAcrossARestart) {
  LocalCluster cluster("e2e_success");
  ASSERT_TRUE(PollUntil([&] { return cluster.WorkersAlive(2); }, absl::Seconds(30)))
      << cluster.Logs();
  // The daemons' probes: alive, and ready once registered.
  EXPECT_TRUE(PollUntil([&] { return cluster.WorkerHealth(0, "substrax.worker.ready") == "SERVING"; },
                        absl::Seconds(10)));
  EXPECT_EQ(cluster.WorkerHealth(1, ""), "SERVING");
  CommandResult submit = cluster.Ctl({"submit", cluster.WriteJob("mlp", 60)});
  ASSERT_EQ(submit.exit_code, 0) << submit.err << cluster.Logs();
  const std::string id = SubmittedId(submit);
  ASSERT_FALSE(id.empty());
  CommandResult watch = cluster.Ctl({"watch", id}, absl::Seconds(120));
  ASSERT_EQ(watch.exit_code, 0) << watch.out << watch.err << cluster.Logs();
  EXPECT_THAT(watch.out + watch.err, HasSubstr("test_accuracy="));

  std::optional<v1::Job> job = cluster.Get(id);
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job->mesh().devices_size(), 4);
  EXPECT_GT(job->progress().final_metrics().at("test_accuracy"), 0.5);
  // The mesh spans both workers' devices.
  EXPECT_NE(job->mesh().devices(0).host(), job->mesh().devices(3).host());

  CommandResult metrics = cluster.Ctl({"metrics", id, "--name", "loss", "-o", "json"});
  ASSERT_EQ(metrics.exit_code, 0) << metrics.err;
  EXPECT_THAT(metrics.out, HasSubstr("\"step\""));
  CommandResult by_host =
      cluster.Ctl({"metrics", id, "--name", "loss", "--group-by", "host", "-o", "json"});
  ASSERT_EQ(by_host.exit_code, 0) << by_host.err;
  EXPECT_THAT(by_host.out, HasSubstr("host-a"));
  EXPECT_THAT(by_host.out, HasSubstr("host-b"));
  // The same series as a chart: one line per host, at the asked size, without colour (stdout
  // is a pipe); a chart cannot be JSON.
  CommandResult plot = cluster.Ctl(
      {"metrics", id, "--plot", "--group-by", "host", "--width", "60", "--height", "15"});
  ASSERT_EQ(plot.exit_code, 0) << plot.err;
  EXPECT_EQ(std::count(plot.out.begin(), plot.out.end(), '\n'), 15) << plot.out;
  EXPECT_THAT(plot.out, HasSubstr("* loss/host-a   o loss/host-b\n")) << plot.out;
  EXPECT_THAT(plot.out, HasSubstr("+----")) << plot.out;
  EXPECT_EQ(plot.out.find('\x1b'), std::string::npos) << plot.out;
  CommandResult plot_json = cluster.Ctl({"metrics", id, "--plot", "-o", "json"});
  EXPECT_EQ(plot_json.exit_code, 2);
  EXPECT_THAT(plot_json.err, HasSubstr("--plot draws a chart for people"));

  // Restart the coordinator: what it acknowledged is still there, byte for byte.
  const CommandResult get_before = cluster.Ctl({"get", id, "-o", "json"});
  cluster.coordinator().Signal(SIGTERM);
  ASSERT_EQ(cluster.coordinator().Wait(absl::Seconds(20)), 0) << cluster.Logs();
  cluster.StartCoordinator();
  const CommandResult get_after = cluster.Ctl({"get", id, "-o", "json"});
  ASSERT_EQ(get_after.exit_code, 0) << get_after.err << cluster.Logs();
  std::optional<v1::Job> again = cluster.Get(id);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(again->transitions_size(), job->transitions_size());
  EXPECT_EQ(again->progress().final_metrics().at("test_accuracy"),
            job->progress().final_metrics().at("test_accuracy"));
  const CommandResult metrics_after = cluster.Ctl({"metrics", id, "--name", "loss", "-o", "json"});
  EXPECT_EQ(metrics_after.out, metrics.out);
}

// The lines of `output` that start with `prefix` ("[p0 " for process 0's).
std::vector<std::string> LinesOf(const std::string& output, const std::string& prefix) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(output, '\n')) {
    if (absl::StartsWith(line, prefix)) lines.emplace_back(line);
  }
  return lines;
}

// Process 0's progress lines ("[p0 host-b] step 20/100000000").
std::vector<std::string> StepLines(const std::string& output) {
  std::vector<std::string> steps;
  for (const std::string& line : LinesOf(output, "[p0 host-")) {
    if (line.find("] step ") != std::string::npos) steps.push_back(line);
  }
  return steps;
}

// `substraxctl logs`: followed while the job runs (lines arrive before it ends), read again
// once its runners have exited (every line still there, from the coordinator alone), filtered
// by process and tail, and refused to a caller without a reader's role.
TEST(EndToEndTest, LogsFollowARunningJobAndOutliveItsRunners) {
  LocalCluster cluster("e2e_logs");
  ASSERT_TRUE(PollUntil([&] { return cluster.WorkersAlive(2); }, absl::Seconds(30)))
      << cluster.Logs();
  // Far more steps than the test waits for: it is cancelled once its lines were seen.
  CommandResult submit = cluster.Ctl({"submit", cluster.WriteJob("chatty", 100000000)});
  ASSERT_EQ(submit.exit_code, 0) << submit.err << cluster.Logs();
  const std::string id = SubmittedId(submit);
  Process follow(cluster.CtlArgv({"logs", id, "-f"}), cluster.dir() + "/follow.log");
  // Process 0 prints "step N/T" every report_every_steps (10) steps on stderr; every process
  // prints its collectives at start. Which worker (host) runs which process is the scheduler's
  // choice.
  ASSERT_TRUE(PollUntil(
      [&] {
        const std::string out = follow.Log();
        return StepLines(out).size() >= 3 && !LinesOf(out, "[p1 host-").empty();
      },
      absl::Seconds(120)))
      << follow.Log() << cluster.Logs();
  // The lines came while the job runs, and the stream is still open.
  std::optional<v1::Job> during = cluster.Get(id);
  ASSERT_TRUE(during.has_value());
  EXPECT_EQ(during->state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(follow.Running());

  ASSERT_EQ(cluster.Ctl({"cancel", id}).exit_code, 0);
  // The follow ends by itself once both runners have exited and their logs reached their end.
  std::optional<int> followed = follow.Wait(absl::Seconds(60));
  ASSERT_TRUE(followed.has_value()) << follow.Log() << cluster.Logs();
  EXPECT_EQ(*followed, 0) << follow.Log();
  const std::string streamed = follow.Log();
  EXPECT_THAT(streamed, Not(HasSubstr("incomplete"))) << streamed;
  std::optional<v1::Job> after = cluster.Get(id);
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->state(), v1::JOB_STATE_CANCELLED);

  // The finished attempt's logs, read after its runners exited: every line that was followed.
  CommandResult all = cluster.Ctl({"logs", id});
  ASSERT_EQ(all.exit_code, 0) << all.err;
  const std::vector<std::string> p0 = LinesOf(all.out, "[p0 host-");
  const std::vector<std::string> p1 = LinesOf(all.out, "[p1 host-");
  ASSERT_GE(p0.size(), 3u) << all.out;
  ASSERT_FALSE(p1.empty()) << all.out;
  EXPECT_EQ(p0, LinesOf(streamed, "[p0 host-"));
  EXPECT_EQ(p1, LinesOf(streamed, "[p1 host-"));
  // The two processes ran on the two hosts.
  EXPECT_NE(p0[0].substr(4, 7), p1[0].substr(4, 7));
  EXPECT_EQ(p0.size() + p1.size(), LinesOf(all.out, "[p").size());

  CommandResult tail = cluster.Ctl({"logs", id, "--process", "0", "--tail", "3"});
  ASSERT_EQ(tail.exit_code, 0) << tail.err;
  EXPECT_EQ(LinesOf(tail.out, "[p"), std::vector<std::string>(p0.end() - 3, p0.end()));
  CommandResult one = cluster.Ctl({"logs", id, "--process", "1", "--attempt", "1"});
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(LinesOf(one.out, "[p"), p1);
  CommandResult json = cluster.Ctl({"logs", id, "--tail", "1", "-o", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_EQ(LinesOf(json.out, "{").size(), 2u) << json.out;  // one object per line
  EXPECT_THAT(json.out, HasSubstr("\"host\":\"host-"));
  EXPECT_THAT(json.out, HasSubstr("\"process_index\":1"));

  CommandResult missing = cluster.Ctl({"logs", id, "--attempt", "2"});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.err, HasSubstr("NOT_FOUND"));
  // A worker's certificate is no reader's: refused (tests/security covers the unauthenticated).
  CommandResult as_worker =
      cluster.Ctl({"logs", id}, absl::Seconds(30), cluster.Issue("w-9", "worker"));
  EXPECT_NE(as_worker.exit_code, 0);
  EXPECT_THAT(as_worker.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(as_worker.out, Not(HasSubstr("[p0")));
}

TEST(EndToEndTest, KilledWorkerFailsTheJobNamingIt) {
  LocalCluster cluster("e2e_kill");
  ASSERT_TRUE(PollUntil([&] { return cluster.WorkersAlive(2); }, absl::Seconds(30)))
      << cluster.Logs();
  CommandResult submit = cluster.Ctl({"submit", cluster.WriteJob("long", 1000000)});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  const std::string id = SubmittedId(submit);
  // Wait until it trains (a first report has arrived).
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        return job.has_value() && job->state() == v1::JOB_STATE_RUNNING &&
               job->progress().step() > 0;
      },
      absl::Seconds(60)))
      << cluster.Logs();
  const absl::Time killed = absl::Now();
  cluster.worker(1).Signal(SIGKILL);
  std::optional<v1::Job> job;
  ASSERT_TRUE(PollUntil(
      [&] {
        job = cluster.Get(id);
        return job.has_value() && job->state() == v1::JOB_STATE_FAILED;
      },
      absl::Seconds(15)))
      << "job not FAILED within 15 s of the kill\n"
      << cluster.Logs();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(15));
  EXPECT_THAT(job->error(), HasSubstr("w-2")) << job->error();
  // Nothing hangs: the surviving worker is free again and the daemons are alive.
  EXPECT_TRUE(cluster.worker(0).Running());
  EXPECT_TRUE(cluster.coordinator().Running());
}

// The model-parallel issue's end-to-end check: a hybrid (data=2, model=2) Fashion-MNIST job on
// two worker daemons reaches test_accuracy >= 0.87, each model-axis group on one host.
TEST(EndToEndTest, HybridFashionMnistReachesTheBaseline) {
  LocalCluster cluster("e2e_hybrid");
  ASSERT_TRUE(PollUntil([&] { return cluster.WorkersAlive(2); }, absl::Seconds(30)))
      << cluster.Logs();
  CommandResult submit =
      cluster.Ctl({"submit", Runfile("examples/fashion_mnist_mlp_hybrid.yaml")});
  ASSERT_EQ(submit.exit_code, 0) << submit.err << cluster.Logs();
  const std::string id = SubmittedId(submit);
  CommandResult watch = cluster.Ctl({"watch", id}, absl::Minutes(15));
  ASSERT_EQ(watch.exit_code, 0) << watch.out << watch.err << cluster.Logs();
  std::optional<v1::Job> job = cluster.Get(id);
  ASSERT_TRUE(job.has_value());
  ASSERT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error();
  EXPECT_GE(job->progress().final_metrics().at("test_accuracy"), 0.87);
  // Row-major (data, model): devices 2k and 2k+1 form model-axis group k; each on one host,
  // and the two groups on different hosts.
  ASSERT_EQ(job->mesh().shape_size(), 2);
  ASSERT_EQ(job->mesh().devices_size(), 4);
  EXPECT_EQ(job->mesh().devices(0).host(), job->mesh().devices(1).host());
  EXPECT_EQ(job->mesh().devices(2).host(), job->mesh().devices(3).host());
  EXPECT_NE(job->mesh().devices(0).host(), job->mesh().devices(2).host());
  // Per-host metrics: each host reported for its two devices.
  CommandResult by_host = cluster.Ctl({"metrics", id, "--name", "loss", "--group-by", "host",
                                       "-o", "json"});
  ASSERT_EQ(by_host.exit_code, 0) << by_host.err;
  EXPECT_THAT(by_host.out, HasSubstr("host-a"));
  EXPECT_THAT(by_host.out, HasSubstr("host-b"));
  EXPECT_THAT(by_host.out, HasSubstr("\"num_values\": 2"));
}

TEST(EndToEndTest, BadSpecsAreRejectedAndTheCoordinatorKeepsServing) {
  LocalCluster cluster("e2e_bad");
  const std::string good = cluster.WriteJob("ok", 10);
  for (const auto& [from, to, fragment] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"data_parallel_size: 4", "data_parallel_size: 0", "spec.mesh.data_parallel_size"},
           {"global_batch_size: 64", "global_batch_size: 66", "spec.batch.global_batch_size"},
           {"type: mlp", "type: cnn", "spec.model.type"},
           {"learning_rate: 0.01", "learning_rate: -1", "spec.optimizer.learning_rate"},
       }) {
    std::ifstream in(good);
    std::string yaml((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string path = cluster.dir() + "/bad.yaml";
    std::ofstream(path) << absl::StrReplaceAll(yaml, {{from, to}});
    CommandResult r = cluster.Ctl({"submit", path});
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_THAT(r.err, HasSubstr(fragment));
  }
  EXPECT_TRUE(cluster.coordinator().Running());
  EXPECT_EQ(cluster.Ctl({"list"}).exit_code, 0);
}

}  // namespace
}  // namespace substrax::testing
