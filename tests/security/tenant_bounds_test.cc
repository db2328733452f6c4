// What one tenant can do to the others through sizes and numbers, with the real coordinator and
// daemons over mutual TLS and callers by bearer token (--auth-config): cancel reasons that once
// made `list` fail for everyone, streams beyond a caller's cap while a job trains, and a spec's
// env values hidden from readers who are neither its owner nor an admin. Each test ends by
// checking that no process outlived it.
#include <atomic>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/job_spec.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "rpc/pki.h"
#include "rpc/transport.h"
#include "substrax/v1/job_service.grpc.pb.h"
#include "tests/chaos/harness.h"
#include "tests/credentials.h"
#include "tests/process.h"

namespace substrax::testing {
namespace {

using ::testing::HasSubstr;

struct Token {
  std::string name;
  std::string role;
  std::string secret;
};

Token NewToken(const std::string& name, const std::string& role) {
  return {name, role, pki::RandomToken()};
}

// Writes an auth config of `tokens` under `dir`; its path.
std::string WriteAuthConfig(const std::string& dir, const std::vector<Token>& tokens) {
  std::string yaml = "tokens:\n";
  for (const Token& t : tokens) {
    absl::StrAppend(&yaml, "- name: ", t.name, "\n  role: ", t.role, "\n  sha256: ",
                    pki::Sha256Hex(t.secret), "\n");
  }
  const std::string path = dir + "/tokens.yaml";
  std::ofstream(path) << yaml;
  return path;
}

ChaosClusterOptions TlsOptions(const std::string& auth_config) {
  ChaosClusterOptions options;
  options.tls = true;
  options.coordinator_flags = {"--auth-config", auth_config};
  // No fault is injected here: a lease long enough that a loaded machine (TLS handshakes of
  // hundreds of streams beside the tests run in parallel) never fences the job by accident.
  options.heartbeat_timeout = "10s";
  return options;
}

// A call's context as the holder of `token` (over a channel with no identity of its own).
std::unique_ptr<grpc::ClientContext> As(const Token& token,
                                        absl::Duration timeout = absl::Seconds(20)) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->AddMetadata("authorization", "Bearer " + token.secret);
  return context;
}

// JobService stubs over TLS without a client certificate, each on a connection of its own.
std::vector<std::unique_ptr<v1::JobService::Stub>> Stubs(ChaosCluster& cluster, int connections) {
  std::vector<std::unique_ptr<v1::JobService::Stub>> stubs;
  for (int i = 0; i < connections; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
        MakeChannel(cluster.address(), cluster.ClientTransport(), args);
    EXPECT_TRUE(channel.ok()) << channel.status();
    if (channel.ok()) stubs.push_back(v1::JobService::NewStub(*channel));
  }
  return stubs;
}

v1::JobSpec ParseSpec(const std::string& yaml) {
  absl::StatusOr<v1::JobSpec> spec = ParseJobSpecYaml(yaml, "job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return spec.ok() ? *spec : v1::JobSpec();
}

std::string SubmitAs(v1::JobService::Stub& stub, const Token& token, const v1::JobSpec& spec) {
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  grpc::Status status = stub.SubmitJob(As(token).get(), request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.job().id();
}

grpc::Status CancelAs(v1::JobService::Stub& stub, const Token& token, const std::string& id,
                      const std::string& reason) {
  v1::CancelJobRequest request;
  request.set_job_id(id);
  request.set_reason(reason);
  v1::CancelJobResponse response;
  return stub.CancelJob(As(token).get(), request, &response);
}

// substraxctl with `args` as the holder of `token`.
CommandResult CtlAs(ChaosCluster& cluster, const Token& token, std::vector<std::string> args) {
  TransportOptions transport = cluster.ClientTransport();
  transport.token_file = absl::StrCat(cluster.dir(), "/token-", token.name);
  std::ofstream(transport.token_file) << token.secret << "\n";
  std::vector<std::string> argv = {Runfile("client/substraxctl"), "--coordinator",
                                   cluster.address()};
  for (std::string& flag : TestPki::Flags(transport)) argv.push_back(std::move(flag));
  argv.insert(argv.end(), args.begin(), args.end());
  return Run(argv, absl::Seconds(60));
}

int AliveWorkers(ChaosCluster& cluster) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::ListWorkersResponse workers;
  if (!cluster.jobs()->ListWorkers(&context, v1::ListWorkersRequest(), &workers).ok()) return -1;
  int alive = 0;
  for (const v1::Worker& w : workers.workers()) alive += w.state() == v1::WORKER_STATE_ALIVE;
  return alive;
}

// The report: forty 120 KB cancel reasons and `substraxctl list` failed for every user
// with RESOURCE_EXHAUSTED. A reason over the limit is now refused, naming it; one at the limit
// is stored; `list` works for the owner and for another user; a new job SUCCEEDS.
TEST(TenantBoundsTest, LongCancelReasonsAreRefusedAndListingAndTrainingGoOn) {
  const std::string files = TempDir("tenant_bounds_reasons_files");
  const Token alice = NewToken("alice", "submitter");
  const Token victor = NewToken("victor", "viewer");
  ChaosCluster cluster("tenant_bounds_reasons",
                       TlsOptions(WriteAuthConfig(files, {alice, victor})));
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(60))) << cluster.Logs();
  auto stubs = Stubs(cluster, 1);
  ASSERT_EQ(stubs.size(), 1u);
  v1::JobService::Stub& stub = *stubs[0];

  const v1::JobSpec forever = ParseSpec(SyntheticJob("long", 2, 1000000));
  std::vector<std::string> ids;
  for (int i = 0; i < 40; ++i) ids.push_back(SubmitAs(stub, alice, forever));
  for (const std::string& id : ids) {
    grpc::Status too_long = CancelAs(stub, alice, id, std::string(120 * 1024, 'r'));
    EXPECT_EQ(too_long.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    EXPECT_THAT(too_long.error_message(),
                HasSubstr("reason: 122880 bytes, more than the limit of 1024"));
    grpc::Status at_limit = CancelAs(stub, alice, id, std::string(1024, 'r'));
    EXPECT_TRUE(at_limit.ok()) << at_limit.error_message();
  }

  for (const Token* reader : {&alice, &victor}) {
    CommandResult list = CtlAs(cluster, *reader, {"list", "-o", "json"});
    ASSERT_EQ(list.exit_code, 0) << reader->name << ": " << list.err;
    for (const std::string& id : ids) EXPECT_THAT(list.out, HasSubstr(id)) << reader->name;
  }

  const std::string id = SubmitAs(stub, alice, ParseSpec(SyntheticJob("after", 2, 30)));
  std::optional<v1::Job> job = cluster.WaitForEnd(id, absl::Seconds(180));
  ASSERT_TRUE(job.has_value()) << cluster.Logs();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->error() << "\n" << cluster.Logs();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

// One stream of a test: its call, read on a thread of its own until it ends.
struct Stream {
  std::unique_ptr<grpc::ClientContext> context;
  std::atomic<bool> got_first{false};
  std::atomic<bool> ended{false};
  grpc::Status status;  // set before `ended`
  std::thread reader;
};

// Opens a WatchJob (or, `logs`, a followed ReadLogs) stream of `job_id` as `token`.
std::unique_ptr<Stream> Open(v1::JobService::Stub& stub, const Token& token,
                             const std::string& job_id, bool logs) {
  auto stream = std::make_unique<Stream>();
  stream->context = As(token, absl::Minutes(10));
  Stream* s = stream.get();
  s->reader = std::thread([s, &stub, job_id, logs] {
    if (logs) {
      v1::ReadLogsRequest request;
      request.set_job_id(job_id);
      request.set_follow(true);
      auto reader = stub.ReadLogs(s->context.get(), request);
      v1::ReadLogsResponse response;
      while (reader->Read(&response)) s->got_first = true;
      s->status = reader->Finish();
    } else {
      v1::WatchJobRequest request;
      request.set_job_id(job_id);
      auto reader = stub.WatchJob(s->context.get(), request);
      v1::WatchJobResponse response;
      while (reader->Read(&response)) s->got_first = true;
      s->status = reader->Finish();
    }
    s->ended = true;
  });
  return stream;
}

int Count(const std::vector<std::unique_ptr<Stream>>& streams,
          const std::function<bool(const Stream&)>& holds) {
  int n = 0;
  for (const auto& s : streams) n += holds(*s) ? 1 : 0;
  return n;
}

// The acceptance: 200 `watch`/`logs -f` streams from one viewer, those over its cap
// refused with RESOURCE_EXHAUSTED naming the cap, and one stream each from 200 viewers, while a
// job trains: every worker stays ALIVE and no attempt fails; then every stream closes, the
// viewer's count is given back, and no process outlives the test.
TEST(TenantBoundsTest, StreamsAreCappedPerViewerWhileAJobTrainsUntouched) {
  const std::string files = TempDir("tenant_bounds_streams_files");
  std::vector<Token> viewers;
  for (int i = 0; i <= 200; ++i) viewers.push_back(NewToken(absl::StrCat("viewer-", i), "viewer"));
  ChaosCluster cluster("tenant_bounds_streams", TlsOptions(WriteAuthConfig(files, viewers)));
  ASSERT_TRUE(cluster.WaitForWorkers(2, absl::Seconds(60))) << cluster.Logs();
  const std::string id = cluster.Submit(SyntheticJob("trains", 4, 100000000));
  ASSERT_FALSE(absl::StartsWith(id, "error: ")) << id;
  ASSERT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> job = cluster.Get(id);
        return job.has_value() && job->progress().step() > 0;
      },
      absl::Seconds(120)))
      << cluster.Logs();
  auto stubs = Stubs(cluster, 8);
  ASSERT_EQ(stubs.size(), 8u);

  // One viewer, 200 streams, half watching and half following the logs; the default cap is 64.
  constexpr int kCap = 64;
  std::vector<std::unique_ptr<Stream>> heavy;
  for (int i = 0; i < 200; ++i) {
    heavy.push_back(Open(*stubs[i % stubs.size()], viewers[0], id, /*logs=*/i % 2 == 1));
  }
  auto ended = [](const Stream& s) { return s.ended.load(); };
  ASSERT_TRUE(PollUntil([&] { return Count(heavy, ended) >= 200 - kCap; }, absl::Seconds(60)));
  int refused = 0;
  for (const auto& s : heavy) {
    if (!s->ended.load()) continue;
    ++refused;
    EXPECT_EQ(s->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << s->status.error_message();
    EXPECT_THAT(s->status.error_message(),
                HasSubstr("the cap per caller (--max-streams-per-caller=64)"));
  }
  EXPECT_EQ(refused, 200 - kCap);

  // 200 other viewers, one stream each: every one served (a watch sends the job at once).
  std::vector<std::unique_ptr<Stream>> many;
  for (int v = 1; v <= 200; ++v) {
    many.push_back(Open(*stubs[v % stubs.size()], viewers[v], id, /*logs=*/false));
  }
  EXPECT_TRUE(PollUntil(
      [&] { return Count(many, [](const Stream& s) { return s.got_first.load(); }) == 200; },
      absl::Seconds(60)));

  // With all of them open the job trains on, in its first attempt, every worker alive.
  std::optional<v1::Job> before = cluster.Get(id);
  ASSERT_TRUE(before.has_value());
  EXPECT_TRUE(PollUntil(
      [&] {
        std::optional<v1::Job> now = cluster.Get(id);
        return now.has_value() && now->progress().step() > before->progress().step() + 20;
      },
      absl::Seconds(60)))
      << cluster.Logs();
  EXPECT_EQ(AliveWorkers(cluster), 2);
  std::optional<v1::Job> job = cluster.Get(id);
  ASSERT_TRUE(job.has_value());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING) << job->error();
  EXPECT_EQ(job->attempt(), 1);
  // Only the refused ones ended: the admitted stayed open all along.
  EXPECT_EQ(Count(heavy, ended), 200 - kCap);
  EXPECT_EQ(Count(many, ended), 0);

  // Every stream closed; the heavy viewer's count is given back: a new stream is served.
  for (auto* streams : {&heavy, &many}) {
    for (auto& s : *streams) s->context->TryCancel();
    for (auto& s : *streams) s->reader.join();
  }
  // The server gives a stream's count back when it learns of the cancel, a moment after the
  // client's: a new stream refused for the cap meanwhile is tried again, until the deadline.
  std::unique_ptr<Stream> again;
  std::string why;
  EXPECT_TRUE(PollUntil(
      [&] {
        if (again != nullptr && again->got_first.load()) return true;
        if (again != nullptr && !again->ended.load()) return false;
        if (again != nullptr) {
          why = again->status.error_message();
          again->reader.join();
        }
        again = Open(*stubs[0], viewers[0], id, /*logs=*/false);
        return false;
      },
      absl::Seconds(30)))
      << why << cluster.Logs();
  ASSERT_NE(again, nullptr);
  EXPECT_TRUE(again->got_first.load()) << again->status.error_message() << cluster.Logs();
  again->context->TryCancel();
  if (again->reader.joinable()) again->reader.join();

  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  context.set_wait_for_ready(true);
  v1::CancelJobRequest cancel;
  cancel.set_job_id(id);
  v1::CancelJobResponse cancelled;
  const grpc::Status cancel_status = cluster.jobs()->CancelJob(&context, cancel, &cancelled);
  EXPECT_TRUE(cancel_status.ok()) << cancel_status.error_message() << cluster.Logs();
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

// A spec's env may hold a submitter's secrets: only its owner and admins read the values; any
// other reader sees the names with "<redacted>", through GetJob, ListJobs, WatchJob and
// `substraxctl get -o yaml`.
TEST(TenantBoundsTest, EnvValuesAreShownOnlyToTheOwnerAndAdmins) {
  constexpr char kRedacted[] = "<redacted>";
  const std::string files = TempDir("tenant_bounds_env_files");
  const Token alice = NewToken("alice", "submitter");
  const Token bob = NewToken("bob", "submitter");
  const Token victor = NewToken("victor", "viewer");
  ChaosClusterOptions options = TlsOptions(WriteAuthConfig(files, {alice, bob, victor}));
  options.workers = 1;
  options.worker_flags = {"--programs-dir", files};
  ChaosCluster cluster("tenant_bounds_env", options);
  ASSERT_TRUE(cluster.WaitForWorkers(1, absl::Seconds(60))) << cluster.Logs();
  auto stubs = Stubs(cluster, 1);
  ASSERT_EQ(stubs.size(), 1u);
  v1::JobService::Stub& stub = *stubs[0];
  // The program does not exist, so the attempt fails: what matters is what readers see.
  const std::string id = SubmitAs(
      stub, alice,
      ParseSpec(absl::StrCat("apiVersion: substrax/v1\nkind: TrainJob\nmetadata: {name: env}\n"
                             "spec:\n  program:\n    path: ", files, "/absent\n",
                             "    env: {APP_API_KEY: s3cret-value}\n",
                             "  mesh: {data_parallel_size: 1}\n")));

  auto env_of = [](const v1::Job& job) {
    const auto& env = job.spec().program().env();
    auto it = env.find("APP_API_KEY");
    return it == env.end() ? std::string("(no APP_API_KEY)") : it->second;
  };
  auto get_as = [&](const Token* token) {
    v1::GetJobRequest request;
    request.set_job_id(id);
    v1::GetJobResponse response;
    grpc::ClientContext admin;
    grpc::Status status = token != nullptr ? stub.GetJob(As(*token).get(), request, &response)
                                           : cluster.jobs()->GetJob(&admin, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return env_of(response.job());
  };
  EXPECT_EQ(get_as(&alice), "s3cret-value");
  EXPECT_EQ(get_as(nullptr), "s3cret-value");  // the admin's certificate
  EXPECT_EQ(get_as(&bob), kRedacted);
  EXPECT_EQ(get_as(&victor), kRedacted);

  v1::ListJobsResponse listed;
  ASSERT_TRUE(stub.ListJobs(As(victor).get(), v1::ListJobsRequest(), &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(env_of(listed.jobs(0)), kRedacted);

  v1::WatchJobRequest watch;
  watch.set_job_id(id);
  auto context = As(victor);
  auto reader = stub.WatchJob(context.get(), watch);
  v1::WatchJobResponse first;
  ASSERT_TRUE(reader->Read(&first));
  EXPECT_EQ(env_of(first.job()), kRedacted);
  context->TryCancel();
  reader->Finish();

  CommandResult yaml = CtlAs(cluster, bob, {"get", id, "-o", "yaml"});
  ASSERT_EQ(yaml.exit_code, 0) << yaml.err;
  EXPECT_THAT(yaml.out, HasSubstr("APP_API_KEY"));
  EXPECT_THAT(yaml.out, ::testing::Not(HasSubstr("s3cret-value")));
  EXPECT_THAT(CtlAs(cluster, alice, {"get", id, "-o", "yaml"}).out, HasSubstr("s3cret-value"));

  cluster.WaitForEnd(id, absl::Seconds(60));
  EXPECT_EQ(cluster.StopAndListLeftovers(), "");
}

}  // namespace
}  // namespace substrax::testing
