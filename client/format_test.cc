#include "client/format.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "google/protobuf/text_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax::ctl {
using ::testing::HasSubstr;
using ::testing::Not;
namespace {

template <typename T>
T Parse(const std::string& text) {
  T message;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &message)) << text;
  return message;
}

// 2024-05-01 12:00:00 UTC.
constexpr int64_t kT0 = 1714564800;

FormatOptions At(int64_t unix_seconds) {
  FormatOptions options;
  options.now = absl::FromUnixSeconds(unix_seconds);
  return options;
}

v1::Job RunningJob() {
  return Parse<v1::Job>(absl::StrCat(R"pb(
    id: "mnist-3" state: JOB_STATE_RUNNING attempt: 1
    spec { name: "mnist" model { type: MODEL_TYPE_MLP hidden_sizes: [ 512, 512 ] num_classes: 10 }
           optimizer { type: "adam" learning_rate: 0.001 }
           data { format: DATA_FORMAT_IDX } batch { global_batch_size: 256 } epochs: 3 }
    create_time { seconds: )pb", kT0, R"pb( }
    update_time { seconds: )pb", kT0 + 90, R"pb( }
    mesh { axis_names: "data" shape: 4
           devices { id: 0 host: "a" } devices { id: 1 host: "a" }
           devices { id: 2 host: "b" } devices { id: 3 host: "b" } }
    progress { step: 120 total_steps: 1000 samples_per_second: 1234.4
               metrics { key: "loss" value: 0.51234 } metrics { key: "accuracy" value: 0.81 }
               metrics { key: "step" value: 120 } }
    transitions { to: JOB_STATE_PENDING reason: "submitted" time { seconds: )pb", kT0, R"pb( } }
    transitions { from: JOB_STATE_PENDING to: JOB_STATE_RUNNING attempt: 1
                  reason: "scheduled on 4 devices of 2 workers" time { seconds: )pb", kT0 + 2,
                                     R"pb( } }
  )pb"));
}

TEST(TableTest, AlignsColumnsIgnoringColourAndUnicode) {
  Table table({"A", "LONG HEADER", "C"});
  table.AddRow({"xxxx", Cell("ok", kGreen), "z"});
  table.AddRow({"█▉", "", ""});
  EXPECT_EQ(table.Render(false),
            "A      LONG HEADER   C\n"
            "xxxx   ok            z\n"
            "█▉\n");
  // Colour wraps the cell but the padding after it is the same.
  EXPECT_EQ(table.Render(true),
            "A      LONG HEADER   C\n"
            "xxxx   \x1b[32mok\x1b[0m            z\n"
            "█▉\n");
  EXPECT_EQ(DisplayWidth("\x1b[32mok\x1b[0m"), 2u);
}

TEST(FormatTest, BytesWithThreeSignificantDigits) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1024), "1.00 KiB");
  EXPECT_EQ(FormatBytes(10240), "10.0 KiB");
  EXPECT_EQ(FormatBytes(802816), "784 KiB");
  EXPECT_EQ(FormatBytes(2143272), "2.04 MiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 40), "3.00 TiB");
}

TEST(FormatTest, DurationsAgesAndValues) {
  EXPECT_EQ(FormatShortDuration(absl::Seconds(42)), "42s");
  EXPECT_EQ(FormatShortDuration(absl::Seconds(185)), "3m05s");
  EXPECT_EQ(FormatShortDuration(absl::Seconds(3720)), "1h02m");
  EXPECT_EQ(FormatShortDuration(absl::Hours(51)), "2d03h");
  EXPECT_EQ(FormatShortDuration(-absl::Seconds(5)), "0s");
  EXPECT_EQ(FormatAge(absl::Seconds(95)), "95s");
  EXPECT_EQ(FormatAge(absl::Minutes(5)), "5m");
  EXPECT_EQ(FormatAge(absl::Hours(3)), "3h");
  EXPECT_EQ(FormatAge(absl::Hours(50)), "2d");
  EXPECT_EQ(FormatMetricValue(0.88123), "0.8812");
  EXPECT_EQ(FormatMetricValue(120), "120");
  EXPECT_EQ(FormatMetricValue(0.0000123), "1.23e-05");
  EXPECT_EQ(FormatMetricValue(12345.678), "12345.6780");
}

TEST(FormatTest, JobsTable) {
  v1::Job pending = Parse<v1::Job>(absl::StrCat(
      R"pb(id: "lin-1" state: JOB_STATE_PENDING spec { name: "lin" } queue: "research"
           create_time { seconds: )pb", kT0 + 280, " }"));
  EXPECT_EQ(FormatJobsTable({RunningJob(), pending}, At(kT0 + 300)),
            "ID        NAME    QUEUE      STATE     ATTEMPT   STEP       DEVICES   AGE\n"
            "mnist-3   mnist   -          RUNNING   1         120/1000   4         5m\n"
            "lin-1     lin     research   PENDING   0         -          -         20s\n");
}

TEST(FormatTest, JobDetailsShowEveryPart) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_FAILED);
  job.set_error("worker local-1 (host b) lease expired");
  (*job.mutable_progress()->mutable_final_metrics())["test_accuracy"] = 0.8812;
  EXPECT_EQ(FormatJobDetails(job, At(kT0 + 300)),
            "ID:       mnist-3\n"
            "Name:     mnist\n"
            "State:    FAILED\n"
            "Attempt:  1\n"
            "Created:  2024-05-01 12:00:00 (5m ago)\n"
            "Updated:  2024-05-01 12:01:30 (3m ago)\n"
            "Spec:     mlp [512, 512], adam lr=0.0010, idx data, batch 256, 3 epochs\n"
            "Mesh:     (data=4) on 4 devices of 2 hosts (a, b)\n"
            "Progress: step 120/1000 (12.0%), 1234 samples/s\n"
            "Metrics:  loss=0.5123  accuracy=0.8100\n"
            "Final:    test_accuracy=0.8812\n"
            "Error:    worker local-1 (host b) lease expired\n"
            "Transitions:\n"
            "  TIME                  FROM      TO        ATTEMPT   REASON\n"
            "  2024-05-01 12:00:00   -         PENDING   0         submitted\n"
            "  2024-05-01 12:00:02   PENDING   RUNNING   1         scheduled on 4 devices of 2 "
            "workers\n");
}

TEST(FormatTest, JobDetailsShowTheQueueAPreemptionInProgressAndTheWorkLost) {
  v1::Job job = RunningJob();
  job.set_queue("research");
  job.set_priority_class("high");
  job.set_priority(1000);
  v1::JobPreemption* p = job.mutable_preemption();
  p->set_for_job("big-7");
  p->set_reason("priority urgent (2000) over high (1000) in queue research");
  p->mutable_requested_time()->set_seconds(kT0 + 200);
  p->mutable_deadline_time()->set_seconds(kT0 + 230);
  job.set_preemptions(2);
  job.set_work_lost_device_seconds(5400);
  v1::Straggler* s = job.add_stragglers();
  s->set_device_id(3);
  s->set_process_index(1);
  s->set_host("b");
  s->set_phase("compute");
  s->set_ratio(1.8);
  s->set_since_step(400);
  const std::string details = FormatJobDetails(job, At(kT0 + 300));
  EXPECT_THAT(details, HasSubstr("Attempt:  1\n"
                                 "Queue:    research, priority high (1000)\n"
                                 "Preempt:  preempting for job big-7 since 12:03:20: priority "
                                 "urgent (2000) over high (1000) in queue research (stopped by "
                                 "force at 12:03:50)\n"
                                 "Preempts: 2, work lost: 1.50 device-hours\n"
                                 "Slow:     device 3 (process 1, host b): compute 1.80x the "
                                 "others since step 400 (a straggler)\n"));
  // A job never preempted, of a coordinator before queues: none of these lines.
  const std::string plain = FormatJobDetails(RunningJob(), At(kT0 + 300));
  EXPECT_THAT(plain, Not(HasSubstr("Queue:")));
  EXPECT_THAT(plain, Not(HasSubstr("Preempt")));
}

TEST(FormatTest, DiagnosisOfAStalledJob) {
  const v1::DiagnoseJobResponse r = Parse<v1::DiagnoseJobResponse>(absl::StrCat(R"pb(
    job {
      id: "hangs-1" state: JOB_STATE_RUNNING attempt: 1
      progress { step: 29 total_steps: 100 }
      stragglers { device_id: 3 process_index: 1 host: "b" phase: "compute" ratio: 1.84
                   since_step: 12 }
      transitions { to: JOB_STATE_RUNNING reason: "started on 2 workers" }
      transitions { to: JOB_STATE_RUNNING time { seconds: )pb", kT0, R"pb( }
                    reason: "straggler: device 3 (process 1, worker w-2 (host b)): its compute time is 1.84x" }
    }
    processes { process_index: 0 worker_id: "w-1" host: "a" device_ids: [ 0, 1 ] last_step: 29
      activity {
        devices { device_id: 0 step: 29 phase: "collective" since { seconds: )pb", kT0, R"pb( } }
        collectives { group: "world" device_id: 0 rank: 0 size: 4 entered: 146 completed: 145
                      last_kind: "all_reduce" last_count: 676 }
      }
    }
    processes { process_index: 1 worker_id: "w-2" host: "b" device_ids: [ 2, 3 ] last_step: 29
                suspended: true }
    since_last_step { seconds: 42 }
    waiting_for: "all_reduce #146 over world entered by 2 of 4 ranks; rank 2 has not entered it"
  )pb"));
  const std::string out = FormatDiagnosis(r, At(kT0 + 60));
  EXPECT_THAT(out, HasSubstr("Job:      hangs-1 RUNNING, attempt 1, step 29 of 100\n"));
  EXPECT_THAT(out, HasSubstr("Progress: last step 42s ago\n"));
  EXPECT_THAT(out, HasSubstr("Waiting:  all_reduce #146 over world entered by 2 of 4 ranks; "
                             "rank 2 has not entered it (a snapshot"));
  EXPECT_THAT(out, HasSubstr("Slow:     device 3 (process 1, host b): compute 1.84x the others "
                             "since step 12\n"));
  EXPECT_THAT(out, HasSubstr("  PROCESS   WORKER   HOST   DEVICES   STEP   STATE\n"));
  EXPECT_THAT(out, HasSubstr("  1         w-2      b      2,3       29     stopped by a signal, "
                             "nothing relayed\n"));
  EXPECT_THAT(out, HasSubstr("  0        0         29     collective   12:00:00\n"));
  EXPECT_THAT(out, HasSubstr("  world   0        0/4    146       145         all_reduce of 676\n"));
  EXPECT_THAT(out, HasSubstr("History (hangs and stragglers):\n  2024-05-01 12:00:00  straggler: "
                             "device 3"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("started on 2 workers")));

  // An ended job: its error, no processes.
  v1::DiagnoseJobResponse ended;
  ended.mutable_job()->set_id("hangs-1");
  ended.mutable_job()->set_state(v1::JOB_STATE_FAILED);
  ended.mutable_job()->set_error("stalled at step 29: desync over world");
  const std::string done = FormatDiagnosis(ended, At(kT0));
  EXPECT_THAT(done, HasSubstr("Error:    stalled at step 29: desync over world\n"));
  EXPECT_THAT(done, HasSubstr("Slow:     no straggler\n"));
  EXPECT_THAT(done, ::testing::Not(HasSubstr("Waiting:")));
  EXPECT_THAT(done, ::testing::Not(HasSubstr("Processes:")));
  EXPECT_THAT(done, HasSubstr("History (hangs and stragglers):\n  none\n"));
}

TEST(FormatTest, QueuesTableThenClassesPolicyAndSource) {
  v1::ListQueuesResponse r = Parse<v1::ListQueuesResponse>(R"pb(
    policy: SCHEDULING_POLICY_QUEUES
    queues {
      name: "research"
      cohort: "lab"
      devices { backend: "cpu" quota: 16 used: 20 borrowed: 4 }
      devices { backend: "cuda" quota: 8 used: 0 }
      pending { key: "low" value: 5 }
      pending { key: "high" value: 2 }
      fair_share: 0.25
    }
    queues { name: "vision" devices { backend: "cuda" quota: 8 used: 8 } }
    default_queue: "research"
    priority_classes { name: "high" value: 1000 }
    priority_classes { name: "low" value: 0 }
    default_priority_class: "low"
    config_source: "/etc/substrax/queues.yaml"
    config_load_time { seconds: 1714564800 }
  )pb");
  EXPECT_EQ(FormatQueues(r, At(kT0 + 300)),
            "QUEUE                COHORT   QUOTA            USED     BORROWED   PENDING         "
            "SHARE\n"
            "research (default)   lab      cpu 16, cuda 8   cpu 20   cpu 4      high 2, low 5   "
            "0.25\n"
            "vision               -        cuda 8           cuda 8   0          0               "
            "0.00\n"
            "Priority classes: high (1000), low (0, default)\n"
            "Policy: queues (priority, fair share, age; backfill, preemption)\n"
            "Configuration: /etc/substrax/queues.yaml, loaded 2024-05-01 12:00:00 (5m ago)\n");
  r.set_config_error("queues[1].quotas[0].backend: unknown backend 'tpu'");
  EXPECT_THAT(FormatQueues(r, At(kT0 + 300)),
              HasSubstr("\nThe queues file was not loaded: queues[1].quotas[0].backend: unknown "
                        "backend 'tpu'; the configuration above stays\n"));
}

TEST(FormatTest, AProgramJobShowsItsProgramInsteadOfAModel) {
  v1::Job job = RunningJob();
  v1::JobSpec& spec = *job.mutable_spec();
  spec.clear_model();
  spec.clear_optimizer();
  spec.clear_data();
  spec.mutable_program()->set_path("/opt/p/train");
  spec.mutable_program()->add_args("--lr");
  spec.mutable_program()->add_args("0.1");
  spec.mutable_program()->add_args("two words");
  const std::string details = FormatJobDetails(job, At(kT0 + 300));
  EXPECT_THAT(details, HasSubstr("Program:  /opt/p/train --lr 0.1 'two words'\n"
                                 "Spec:     batch 256, 3 epochs\n"));
  EXPECT_THAT(details, Not(HasSubstr("mlp")));
}

TEST(FormatTest, ACommandJobShowsItsCommandAndWhetherItReported) {
  v1::Job job = RunningJob();
  v1::JobSpec& spec = *job.mutable_spec();
  spec.clear_model();
  spec.clear_optimizer();
  spec.clear_data();
  v1::CommandSpec& command = *spec.mutable_command();
  for (const char* arg : {"python", "train.py", "--name", "two words"}) command.add_argv(arg);
  command.set_python_env("jax");
  job.mutable_progress()->Clear();
  job.mutable_progress()->set_total_steps(1000);
  std::string details = FormatJobDetails(job, At(kT0 + 300));
  EXPECT_THAT(details, HasSubstr("Command:  python train.py --name 'two words' (python_env jax, "
                                 "per_worker)\n"
                                 "Spec:     batch 256, 3 epochs\n"));
  EXPECT_THAT(details, HasSubstr("Progress: no report yet: the command reports through "
                                 "$SUBSTRAX_REPORT_FILE (docs/command-jobs.md)\n"));
  // Once a step is in, or when the job is not running, the usual progress.
  job.mutable_progress()->set_step(5);
  EXPECT_THAT(FormatJobDetails(job, At(kT0 + 300)), HasSubstr("Progress: step 5/1000 (0.5%)\n"));
  job.mutable_progress()->set_step(0);
  job.set_state(v1::JOB_STATE_PENDING);
  EXPECT_THAT(FormatJobDetails(job, At(kT0 + 300)), Not(HasSubstr("no report yet")));
}

TEST(FormatTest, OutcomeHasFinalMetricsOneALine) {
  v1::Job job = RunningJob();
  job.set_state(v1::JOB_STATE_SUCCEEDED);
  job.mutable_progress()->set_step(1000);
  (*job.mutable_progress()->mutable_final_metrics())["test_accuracy"] = 0.88123;
  (*job.mutable_progress()->mutable_final_metrics())["test_loss"] = 0.331;
  EXPECT_EQ(FormatJobOutcome(job),
            "mnist-3 SUCCEEDED after 1m30s at step 1000/1000\n"
            "test_accuracy=0.8812\n"
            "test_loss=0.3310\n");
}

TEST(FormatTest, WorkersTable) {
  auto workers = Parse<v1::ListWorkersResponse>(R"pb(
    workers { worker_id: "local-0" host: "local-0" state: WORKER_STATE_ALIVE
              seconds_since_heartbeat: 0.43 job_ids: [ "mnist-3", "lin-1" ]
              runs_commands: true python_envs: [ "jax", "torch" ]
              devices { kind: DEVICE_KIND_CPU name: "cpu" } devices { kind: DEVICE_KIND_CPU } }
    workers { worker_id: "gpu-7" host: "gpu-7" state: WORKER_STATE_DEAD
              seconds_since_heartbeat: 300
              devices { kind: DEVICE_KIND_CUDA name: "NVIDIA H200" } }
  )pb");
  EXPECT_EQ(FormatWorkersTable(workers, At(kT0)),
            "WORKER    HOST      STATE   DEVICES         COMMANDS   PYTHON ENVS   LAST HEARTBEAT   "
            "JOBS\n"
            "local-0   local-0   ALIVE   2 cpu           yes        jax,torch     0.4s ago         "
            "mnist-3,lin-1\n"
            "gpu-7     gpu-7     DEAD    1 NVIDIA H200   no         -             5m ago           "
            "-\n");
}

TEST(FormatTest, MetricsTableHasAColumnPerSeriesAndDashesForGaps) {
  auto response = Parse<v1::QueryMetricsResponse>(R"pb(
    series { name: "loss" points { step: 50 value: 0.9 } points { step: 100 value: 0.5 } }
    series { name: "loss" group: "host-a" points { step: 100 value: 0.45 } }
    series { name: "step" points { step: 50 value: 50 } points { step: 100 value: 100 } }
  )pb");
  EXPECT_EQ(FormatMetricsTable(response),
            "STEP   loss     loss/host-a   step\n"
            "50     0.9000   -             50\n"
            "100    0.5000   0.4500        100\n");
}

TEST(FormatTest, MetricsTableMarksPartialSteps) {
  // Step 20 has 2 of the 4 devices (the mean of host a's, not the job's); older servers send
  // no counts and nothing is marked.
  auto response = Parse<v1::QueryMetricsResponse>(R"pb(
    series { name: "loss"
             points { step: 10 value: 0.5 num_values: 4 expected_values: 4 }
             points { step: 20 value: 0.3836 num_values: 2 expected_values: 4 partial: true }
             points { step: 30 value: 0.3 num_values: 1 } }
    series { name: "step"
             points { step: 10 value: 10 num_values: 4 expected_values: 4 }
             points { step: 20 value: 20 num_values: 2 expected_values: 4 partial: true } }
  )pb");
  EXPECT_EQ(FormatMetricsTable(response),
            "STEP   loss     step   NOTE\n"
            "10     0.5000   10\n"
            "20     0.3836   20     partial (2/4 devices)\n"
            "30     0.3000   -\n");
  // Columns whose counts differ are named.
  response = Parse<v1::QueryMetricsResponse>(R"pb(
    series { name: "loss" group: "a"
             points { step: 20 value: 0.4 num_values: 1 expected_values: 2 partial: true } }
    series { name: "loss" group: "b"
             points { step: 20 value: 0.35 num_values: 2 expected_values: 3 partial: true } }
  )pb");
  EXPECT_EQ(FormatMetricsTable(response),
            "STEP   loss/a   loss/b   NOTE\n"
            "20     0.4000   0.3500   partial (loss/a 1/2, loss/b 2/3 devices)\n");
}

TEST(FormatTest, MeshShowsTheGridWithHostsAndTheLayouts) {
  auto response = Parse<v1::GetMeshResponse>(R"pb(
    mesh { axis_names: "data" shape: 2
           devices { id: 0 host: "a" worker_id: "w" local_index: 0 kind: DEVICE_KIND_CPU }
           devices { id: 1 host: "b" worker_id: "v" local_index: 0 kind: DEVICE_KIND_CPU } }
    layouts { key: "batch" value {
      global_shape: [ 256, 784 ] spec { dims { axes: "data" } } num_replicas: 1
      shards { device_id: 0 index { start: 0 limit: 128 } index { start: 0 limit: 784 } }
      shards { device_id: 1 index { start: 128 limit: 256 } index { start: 0 limit: 784 } } } }
  )pb");
  const std::string out = FormatMeshDetails(response);
  EXPECT_EQ(out.rfind("mesh (data=2): 2 devices on 2 hosts (a, b)\n", 0), 0u) << out;
  EXPECT_NE(out.find("d0 a/"), std::string::npos) << out;
  EXPECT_NE(out.find("d1 b/"), std::string::npos) << out;
  EXPECT_NE(out.find("layouts:\n"
                     "  ARRAY   GLOBAL SHAPE   SPEC        REPLICAS   SHARD SHAPE\n"
                     "  batch   (256, 784)     ('data',)   1          (128, 784)\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("batch:\n"
                     "  DEVICE   SLICE              REPLICA\n"
                     "  d0       [0:128, 0:784]     0\n"
                     "  d1       [128:256, 0:784]   0\n"),
            std::string::npos)
      << out;
}

TEST(FormatTest, JsonUsesProtoNamesEnumNamesAndZeroValues) {
  v1::Job job;
  job.set_id("x-1");
  job.set_state(v1::JOB_STATE_PENDING);
  const std::string json = ToJson(job);
  EXPECT_NE(json.find("\"id\": \"x-1\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"state\": \"JOB_STATE_PENDING\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"attempt\": 0"), std::string::npos) << json;
  EXPECT_EQ(json.back(), '\n');
  EXPECT_EQ(ToJsonLine(job).find('\n'), ToJsonLine(job).size() - 1);
}

TEST(FormatTest, CheckpointsAreListedAndTheJobSaysWhereItResumedFrom) {
  const v1::Job job = Parse<v1::Job>(R"pb(
    id: "mlp-3" attempt: 2 resumed_from_step: 300
    checkpoints { step: 400 path: "/ckpt/mlp/step-000000000400" size_bytes: 2097152
                  mesh: "(data=2, model=2)" time { seconds: 1700000000 } }
    checkpoints { step: 300 path: "/ckpt/mlp/step-000000000300" size_bytes: 2097152
                  mesh: "(data=4)" }
  )pb");
  FormatOptions options;
  options.zone = absl::UTCTimeZone();
  const std::string table = FormatCheckpointsTable(job, options);
  EXPECT_THAT(table, HasSubstr("STEP"));
  EXPECT_THAT(table, HasSubstr("400"));
  EXPECT_THAT(table, HasSubstr("(data=2, model=2)"));
  EXPECT_THAT(table, HasSubstr("/ckpt/mlp/step-000000000300"));
  EXPECT_LT(table.find("step-000000000400"), table.find("step-000000000300"));
  const std::string details = FormatJobDetails(job, options);
  EXPECT_THAT(details, HasSubstr("attempt 2 from the checkpoint of step 300"));
  EXPECT_THAT(details, HasSubstr("Saved:    checkpoint of step 400 (/ckpt/mlp/step-000000000400); 2 kept"));
}

TEST(FormatTest, YamlIsBlockStyleAndKeepsStringsStrings) {
  v1::ListWorkersResponse workers = Parse<v1::ListWorkersResponse>(R"pb(
    workers { worker_id: "true" host: "h: 1" seconds_since_heartbeat: 1.5 job_ids: "j-1"
              devices { id: 3 } }
  )pb");
  EXPECT_EQ(FormatMessage(workers, OutputFormat::kYaml),
            "workers:\n"
            "  - worker_id: \"true\"\n"
            "    host: \"h: 1\"\n"
            "    address: \"\"\n"
            "    incarnation: \"\"\n"
            "    state: WORKER_STATE_UNSPECIFIED\n"
            "    devices:\n"
            "      - id: 3\n"
            "        host: \"\"\n"
            "        worker_id: \"\"\n"
            "        local_index: 0\n"
            "        kind: DEVICE_KIND_UNSPECIFIED\n"
            "        name: \"\"\n"
            "        memory_bytes: 0\n"
            "        pci_bus_id: \"\"\n"
            "    seconds_since_heartbeat: 1.5\n"
            "    job_ids:\n"
            "      - j-1\n"
            "    data_roots: []\n"
            "    checkpoint_roots: []\n"
            "    programs_dirs: []\n"
            "    python_envs: []\n"
            "    runs_commands: false\n");
  EXPECT_EQ(FormatMessage(v1::ListJobsResponse(), OutputFormat::kYaml),
            "jobs: []\nnext_page_token: \"\"\n");
}

}  // namespace
}  // namespace substrax::ctl
