#include "tests/chaos/harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "core/job_spec.h"
#include "grpcpp/grpcpp.h"

namespace substrax::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void Close(int fd) {
  if (fd >= 0) close(fd);
}

std::optional<v1::QueryMetricsResponse> QueryDeviceMetrics(v1::MetricsService::Stub& stub,
                                                           const std::string& id, int attempt) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::QueryMetricsRequest request;
  request.set_job_id(id);
  request.set_reduction(v1::REDUCTION_NONE);
  request.set_attempt(attempt);
  v1::QueryMetricsResponse response;
  if (!stub.QueryMetrics(&context, request, &response).ok()) return std::nullopt;
  return response;
}

}  // namespace

AcknowledgedRecords::AcknowledgedRecords(const std::string& address, std::string job_id)
    : job_id_(std::move(job_id)) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  jobs_ = v1::JobService::NewStub(channel);
  metrics_ = v1::MetricsService::NewStub(channel);
  thread_ = std::thread([this] {
    while (!stopping_.load()) {
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
      v1::GetJobRequest request;
      request.set_job_id(job_id_);
      v1::GetJobResponse response;
      const bool got_job = jobs_->GetJob(&context, request, &response).ok();
      std::optional<v1::QueryMetricsResponse> points =
          QueryDeviceMetrics(*metrics_, job_id_, /*attempt=*/0);
      {
        absl::MutexLock lock(&mu_);
        if (got_job) job_ = response.job();
        if (points.has_value()) metrics_seen_ = std::move(points);
      }
      absl::SleepFor(absl::Milliseconds(20));  // a sampling period, not a wait for a condition
    }
  });
}

AcknowledgedRecords::~AcknowledgedRecords() { Stop(); }

void AcknowledgedRecords::Stop() {
  stopping_.store(true);
  if (thread_.joinable()) thread_.join();
}

std::optional<v1::Job> AcknowledgedRecords::job() {
  absl::MutexLock lock(&mu_);
  return job_;
}

std::optional<v1::QueryMetricsResponse> AcknowledgedRecords::metrics() {
  absl::MutexLock lock(&mu_);
  return metrics_seen_;
}

std::string LostJobRecords(const v1::Job& acked, const v1::Job& now) {
  std::string lost;
  for (int i = 0; i < acked.transitions_size(); ++i) {
    if (i >= now.transitions_size() ||
        acked.transitions(i).SerializeAsString() != now.transitions(i).SerializeAsString()) {
      absl::StrAppend(&lost, "transition ", i, " {", acked.transitions(i).ShortDebugString(),
                      "} is now ",
                      i < now.transitions_size() ? now.transitions(i).ShortDebugString()
                                                 : std::string("missing"),
                      "\n");
    }
  }
  const bool terminal = acked.state() == v1::JOB_STATE_SUCCEEDED ||
                        acked.state() == v1::JOB_STATE_FAILED ||
                        acked.state() == v1::JOB_STATE_CANCELLED;
  if (terminal && now.state() != acked.state()) {
    absl::StrAppend(&lost, "the job had ended ", v1::JobState_Name(acked.state()), ", now it is ",
                    v1::JobState_Name(now.state()), "\n");
  }
  if (acked.progress().step() > now.progress().step() && acked.attempt() == now.attempt()) {
    absl::StrAppend(&lost, "progress went back from step ", acked.progress().step(), " to ",
                    now.progress().step(), " in attempt ", now.attempt(), "\n");
  }
  return lost;
}

std::string LostMetricPoints(const v1::QueryMetricsResponse& acked,
                             const v1::QueryMetricsResponse& now) {
  // (name, group) -> step -> value, as now.
  std::map<std::pair<std::string, std::string>, std::map<int64_t, double>> have;
  for (const v1::MetricSeries& s : now.series()) {
    auto& points = have[{s.name(), s.group()}];
    for (const v1::MetricPoint& p : s.points()) points[p.step()] = p.value();
  }
  std::string lost;
  int missing = 0;
  for (const v1::MetricSeries& s : acked.series()) {
    const auto& points = have[{s.name(), s.group()}];
    for (const v1::MetricPoint& p : s.points()) {
      auto it = points.find(p.step());
      if (it != points.end() && it->second == p.value()) continue;
      if (++missing <= 10) {
        absl::StrAppend(&lost, "attempt ", acked.attempt(), " ", s.name(), " of device ",
                        s.group(), " at step ", p.step(), " was ", p.value(), ", now ",
                        it == points.end() ? std::string("missing") : absl::StrCat(it->second),
                        "\n");
      }
    }
  }
  if (missing > 10) absl::StrAppend(&lost, "... ", missing - 10, " more points lost\n");
  return lost;
}

// ---------------------------------------------------------------------------------------------
// TcpProxy

TcpProxy::TcpProxy(std::string upstream) : upstream_(std::move(upstream)) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  listen(listen_fd_, 64);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

TcpProxy::~TcpProxy() {
  stopping_ = true;
  acceptor_.join();
  Close(listen_fd_);
  ResetAll();
  std::vector<std::thread> pumps;
  {
    absl::MutexLock lock(&mu_);
    pumps.swap(pumps_);
  }
  for (std::thread& t : pumps) t.join();
}

std::string TcpProxy::address() const { return absl::StrCat("127.0.0.1:", port_); }

int TcpProxy::ResetAll() {
  absl::MutexLock lock(&mu_);
  const linger reset{1, 0};
  for (int fd : open_) {
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    shutdown(fd, SHUT_RDWR);  // wakes the pump, which closes (and so resets) both sides
  }
  return static_cast<int>(open_.size()) / 2;
}

void TcpProxy::AcceptLoop() {
  const std::vector<std::string> parts = absl::StrSplit(upstream_, ':');
  int upstream_port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &upstream_port)) return;
  while (!stopping_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int client = accept(listen_fd_, nullptr, nullptr);
    if (client < 0) continue;
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(upstream_port));
    inet_pton(AF_INET, parts[0].c_str(), &addr.sin_addr);
    if (connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Close(server);
      Close(client);
      continue;
    }
    absl::MutexLock lock(&mu_);
    open_.insert(client);
    open_.insert(server);
    pumps_.emplace_back([this, client, server] { Pump(client, server); });
  }
}

void TcpProxy::Pump(int client, int server) {
  char buffer[16384];
  pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
  while (!stopping_.load()) {
    if (poll(fds, 2, 100) <= 0) continue;
    bool done = false;
    for (int i = 0; i < 2 && !done; ++i) {
      if (fds[i].revents == 0) continue;
      const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
      if (n <= 0) {
        done = true;
        break;
      }
      for (ssize_t sent = 0; sent < n;) {
        const ssize_t w = write(fds[1 - i].fd, buffer + sent, n - sent);
        if (w <= 0) {
          done = true;
          break;
        }
        sent += w;
      }
    }
    if (done) break;
  }
  absl::MutexLock lock(&mu_);
  const linger reset{1, 0};
  for (int fd : {client, server}) {
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
    open_.erase(fd);
    close(fd);
  }
}

// ---------------------------------------------------------------------------------------------
// /proc

RunnerWatch::RunnerWatch(std::string dir) : dir_(std::move(dir)) {
  thread_ = std::thread([this] {
    while (!stopping_.load()) {
      // job -> attempts alive; (job, attempt, process) -> runners alive.
      std::map<std::string, std::set<std::string>> attempts;
      std::map<std::string, int> per_process;
      std::vector<RunnerProcess> runners = RunnersUnder(dir_);
      for (const RunnerProcess& r : runners) {
        const std::string base = r.launch.substr(r.launch.rfind('/') + 1);
        const size_t a = base.rfind("-attempt-");
        const size_t p = base.rfind("-process-");
        if (a == std::string::npos || p == std::string::npos) continue;
        attempts[base.substr(0, a)].insert(base.substr(a, p - a));
        ++per_process[base];
      }
      {
        absl::MutexLock lock(&mu_);
        for (const RunnerProcess& r : runners) seen_[r.launch].insert(r.pid);
        for (const auto& [job, set] : attempts) {
          if (set.size() > 1) ++overlaps_;
        }
        for (const auto& [process, n] : per_process) {
          if (n > 1) ++overlaps_;
        }
      }
      absl::SleepFor(absl::Milliseconds(20));  // a sampling period, not a wait for a condition
    }
  });
}

RunnerWatch::~RunnerWatch() {
  stopping_ = true;
  thread_.join();
}

std::map<std::string, std::set<pid_t>> RunnerWatch::Seen() {
  absl::MutexLock lock(&mu_);
  return seen_;
}

int RunnerWatch::Overlaps() {
  absl::MutexLock lock(&mu_);
  return overlaps_;
}

// ---------------------------------------------------------------------------------------------
// ChaosCluster

ChaosCluster::ChaosCluster(const std::string& name, ChaosClusterOptions options)
    : options_(std::move(options)), dir_(TempDir(name)) {
  if (options_.tls) pki_ = std::make_unique<TestPki>(dir_ + "/tls");
  workers_.resize(options_.workers);
  StartCoordinator(options_.coordinator_env);
  for (int w = 0; w < options_.workers; ++w) StartWorker(w);
}

ChaosCluster::~ChaosCluster() {
  workers_.clear();
  coordinator_.reset();
  proxy_.reset();
}

void ChaosCluster::StartCoordinator(const std::vector<std::string>& env) {
  std::remove((dir_ + "/address").c_str());
  std::vector<std::string> argv = {Runfile("coordinator/substrax-coordinator"), "--listen",
                                   address_.empty() ? "127.0.0.1:0" : address_,
                                   "--metrics-listen", "", "--state-dir", dir_ + "/state",
                                   "--address-file", dir_ + "/address", "--heartbeat-interval",
                                   options_.heartbeat_interval, "--heartbeat-timeout",
                                   options_.heartbeat_timeout};
  argv.insert(argv.end(), options_.coordinator_flags.begin(), options_.coordinator_flags.end());
  // Faults, not credentials, are under test here unless options_.tls (tests/security).
  for (std::string& flag : TransportFlags("")) argv.push_back(std::move(flag));
  // Each run has its own log, so that a restart keeps the first run's.
  ++coordinator_runs_;
  const std::string log = absl::StrCat(dir_, "/coordinator-", coordinator_runs_, ".log");
  coordinator_ = std::make_unique<Process>(argv, log, env);
  std::string address;
  PollUntil(
      [&] {
        std::ifstream in(dir_ + "/address");
        return static_cast<bool>(std::getline(in, address)) && !address.empty();
      },
      absl::Seconds(30));
  // A restart reuses the first run's port, so that daemons and the proxy find it again.
  if (address_.empty()) address_ = address;
  if (options_.through_proxy && proxy_ == nullptr) proxy_ = std::make_unique<TcpProxy>(address_);
  Connect();
}

void ChaosCluster::Connect() {
  if (pki_ == nullptr) {
    jobs_ = v1::JobService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    return;
  }
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannel(address_, pki_->Issue("admin", "admin"));
  if (channel.ok()) jobs_ = v1::JobService::NewStub(*channel);
}

TransportOptions ChaosCluster::ClientTransport() const {
  if (pki_ == nullptr) return InsecureTransport();
  TransportOptions transport;
  transport.ca_file = pki_->ca_file();
  return transport;
}

std::vector<std::string> ChaosCluster::TransportFlags(const std::string& worker_id,
                                                      absl::Duration valid_for) {
  if (pki_ == nullptr) return InsecureFlags();
  if (worker_id.empty()) return pki_->CoordinatorFlags();
  const absl::Time now = absl::Now();
  return TestPki::Flags(pki_->Issue(worker_id, "worker", now - absl::Hours(1), now + valid_for));
}

std::string ChaosCluster::worker_address() const {
  return proxy_ != nullptr ? proxy_->address() : address_;
}

void ChaosCluster::StartWorker(int w) {
  std::vector<std::string> argv = {Runfile("agent/substrax-agent"), "--coordinator",
                                   worker_address(), "--cpu-devices",
                                   absl::StrCat(options_.cpu_devices_per_worker), "--worker-id",
                                   absl::StrCat("w-", w + 1), "--host",
                                   std::string("host-") + char('a' + w), "--work-dir",
                                   absl::StrCat(dir_, "/worker-", w + 1), "--collective-timeout",
                                   options_.collective_timeout, "--stop-grace",
                                   options_.stop_grace};
  argv.insert(argv.end(), options_.worker_flags.begin(), options_.worker_flags.end());
  auto valid_for = options_.worker_cert_valid_for.find(w);
  for (std::string& flag :
       TransportFlags(absl::StrCat("w-", w + 1),
                      valid_for == options_.worker_cert_valid_for.end()
                          ? options_.default_worker_cert_valid_for
                          : valid_for->second)) {
    argv.push_back(std::move(flag));
  }
  auto wrapper = options_.worker_wrappers.find(w);
  const std::vector<std::string>& wrap =
      wrapper == options_.worker_wrappers.end() ? options_.worker_wrapper : wrapper->second;
  argv.insert(argv.begin(), wrap.begin(), wrap.end());
  workers_[w] = std::make_unique<Process>(argv, absl::StrCat(dir_, "/worker-", w + 1, ".log"),
                                          options_.worker_env);
}

bool ChaosCluster::WaitForWorkers(int n, absl::Duration timeout) {
  return PollUntil(
      [&] {
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
        v1::ListWorkersRequest request;
        v1::ListWorkersResponse response;
        if (!jobs_->ListWorkers(&context, request, &response).ok()) return false;
        int alive = 0;
        for (const v1::Worker& worker : response.workers()) {
          if (worker.state() == v1::WORKER_STATE_ALIVE) ++alive;
        }
        return alive >= n;
      },
      timeout);
}

std::string ChaosCluster::Submit(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml);
  if (!spec.ok()) return absl::StrCat("error: ", spec.status().message());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  v1::SubmitJobResponse response;
  grpc::Status status = jobs_->SubmitJob(&context, request, &response);
  if (!status.ok()) return absl::StrCat("error: ", status.error_message());
  return response.job().id();
}

std::optional<v1::QueryMetricsResponse> ChaosCluster::DeviceMetrics(const std::string& id,
                                                                    int attempt) {
  return QueryDeviceMetrics(
      *v1::MetricsService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials())),
      id, attempt);
}

std::optional<v1::Job> ChaosCluster::Get(const std::string& id) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
  v1::GetJobRequest request;
  request.set_job_id(id);
  v1::GetJobResponse response;
  if (!jobs_->GetJob(&context, request, &response).ok()) return std::nullopt;
  return response.job();
}

std::optional<v1::Job> ChaosCluster::WaitForEnd(const std::string& id, absl::Duration timeout) {
  std::optional<v1::Job> job;
  PollUntil(
      [&] {
        job = Get(id);
        return job.has_value() && (job->state() == v1::JOB_STATE_SUCCEEDED ||
                                   job->state() == v1::JOB_STATE_FAILED ||
                                   job->state() == v1::JOB_STATE_CANCELLED);
      },
      timeout);
  return job;
}

CommandResult ChaosCluster::Ctl(std::vector<std::string> args) {
  std::vector<std::string> credentials = {"--insecure"};
  if (pki_ != nullptr) credentials = TestPki::Flags(pki_->Issue("ctl-admin", "admin"));
  args.insert(args.begin(), credentials.begin(), credentials.end());
  args.insert(args.begin(), {Runfile("client/substraxctl"), "--coordinator", address_});
  return Run(args, absl::Seconds(60));
}

std::string ChaosCluster::Logs() {
  std::string all;
  for (int run = 1; run <= coordinator_runs_; ++run) {
    absl::StrAppend(&all, "--- coordinator run ", run, " ---\n",
                    ReadAll(absl::StrCat(dir_, "/coordinator-", run, ".log")));
  }
  for (int w = 0; w < options_.workers; ++w) {
    absl::StrAppend(&all, "\n--- worker ", w + 1, " ---\n",
                    ReadAll(absl::StrCat(dir_, "/worker-", w + 1, ".log")));
  }
  return all;
}

std::string ChaosCluster::StopAndListLeftovers() {
  for (auto& worker : workers_) {
    if (worker != nullptr) worker->Signal(SIGTERM);
  }
  for (auto& worker : workers_) {
    if (worker != nullptr) worker->Wait(absl::Seconds(30));
  }
  if (coordinator_ != nullptr) {
    coordinator_->Signal(SIGTERM);
    coordinator_->Wait(absl::Seconds(30));
  }
  std::vector<pid_t> left;
  PollUntil(
      [&] {
        left = ProcessesMentioning(dir_);
        return left.empty();
      },
      absl::Seconds(10));
  std::string listing;
  for (pid_t pid : left) absl::StrAppend(&listing, pid, ": ", CommandLine(pid), "\n");
  return listing;
}

std::string SyntheticJob(const std::string& name, int devices, int steps, int max_restarts) {
  return absl::StrReplaceAll(R"(apiVersion: substrax/v1
kind: TrainJob
metadata: {name: NAME}
spec:
  model: {type: mlp, hidden_sizes: [32, 32], num_classes: 4}
  data:
    format: synthetic
    synthetic: {task: classification, num_train_examples: 4096, num_test_examples: 512,
                num_features: 16, noise: 0.3}
  optimizer: {type: adam, learning_rate: 0.01}
  mesh: {data_parallel_size: DEVICES}
  batch: {global_batch_size: 64}
  steps: STEPS
  report_every_steps: 10
  max_restarts: RESTARTS
)",
                             {{"NAME", name},
                              {"DEVICES", absl::StrCat(devices)},
                              {"STEPS", absl::StrCat(steps)},
                              {"RESTARTS", absl::StrCat(max_restarts)}});
}

}  // namespace substrax::testing
