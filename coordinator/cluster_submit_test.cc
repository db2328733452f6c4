// Tests of Cluster: the submit policy: refused specs, data paths under a worker's data root,
// program jobs.
#include "coordinator/cluster.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coordinator/cluster_test_util.h"
#include "coordinator/state_store.h"
#include "core/job_spec_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

TEST_F(ClusterTest, SubmitRefusesWhatTheAliveWorkersCouldNeverHold) {
  options_.refuse_jobs_that_cannot_fit = true;
  cluster_ = MakeCluster(state_);
  auto nobody = cluster_->SubmitJob(Spec("early", 2));
  EXPECT_EQ(nobody.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(nobody.status().message(), HasSubstr("the cluster has 0 alive workers"));
  RegisterTwoWorkers();
  auto huge = cluster_->SubmitJob(Spec("huge", 8));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(),
              HasSubstr("spec.mesh: data-parallel mesh of 8 devices, but only 4 are available"));
  EXPECT_THAT(huge.status().message(), HasSubstr("the cluster has 2 alive workers"));
  v1::JobSpec checkpointed = Spec("checkpointed", 2);
  checkpointed.mutable_checkpoint()->set_directory("/tmp/ckpt");
  checkpointed.mutable_checkpoint()->set_every_steps(5);
  // No worker offers a checkpoint root.
  EXPECT_EQ(cluster_->SubmitJob(checkpointed).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster_->SubmitJob(checkpointed).status().message(),
              HasSubstr("spec.checkpoint.directory: '/tmp/ckpt' is not under a checkpoint root: "
                        "no worker has reported any checkpoint root"));
  EXPECT_THAT(cluster_->ListJobs({}), IsEmpty());
  // Fits, though busy: admitted, and waits.
  EXPECT_EQ(Get(Submit(Spec("first", 4))).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(Submit(Spec("second", 4))).state(), v1::JOB_STATE_PENDING);
}

TEST_F(ClusterTest, CheckpointsBelongToTheirOwner) {
  Register("w-1", "a", 2, "inc-1", {}, {"/ckpt"});
  v1::JobSpec spec = Spec("owned", 2);
  spec.mutable_checkpoint()->set_directory("/ckpt/alice/run");
  absl::StatusOr<v1::Job> alices = cluster_->SubmitJob(spec, "alice");
  ASSERT_TRUE(alices.ok()) << alices.status();
  EXPECT_EQ(alices->checkpoint_owner_directory(), "alice");
  // Its attempt's assignment carries the owner's directory: the agent narrows the roots to it.
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-1");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].start().checkpoint_owner_directory(), "alice");
  ASSERT_TRUE(cluster_->CancelJob(alices->id(), "test").ok());

  // Another submitter may neither write into alice's directory nor resume from it.
  absl::StatusOr<v1::Job> bobs = cluster_->SubmitJob(spec, "bob");
  EXPECT_EQ(bobs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bobs.status().message(),
              HasSubstr("spec.checkpoint.directory: '/ckpt/alice/run' is not in the submitter's "
                        "own directory: a job writes and resumes checkpoints only under "
                        "/ckpt/bob"));
  spec.mutable_checkpoint()->set_directory("/ckpt/bob/run");
  spec.set_resume_from("/ckpt/alice/run");
  bobs = cluster_->SubmitJob(spec, "bob");
  EXPECT_EQ(bobs.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bobs.status().message(), HasSubstr("spec.resume_from: '/ckpt/alice/run'"));
  EXPECT_THAT(bobs.status().message(), Not(HasSubstr("spec.checkpoint.directory")));
  // A name that is no safe directory name gets its escaped form.
  absl::StatusOr<v1::Job> dotted = cluster_->SubmitJob(spec, "..");
  EXPECT_THAT(dotted.status().message(), HasSubstr("only under /ckpt/%2E."));
  EXPECT_EQ(cluster_->SubmitJob(spec, std::string(200, '/')).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An admin may name any path under the roots; its job is bound to none.
  absl::StatusOr<v1::Job> admins = cluster_->SubmitJob(spec, "root", /*admin=*/true);
  ASSERT_TRUE(admins.ok()) << admins.status();
  EXPECT_EQ(admins->checkpoint_owner_directory(), "");
  // Only what was admitted was kept.
  EXPECT_EQ(cluster_->ListJobs({}).size(), 2u);
}

TEST_F(ClusterTest, BadSpecIsRejectedWithTheFieldAndTheClusterStillWorks) {
  Register("w-1", "a", 2);
  v1::JobSpec bad = Spec("bad", 2);
  bad.mutable_mesh()->set_data_parallel_size(0);
  bad.mutable_optimizer()->set_learning_rate(-1);
  auto rejected = cluster_->SubmitJob(bad);
  EXPECT_EQ(rejected.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rejected.status().message(), HasSubstr("spec.optimizer.learning_rate"));
  EXPECT_THAT(cluster_->ListJobs({}), IsEmpty());
  const std::string good = Submit(Spec("good", 2));
  EXPECT_EQ(good, "good-1");
  EXPECT_EQ(Get(good).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(ClusterTest, DataPathsMustLieUnderAKnownWorkersDataRoot) {
  v1::JobSpec spec = Spec("files", 2);
  spec.mutable_data()->clear_synthetic();
  spec.mutable_data()->set_format(v1::DATA_FORMAT_CSV);
  spec.mutable_data()->mutable_csv()->set_label_column("y");
  spec.mutable_data()->mutable_train()->set_path("/proc/self/environ");
  spec.set_epochs(1);
  Register("w-1", "a", 2);
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.data.train.path: '/proc/self/environ' is not under a data root: no "
                        "worker has reported any data root"));

  Register("w-2", "b", 2, "inc-1", {"/data/sets", "/srv"});
  refused = cluster_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("'/proc/self/environ' is not under a data root of any worker (/data/sets, "
                        "/srv)"));
  for (const char* bad : {"/data/sets/../../etc/passwd", "/data/setsx/a.csv", "sets/a.csv",
                          "/data/sets//a.csv"}) {
    spec.mutable_data()->mutable_train()->set_path(bad);
    refused = cluster_->SubmitJob(spec);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("spec.data.train.path")) << bad;
  }
  spec.mutable_data()->mutable_train()->set_path("/data/sets/iris.csv");
  EXPECT_TRUE(cluster_->SubmitJob(spec).ok());

  // The roots are kept with the worker: after a coordinator restart, and while it is dead (a
  // job then waits for workers instead of being refused for its mesh).
  cluster_.reset();
  options_.refuse_jobs_that_cannot_fit = false;
  cluster_ = MakeCluster(state_);
  const std::vector<v1::Worker> workers = cluster_->ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[1].data_roots_size(), 2);
  EXPECT_EQ(workers[1].data_roots(0), "/data/sets");
  now_ += absl::Minutes(1);
  cluster_->Tick();
  ASSERT_EQ(cluster_->ListWorkers()[1].state(), v1::WORKER_STATE_DEAD);
  EXPECT_TRUE(cluster_->SubmitJob(spec).ok());
}

// A program job (spec.program) of `dp` data-parallel devices; `batch` 0: none.
v1::JobSpec ProgramSpec(const std::string& name, int dp, const std::string& path,
                        int batch = 0) {
  testing::JobSpecBuilder spec(name);
  spec.Program(absl::StrCat("{path: ", path, ", args: [--fast]}")).DataParallel(dp);
  if (batch > 0) spec.Batch(absl::StrCat("{global_batch_size: ", batch, "}"));
  return spec.Proto();
}

// A command job (spec.command is `command`) of `dp` data-parallel devices.
v1::JobSpec CommandSpec(const std::string& name, int dp, const std::string& command) {
  return testing::JobSpecBuilder(name).Command(command).DataParallel(dp).Proto();
}

// Registers a worker of `num_devices` devices of `kind` with `programs_dirs`, running command
// jobs when `runs_commands`, from the Python environments `python_envs`.
absl::StatusOr<v1::RegisterWorkerResponse> RegisterWithPrograms(
    Cluster& cluster, const std::string& worker_id, const std::string& host, int num_devices,
    v1::DeviceKind kind, const std::vector<std::string>& programs_dirs,
    bool runs_commands = false, const std::vector<std::string>& python_envs = {}) {
  v1::RegisterWorkerRequest request;
  request.set_worker_id(worker_id);
  request.set_host(host);
  request.set_incarnation("inc-1");
  request.set_address(host + ":7000");
  for (const std::string& dir : programs_dirs) request.add_programs_dirs(dir);
  request.set_runs_commands(runs_commands);
  for (const std::string& env : python_envs) request.add_python_envs(env);
  for (int i = 0; i < num_devices; ++i) {
    v1::Device* d = request.add_devices();
    d->set_local_index(i);
    d->set_kind(kind);
    d->set_name(kind == v1::DEVICE_KIND_CUDA ? "NVIDIA H200" : "cpu");
  }
  return cluster.RegisterWorker(request);
}

TEST_F(ClusterTest, ProgramPathsMustLieUnderAKnownWorkersProgramsDir) {
  const v1::JobSpec spec = ProgramSpec("prog", 2, "/opt/p/train");
  // Like data and checkpoint roots: with no worker reporting one, every program is refused.
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.program.path: '/opt/p/train' is not under a programs dir: no "
                        "worker has reported any programs dir (start the worker daemons with "
                        "--programs-dir DIR)"));
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CPU,
                                   {"/opt/p", "/srv/bin"})
                  .ok());
  Register("w-2", "b", 2);
  refused = cluster_->SubmitJob(ProgramSpec("prog", 2, "/opt/px/train"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.program.path: '/opt/px/train' is not under a programs dir of any "
                        "worker (/opt/p, /srv/bin); use a directory there or start a worker "
                        "with --programs-dir"));
  const std::string id = Submit(spec);
  ASSERT_FALSE(id.empty());
  // Scheduled without a model: the assignment carries the program and no layout (no batch).
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-1");
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].has_start());
  EXPECT_EQ(events[0].start().spec().program().path(), "/opt/p/train");
  EXPECT_TRUE(events[0].start().layouts().empty());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(id).progress().total_steps(), 0);  // the runners say it
  absl::StatusOr<v1::GetMeshResponse> mesh = cluster_->GetMesh(id);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  EXPECT_TRUE(mesh->layouts().empty());

  // Kept with the worker, reported by ListWorkers, and across a coordinator restart.
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  const std::vector<v1::Worker> workers = cluster_->ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_THAT(workers[0].programs_dirs(), ::testing::ElementsAre("/opt/p", "/srv/bin"));
  EXPECT_TRUE(workers[1].programs_dirs().empty());
}

TEST_F(ClusterTest, ProgramJobsRunOnCpuDevicesOnlyWithTheirBatchLayout) {
  ASSERT_TRUE(
      RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CUDA, {"/opt/p"}).ok());
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-2", "b", 2, v1::DEVICE_KIND_CPU, {"/opt/p"}).ok());
  // backend auto: a built-in job would take the GPUs; a program job takes the CPU devices.
  const std::string id = Submit(ProgramSpec("prog", 2, "/opt/p/train", /*batch=*/8));
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(Poll("w-1").empty());
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-2");
  ASSERT_EQ(events.size(), 1u);
  ASSERT_TRUE(events[0].has_start());
  const v1::Assignment& a = events[0].start();
  for (const v1::Device& d : a.mesh().devices()) EXPECT_EQ(d.kind(), v1::DEVICE_KIND_CPU);
  ASSERT_EQ(a.layouts().count("batch/inputs"), 1u);
  EXPECT_EQ(a.spec().batch().per_device_batch_size(), 4);

  // A program job larger than the CPU devices is refused when refusing is on, though GPUs idle.
  cluster_.reset();
  options_.refuse_jobs_that_cannot_fit = true;
  cluster_ = MakeCluster(state_);
  ASSERT_TRUE(
      RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CUDA, {"/opt/p"}).ok());
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-2", "b", 2, v1::DEVICE_KIND_CPU, {"/opt/p"}).ok());
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(ProgramSpec("big", 4, "/opt/p/train"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
}

TEST_F(ClusterTest, RegistrationRefusesProgramsDirsThatAreNotNormalizedAbsolutePaths) {
  for (const char* bad : {"bin", "/opt/p/", "/opt/../p", ""}) {
    absl::StatusOr<v1::RegisterWorkerResponse> response =
        RegisterWithPrograms(*cluster_, "w-1", "a", 1, v1::DEVICE_KIND_CPU, {bad});
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(response.status().message(), HasSubstr("worker w-1: programs_dirs[0]")) << bad;
  }
}

TEST_F(ClusterTest, CommandsRunFromAProgramsDirOrARegisteredPythonEnvironment) {
  const v1::JobSpec script = CommandSpec("cmd", 2, "{argv: [/opt/p/train.sh, --fast]}");
  // As for programs: with no worker reporting a programs dir, every command path is refused.
  absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(script);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.command.argv[0]: '/opt/p/train.sh' is not under a programs dir: no "
                        "worker has reported any programs dir"));
  const v1::JobSpec jax = CommandSpec("cmd", 2, "{argv: [python, train.py], python_env: jax}");
  refused = cluster_->SubmitJob(jax);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.command.python_env: no worker has a Python environment named "
                        "'jax' (no worker has registered any); use one of theirs or start a "
                        "worker daemon with --python-env jax=DIR"));

  // Known environments, but no worker that runs commands: the daemons must be set up first.
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CPU, {"/opt/p"},
                                   /*runs_commands=*/false, {"jax", "torch"})
                  .ok());
  refused = cluster_->SubmitJob(script);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.command: no worker runs command jobs"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--job-user USER"));
  EXPECT_THAT(refused.status().message(), HasSubstr("--allow-command-jobs"));
  refused = cluster_->SubmitJob(CommandSpec("cmd", 2, "{argv: [/opt/px/train.sh]}"));
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.command.argv[0]: '/opt/px/train.sh' is not under a programs dir of "
                        "any worker (/opt/p)"));

  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-2", "b", 2, v1::DEVICE_KIND_CPU, {},
                                   /*runs_commands=*/true, {"torch", "venv-2"})
                  .ok());
  refused = cluster_->SubmitJob(CommandSpec("cmd", 2, "{argv: [python], python_env: flax}"));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("spec.command.python_env: no worker has a Python environment named "
                        "'flax' (they have jax, torch, venv-2)"));
  // An environment's argv[0] is looked up by the agent in its bin/, not under a programs dir.
  // Admitted, but only w-1 has jax, and it runs no commands: the job waits for a worker that
  // can run it, and does not block younger jobs.
  const std::string waiting = Submit(jax);
  ASSERT_FALSE(waiting.empty());
  EXPECT_EQ(Get(waiting).state(), v1::JOB_STATE_PENDING);
  EXPECT_THAT(Get(waiting).transitions().rbegin()->reason(),
              HasSubstr("on a worker that runs command jobs and has Python environment jax: no "
                        "alive worker has any"));
  const std::string id = Submit(CommandSpec("cmd", 2, "{argv: [python], python_env: torch}"));
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(Get(id).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Get(id).spec().command().python_env(), "torch");
  EXPECT_EQ(Get(id).spec().command().processes(), v1::COMMAND_PROCESSES_PER_WORKER);
  EXPECT_TRUE(Poll("w-1").empty());
  std::vector<v1::WatchAssignmentsResponse> events = Poll("w-2");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].start().spec().command().argv(0), "python");

  // Kept with the worker, reported by ListWorkers, and across a coordinator restart.
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  const std::vector<v1::Worker> workers = cluster_->ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_THAT(workers[0].python_envs(), ElementsAre("jax", "torch"));
  EXPECT_FALSE(workers[0].runs_commands());
  EXPECT_THAT(workers[1].python_envs(), ElementsAre("torch", "venv-2"));
  EXPECT_TRUE(workers[1].runs_commands());
}

TEST_F(ClusterTest, RegistrationRefusesPythonEnvironmentsThatAreNotPlainNames) {
  for (const char* bad : {"a/b", "..", "", "my env"}) {
    absl::StatusOr<v1::RegisterWorkerResponse> response = RegisterWithPrograms(
        *cluster_, "w-1", "a", 1, v1::DEVICE_KIND_CPU, {}, true, {"ok", bad});
    EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(response.status().message(), HasSubstr("worker w-1: python_envs[1]: ")) << bad;
  }
}

TEST_F(ClusterTest, JobIdsAreNotReusedAfterADeleteAndARestart) {
  Register("w-1", "a", 2);
  const std::string first = Submit(Spec("again", 2));
  ASSERT_EQ(first, "again-1");
  ASSERT_TRUE(cluster_->CancelJob(first, "").ok());
  ASSERT_TRUE(cluster_->DeleteJob(first).ok());
  // No job is left to derive the counter from: it is stored on its own.
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  EXPECT_EQ(Submit(Spec("again", 2)), "again-2");
}

TEST_F(ClusterTest, ARequestIdMakesTheSubmitIdempotentPerOwner) {
  Register("w-1", "a", 2);
  absl::StatusOr<v1::Job> made = cluster_->SubmitJob(Spec("once", 2), "alice", false, "req-1");
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ(made->request_id(), "req-1");
  // A retry (the answer was lost): the same job, as it is now, and no second one.
  absl::StatusOr<v1::Job> again = cluster_->SubmitJob(Spec("once", 2), "alice", false, "req-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), made->id());
  EXPECT_EQ(again->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(cluster_->ListJobs({}).size(), 1u);
  // The same request id with another spec names the job it made.
  absl::StatusOr<v1::Job> changed = cluster_->SubmitJob(Spec("once", 1), "alice", false, "req-1");
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(changed.status().message(),
              HasSubstr("request id req-1 already made job once-1 from another spec"));
  // Request ids are per owner.
  absl::StatusOr<v1::Job> bobs = cluster_->SubmitJob(Spec("once", 2), "bob", false, "req-1");
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_NE(bobs->id(), made->id());

  // Remembered over a restart, as long as the job exists.
  cluster_.reset();
  cluster_ = MakeCluster(state_);
  again = cluster_->SubmitJob(Spec("once", 2), "alice", false, "req-1");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->id(), made->id());
  ASSERT_TRUE(cluster_->CancelJob(made->id(), "").ok());
  ASSERT_TRUE(cluster_->DeleteJob(made->id()).ok());
  absl::StatusOr<v1::Job> after_delete =
      cluster_->SubmitJob(Spec("once", 2), "alice", false, "req-1");
  ASSERT_TRUE(after_delete.ok()) << after_delete.status();
  EXPECT_NE(after_delete->id(), made->id());
}

TEST_F(ClusterTest, RequestIdsAreBoundedToAPlainCharset) {
  for (const std::string& bad : {std::string(65, 'a'), std::string("a b"), std::string("x/y"),
                                 std::string("\xff")}) {
    absl::StatusOr<v1::Job> refused = cluster_->SubmitJob(Spec("r", 1), "alice", false, bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("request_id: ")) << bad;
  }
  EXPECT_TRUE(cluster_->SubmitJob(Spec("r", 1), "alice", false, std::string(64, 'Z')).ok());
  EXPECT_TRUE(cluster_->SubmitJob(Spec("r", 1), "alice", false, "a-B_9").ok());
  EXPECT_THAT(cluster_->ListJobs({}), SizeIs(2));
}

TEST_F(ClusterTest, AFailedSubmitForgetsItsRequestId) {
  Register("w-1", "a", 2);
  state_.FailNextCommits(1);
  EXPECT_EQ(cluster_->SubmitJob(Spec("flaky", 2), "alice", false, "req-9").status().code(),
            absl::StatusCode::kUnavailable);
  // The retry makes the only job.
  absl::StatusOr<v1::Job> retried =
      cluster_->SubmitJob(Spec("flaky", 2), "alice", false, "req-9");
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_THAT(cluster_->ListJobs({}), SizeIs(1));
}

// Every variable no job may set, refused at submit through the Cluster, with the field and
// why; the administrator's --job-env-allow extends the allowlist but never to those.
TEST_F(ClusterTest, SubmitRefusesEnvironmentVariablesThatCouldRunCode) {
  cluster_.reset();
  options_.job_env_allow = {"WANDB_*", "HF_HOME", "LD_*", "PYTHON*"};
  cluster_ = MakeCluster(state_);
  ASSERT_TRUE(RegisterWithPrograms(*cluster_, "w-1", "a", 2, v1::DEVICE_KIND_CPU, {"/opt/p"},
                                   /*runs_commands=*/true)
                  .ok());
  struct Case {
    const char* name;
    const char* why;
  };
  const Case refused[] = {
      {"LD_PRELOAD", "denied: the dynamic loader"},
      {"LD_LIBRARY_PATH", "denied: the dynamic loader"},
      {"BASH_ENV", "denied: shells read it"},
      {"ENV", "denied: shells read it"},
      {"BASHOPTS", "denied: shells read it"},
      {"SHELLOPTS", "denied: shells read it"},
      {"PS4", "denied: shells read it"},
      {"IFS", "denied: shells read it"},
      {"PATH", "denied: it chooses which programs run"},
      {"PYTHONPATH", "denied: an interpreter"},
      {"PYTHONSTARTUP", "denied: an interpreter"},
      {"PERL5OPT", "denied: an interpreter"},
      {"RUBYOPT", "denied: an interpreter"},
      {"NODE_OPTIONS", "denied: an interpreter"},
      {"OPENSSL_CONF", "denied: a library loads"},
      {"OPENSSL_MODULES", "denied: a library loads"},
      {"GCONV_PATH", "denied: the dynamic loader"},
      {"GLIBC_TUNABLES", "denied: the dynamic loader"},
      {"CUDA_INJECTION64_PATH", "denied: a library loads"},
      {"NCCL_NET_PLUGIN", "denied: a library loads"},
      {"NCCL_TUNER_PLUGIN", "denied: a library loads"},
      {"PJRT_NAMES_AND_LIBRARY_PATHS", "denied: a library loads"},
      {"MALLOC_ARENA_MAX", "denied: the dynamic loader"},
      {"HOSTALIASES", "denied: the dynamic loader"},
      {"SUBSTRAX_LAUNCH", "denied: the agent sets it"},
      {"HOME", "denied: the agent sets it"},
      {"CUDA_VISIBLE_DEVICES", "denied: the agent sets it"},
      {"MASTER_ADDR", "denied: reserved for the agent"},
      {"MASTER_PORT", "denied: reserved for the agent"},
      {"RANK", "denied: reserved for the agent"},
      {"WORLD_SIZE", "denied: reserved for the agent"},
      {"LOCAL_RANK", "denied: reserved for the agent"},
      {"LOCAL_WORLD_SIZE", "denied: reserved for the agent"},
      {"GROUP_RANK", "denied: reserved for the agent"},
      {"NODE_RANK", "denied: reserved for the agent"},
      {"PET_NNODES", "denied: reserved for the agent"},
      {"TORCHELASTIC_RUN_ID", "denied: reserved for the agent"},
      {"JAX_COORDINATOR_ADDRESS", "denied: reserved for the agent"},
      {"JAX_NUM_PROCESSES", "denied: reserved for the agent"},
      {"JAX_PROCESS_ID", "denied: reserved for the agent"},
      {"JAX_LOCAL_DEVICE_IDS", "denied: reserved for the agent"},
      {"SOME_SETTING", "not allowed: a job may set only variables matching OMP_*"},
      {"XLA_FLAGS", "not allowed: "},
      {"BAD-NAME", "an environment variable name is letters, digits and '_'"},
  };
  // The same rules for a program's variables and a command's.
  for (const bool command : {false, true}) {
    for (const Case& c : refused) {
      v1::JobSpec spec = command ? CommandSpec("env", 1, "{argv: [/opt/p/train.sh]}")
                                 : ProgramSpec("env", 1, "/opt/p/train");
      auto& env = command ? *spec.mutable_command()->mutable_env()
                          : *spec.mutable_program()->mutable_env();
      env[c.name] = "/tmp/x";
      env["OMP_NUM_THREADS"] = "1";
      absl::StatusOr<v1::Job> job = cluster_->SubmitJob(spec);
      EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << c.name;
      EXPECT_THAT(job.status().message(),
                  HasSubstr(absl::StrCat(command ? "spec.command.env." : "spec.program.env.",
                                         c.name, ": ", c.why)))
          << c.name;
      EXPECT_THAT(job.status().message(), ::testing::Not(HasSubstr("OMP_NUM_THREADS")))
          << c.name;
    }
  }
  v1::JobSpec other = ProgramSpec("env", 1, "/opt/p/train");
  (*other.mutable_program()->mutable_env())["SOME_SETTING"] = "x";
  EXPECT_THAT(cluster_->SubmitJob(other).status().message(),
              HasSubstr("WANDB_*, HF_HOME, LD_*, PYTHON*; an administrator allows more with the "
                        "coordinator's --job-env-allow"));
  EXPECT_THAT(cluster_->ListJobs({}), IsEmpty());

  // The default allowlist and the administrator's patterns are admitted.
  v1::JobSpec allowed = ProgramSpec("env", 1, "/opt/p/train");
  v1::JobSpec allowed_command = CommandSpec("env", 1, "{argv: [/opt/p/train.sh]}");
  for (const char* name : {"OMP_NUM_THREADS", "NCCL_DEBUG", "JOB_LR", "WANDB_MODE", "HF_HOME"}) {
    (*allowed.mutable_program()->mutable_env())[name] = "1";
    (*allowed_command.mutable_command()->mutable_env())[name] = "1";
  }
  EXPECT_FALSE(Submit(allowed).empty());
  EXPECT_FALSE(Submit(allowed_command).empty());
}

TEST_F(ClusterTest, CreateRefusesAPatternThatNamesADeniedVariable) {
  options_.job_env_allow = {"LD_PRELOAD"};
  InMemoryStateStore state;
  absl::StatusOr<std::unique_ptr<Cluster>> cluster =
      Cluster::Create(options_, [] { return absl::Now(); }, &state);
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster.status().message(),
              HasSubstr("--job-env-allow: LD_PRELOAD is denied: the dynamic loader"));
}

}  // namespace
}  // namespace substrax
