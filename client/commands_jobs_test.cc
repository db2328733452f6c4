// Tests of substraxctl's job commands (submit, get, list, cancel, delete, logs, watch, workers,
// queues, mesh) against the fake coordinator of commands_test_util.h, checking stdout, stderr
// and exit codes.
#include "client/commands.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "client/commands_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax::ctl {
namespace {

using ::testing::HasSubstr;

TEST_F(CommandsTest, SubmitSendsTheParsedSpecAndPrintsTheId) {
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("good.yaml", GoodSpecYaml()), false), kExitOk)
      << err_.str();
  EXPECT_EQ(out_.str(), "demo-1\n");
  EXPECT_EQ(jobs_.submits(), 1);
  EXPECT_EQ(jobs_.last_spec().name(), "demo");
  EXPECT_EQ(jobs_.last_spec().report_every_steps(), 50);  // defaults applied locally
}

TEST_F(CommandsTest, SubmitRetriesWithTheSameRequestIdAndEachInvocationDrawsItsOwn) {
  const std::string path = WriteFile("good.yaml", GoodSpecYaml());
  // The coordinator is restarting: the first two tries fail, the third makes the job.
  jobs_.FailNextSubmits(2);
  EXPECT_EQ(SubmitCommand(ctx_, path, false), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "demo-1\n");
  EXPECT_EQ(jobs_.submits(), 3);
  std::vector<std::string> ids = jobs_.request_ids();
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
  // Of the coordinator's charset and length (limits::kMaxRequestIdBytes).
  EXPECT_GE(ids[0].size(), 16u);
  EXPECT_LE(ids[0].size(), 64u);
  EXPECT_EQ(ids[0].find_first_not_of(
                "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_"),
            std::string::npos)
      << ids[0];
  // Another invocation is another submission.
  EXPECT_EQ(SubmitCommand(ctx_, path, false), kExitOk) << err_.str();
  ids = jobs_.request_ids();
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_NE(ids[3], ids[0]);
}

TEST_F(CommandsTest, SubmitGivesUpAfterItsRetriesAndNeverRetriesARefusal) {
  const std::string path = WriteFile("good.yaml", GoodSpecYaml());
  jobs_.FailNextSubmits(10);
  EXPECT_EQ(SubmitCommand(ctx_, path, false), kExitUnreachable);
  EXPECT_EQ(jobs_.submits(), 4);
  EXPECT_THAT(err_.str(), HasSubstr("the coordinator is restarting"));
  jobs_.FailNextSubmits(1, grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(SubmitCommand(ctx_, path, false), kExitError);
  EXPECT_EQ(jobs_.submits(), 5);
}

TEST_F(CommandsTest, SubmitOfABadSpecSendsNothingAndNamesFileLineColumn) {
  std::string bad = GoodSpecYaml();
  bad.replace(bad.find("data_parallel_size: 2"), 21, "data_parallel_size: 0");
  const std::string path = WriteFile("bad.yaml", bad);
  EXPECT_EQ(SubmitCommand(ctx_, path, false), kExitUsage);
  EXPECT_EQ(jobs_.submits(), 0);
  EXPECT_EQ(out_.str(), "");
  EXPECT_NE(err_.str().find("nothing was submitted"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find(path + ":10:"), std::string::npos) << err_.str();
  EXPECT_NE(err_.str().find("spec.mesh.data_parallel_size"), std::string::npos) << err_.str();

  err_.str("");
  EXPECT_EQ(SubmitCommand(ctx_, path + ".missing", false), kExitUsage);
  EXPECT_EQ(jobs_.submits(), 0);
}

TEST_F(CommandsTest, ServerRejectionIsPrintedWithItsCode) {
  std::string spec = GoodSpecYaml();
  spec.replace(spec.find("name: demo"), 10, "name: too-big");
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("big.yaml", spec), false), kExitError);
  EXPECT_EQ(err_.str(),
            "substraxctl: RESOURCE_EXHAUSTED: the mesh needs 64 devices; the cluster has 4\n");
}

TEST_F(CommandsTest, SubmitJsonPrintsTheJob) {
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("good.yaml", GoodSpecYaml()), false), kExitOk);
  EXPECT_NE(out_.str().find("\"id\": \"demo-1\""), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("\"state\": \"JOB_STATE_PENDING\""), std::string::npos);
}

TEST_F(CommandsTest, GetShowsTheJobOrNotFound) {
  EXPECT_EQ(GetCommand(ctx_, "demo-1"), kExitOk);
  EXPECT_NE(out_.str().find("State:    RUNNING\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("Progress: step 40/100 (40.0%)\n"), std::string::npos) << out_.str();
  EXPECT_NE(out_.str().find("scheduled on 2 devices of 1 worker"), std::string::npos);
  out_.str("");
  EXPECT_EQ(GetCommand(ctx_, "nope"), kExitError);
  EXPECT_EQ(out_.str(), "");
  EXPECT_EQ(err_.str(), "substraxctl: NOT_FOUND: job nope not found\n");
}

TEST_F(CommandsTest, ListReadsEveryPageAndFiltersByState) {
  EXPECT_EQ(ListCommand(ctx_, "running,pending"), kExitOk) << err_.str();
  const std::string out = out_.str();
  EXPECT_EQ(
      out.rfind("ID       NAME   QUEUE   STATE     ATTEMPT   STEP     DEVICES   AGE\n", 0), 0u)
      << out;
  EXPECT_THAT(out, HasSubstr("demo-2   demo   -       PENDING   0         0/100"));
  EXPECT_THAT(out, HasSubstr("demo-1   demo   -       RUNNING   1         40/100"));
  ASSERT_EQ(jobs_.last_list().states_size(), 2);
  EXPECT_EQ(jobs_.last_list().states(0), v1::JOB_STATE_RUNNING);

  out_.str("");
  EXPECT_EQ(ListCommand(ctx_, "runing"), kExitUsage);
  EXPECT_NE(err_.str().find("--state: unknown state 'runing'"), std::string::npos);
}

TEST_F(CommandsTest, CancelPassesTheReason) {
  EXPECT_EQ(CancelCommand(ctx_, "demo-1", "wrong learning rate"), kExitOk);
  EXPECT_EQ(out_.str(), "demo-1 CANCELLED\n");
  EXPECT_EQ(jobs_.last_cancel().reason(), "wrong learning rate");
  EXPECT_EQ(CancelCommand(ctx_, "done-1", ""), kExitError);
  EXPECT_EQ(err_.str(), "substraxctl: FAILED_PRECONDITION: job done-1 already SUCCEEDED\n");
}

TEST_F(CommandsTest, DeleteSaysWhatWasDeletedOrWhyNot) {
  EXPECT_EQ(DeleteCommand(ctx_, "done-1"), kExitOk);
  EXPECT_EQ(out_.str(), "done-1 deleted\n");
  EXPECT_EQ(DeleteCommand(ctx_, "demo-1"), kExitError);
  EXPECT_NE(err_.str().find("FAILED_PRECONDITION: job demo-1 is RUNNING"), std::string::npos)
      << err_.str();
}

TEST_F(CommandsTest, LogsPrefixEachLineWithItsProcessAndHost) {
  LogsFlags flags;
  flags.process = 0;
  flags.tail = 3;
  flags.follow = true;
  EXPECT_EQ(LogsCommand(ctx_, "demo-1", flags), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(), "[p0 host-a] step 10/100 loss=0.5\n[p1 host-b] ready\n");
  EXPECT_THAT(err_.str(), HasSubstr("[... 10 earlier bytes dropped ...]"));
  EXPECT_TRUE(jobs_.last_logs_request.has_process_index());
  EXPECT_EQ(jobs_.last_logs_request.process_index(), 0);
  EXPECT_EQ(jobs_.last_logs_request.tail_lines(), 3);
  EXPECT_TRUE(jobs_.last_logs_request.follow());
}

TEST_F(CommandsTest, LogsOfEveryProcessAsJsonLines) {
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(LogsCommand(ctx_, "demo-1", LogsFlags()), kExitOk) << err_.str();
  EXPECT_FALSE(jobs_.last_logs_request.has_process_index());
  const std::string out = out_.str();
  ASSERT_EQ(std::count(out.begin(), out.end(), '\n'), 2) << out;
  EXPECT_THAT(out, HasSubstr("\"text\":\"ready\""));
  EXPECT_THAT(out, HasSubstr("\"process_index\":1"));
}

TEST_F(CommandsTest, LogsRefuseBadFlagsAndReportErrors) {
  for (auto set : std::vector<std::function<void(LogsFlags&)>>{
           [](LogsFlags& f) { f.process = -2; }, [](LogsFlags& f) { f.attempt = -1; },
           [](LogsFlags& f) { f.tail = -5; }}) {
    LogsFlags flags;
    set(flags);
    EXPECT_EQ(LogsCommand(ctx_, "demo-1", flags), kExitUsage);
  }
  EXPECT_EQ(LogsCommand(ctx_, "nope-1", LogsFlags()), kExitError);
  EXPECT_THAT(err_.str(), HasSubstr("NOT_FOUND"));
}

TEST_F(CommandsTest, WatchPlainPrintsALinePerStepThenTheOutcome) {
  EXPECT_EQ(WatchCommand(ctx_, "demo-1"), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "job demo-1 PENDING: submitted\n"
            "job demo-1 RUNNING (attempt 1): scheduled on 2 devices of 1 worker\n"
            "step 0/100 (0.0%)  loss=1\n"
            "step 50/100 (50.0%)  loss=0.0196 trend=^_  eta 10s\n"
            "step 100/100 (100.0%)  loss=0.0099 trend=^-_  eta 0s\n"
            "demo-1 SUCCEEDED after 1m00s at step 100/100\n"
            "test_accuracy=0.8812\n");
  EXPECT_EQ(err_.str(), "");
}

TEST_F(CommandsTest, WatchPrintsAStragglerFlaggedWhileTheJobRuns) {
  EXPECT_EQ(WatchCommand(ctx_, "slow-1"), kExitOk) << err_.str();
  EXPECT_THAT(out_.str(), HasSubstr("step 50/100 (50.0%)  loss=0.0196 trend=^_  eta 10s\n"
                                    "job slow-1: straggler: device 3 (process 1, worker w-2 (host "
                                    "b)): its compute time is 1.84x the other devices' median\n"
                                    "step 100/100"));
}

TEST_F(CommandsTest, WatchOnATerminalRedrawsTheBarInPlace) {
  ctx_.terminal = true;
  ctx_.unicode = true;
  ctx_.columns = 100;
  EXPECT_EQ(WatchCommand(ctx_, "demo-1"), kExitOk);
  const std::string out = out_.str();
  EXPECT_NE(out.find("\r|"), std::string::npos) << out;
  // The loss trend: one glyph per step the stream showed (0, 50, 100); step 50 again, with
  // its loss refined to 0.6, replaces step 50's value.
  EXPECT_NE(out.find("| 50/100 50%  loss=0.0196 █▁  ETA"), std::string::npos) << out;
  EXPECT_NE(out.find("| 50/100 50%  loss=0.6000 █▁  99 samples/s  ETA"), std::string::npos)
      << out;
  EXPECT_NE(out.find("| 100/100 100%  loss=0.0099 █▅▁"), std::string::npos) << out;
  EXPECT_NE(out.find("\x1b[K\ndemo-1 SUCCEEDED"), std::string::npos) << out;
  EXPECT_NE(out.find("█"), std::string::npos);
}

TEST_F(CommandsTest, WatchOfAFailedJobExitsOneWithTheError) {
  EXPECT_EQ(WatchCommand(ctx_, "fails-1"), kExitError);
  EXPECT_NE(out_.str().find("fails-1 FAILED after 1m00s at step 50/100\n"), std::string::npos)
      << out_.str();
  EXPECT_EQ(err_.str(),
            "substraxctl: job fails-1 FAILED: worker local-1 (host local-1) lease expired\n");
}

TEST_F(CommandsTest, WatchThatEndsEarlyOrFailsIsAnError) {
  EXPECT_EQ(WatchCommand(ctx_, "cut-1"), kExitError);
  EXPECT_NE(err_.str().find("ended the watch before job cut-1 ended (last state RUNNING)"),
            std::string::npos)
      << err_.str();
  err_.str("");
  EXPECT_EQ(WatchCommand(ctx_, "nope-1"), kExitError);
  EXPECT_EQ(err_.str(), "substraxctl: NOT_FOUND: job nope-1 not found\n");
}

TEST_F(CommandsTest, WatchJsonPrintsOneJobPerLine) {
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(WatchCommand(ctx_, "fails-1"), kExitError);
  const std::string out = out_.str();
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 5) << out;
  EXPECT_EQ(out.rfind("{\"id\":\"fails-1\"", 0), 0u) << out;
}

TEST_F(CommandsTest, SubmitWatchContinuesIntoTheWatch) {
  EXPECT_EQ(SubmitCommand(ctx_, WriteFile("good.yaml", GoodSpecYaml()), true), kExitOk);
  EXPECT_EQ(out_.str().rfind("demo-1\njob demo-1 PENDING", 0), 0u) << out_.str();
  EXPECT_NE(out_.str().find("test_accuracy=0.8812\n"), std::string::npos);
}

TEST_F(CommandsTest, WorkersAndMesh) {
  EXPECT_EQ(WorkersCommand(ctx_), kExitOk);
  EXPECT_EQ(out_.str(),
            "WORKER   HOST   STATE   DEVICES   COMMANDS   PYTHON ENVS   LAST HEARTBEAT   JOBS\n"
            "w-0      w-0    ALIVE   1 cpu     no         -             0.0s ago         -\n");
  out_.str("");
  EXPECT_EQ(MeshCommand(ctx_, "demo-1"), kExitOk);
  EXPECT_EQ(out_.str().rfind("mesh (data=2): 2 devices on 2 hosts (local-0, local-1)\n", 0), 0u)
      << out_.str();
  out_.str("");
  ctx_.format = OutputFormat::kYaml;
  EXPECT_EQ(WorkersCommand(ctx_), kExitOk);
  EXPECT_EQ(out_.str().rfind("workers:\n  - worker_id: w-0\n", 0), 0u) << out_.str();
}

TEST_F(CommandsTest, QueuesShowsQuotasUseAndPendingThenWhyTheFileWasNotLoaded) {
  EXPECT_EQ(QueuesCommand(ctx_), kExitOk) << err_.str();
  EXPECT_EQ(out_.str(),
            "QUEUE                COHORT   QUOTA    USED     BORROWED   PENDING         SHARE\n"
            "research (default)   lab      cpu 16   cpu 20   cpu 4      high 2, low 5   0.50\n"
            "vision               -        -        0        0          0               0.00\n"
            "Priority classes: high (1000), low (0, default)\n"
            "Policy: queues (priority, fair share, age; backfill, preemption)\n"
            "Configuration: /etc/substrax/queues.yaml\n"
            "The queues file was not loaded: queues[1].quotas[0].backend: unknown backend "
            "'tpu'; the configuration above stays\n");
  out_.str("");
  ctx_.format = OutputFormat::kJson;
  EXPECT_EQ(QueuesCommand(ctx_), kExitOk);
  EXPECT_THAT(out_.str(), HasSubstr("\"config_error\": \"queues[1].quotas[0].backend: unknown"));
}

TEST_F(CommandsTest, UnreachableCoordinatorExitsThreeNamingTheAddress) {
  server_->Shutdown();
  const std::string address = ctx_.coordinator;
  EXPECT_EQ(ListCommand(ctx_, ""), kExitUnreachable);
  EXPECT_EQ(err_.str().rfind("substraxctl: UNAVAILABLE: ", 0), 0u) << err_.str();
  EXPECT_NE(err_.str().find("cannot reach the coordinator at " + address +
                            "; start a local cluster with `substraxctl local up`"),
            std::string::npos)
      << err_.str();
  err_.str("");
  EXPECT_EQ(WatchCommand(ctx_, "demo-1"), kExitUnreachable);
  EXPECT_NE(err_.str().find("cannot reach the coordinator"), std::string::npos);
}

}  // namespace
}  // namespace substrax::ctl
