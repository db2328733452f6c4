#include "core/job_spec.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::vector<fs::path> YamlFiles(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator("core/testdata/" + dir)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string FirstLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

void ExpectRejected(const fs::path& file) {
  SCOPED_TRACE(file.string());
  {
    const std::string first = FirstLine(file);
    absl::string_view expect = first;
    ASSERT_TRUE(absl::ConsumePrefix(&expect, "# expect: ")) << "first line must be '# expect: ...'";
    ASSERT_GE(expect.size(), 10u) << "the expected fragment is too short to mean anything";
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(file.string());
    ASSERT_FALSE(spec.ok()) << "accepted: " << spec->DebugString();
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(std::string(expect)));
    // Every line names the file it came from.
    for (absl::string_view line : absl::StrSplit(spec.status().message(), '\n')) {
      EXPECT_TRUE(absl::StartsWith(line, file.string())) << line;
    }
  }
}

// Every file under testdata/bad_specs starts with "# expect: <fragment>"; parsing it must fail
// with INVALID_ARGUMENT and a message containing the fragment.
TEST(JobSpecCorpusTest, EveryBadSpecIsRejectedWithItsMessage) {
  const std::vector<fs::path> files = YamlFiles("bad_specs");
  EXPECT_GE(files.size(), 25u);
  for (const fs::path& file : files) ExpectRejected(file);
}

void ExpectAccepted(const fs::path& file) {
  SCOPED_TRACE(file.string());
  {
    absl::StatusOr<v1::JobSpec> spec = LoadJobSpecFile(file.string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    // What the CLI sends is what the coordinator validates again: it must still pass, and
    // defaults must not change a defaulted spec.
    EXPECT_TRUE(ValidateJobSpec(*spec).ok()) << ValidateJobSpec(*spec);
    v1::JobSpec again = *spec;
    ApplyJobSpecDefaults(&again);
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(again, *spec))
        << again.DebugString() << " vs " << spec->DebugString();
  }
}

TEST(JobSpecCorpusTest, EveryGoodSpecParsesAndRevalidates) {
  const std::vector<fs::path> files = YamlFiles("good_specs");
  EXPECT_GE(files.size(), 5u);
  for (const fs::path& file : files) ExpectAccepted(file);
}

TEST(JobSpecTest, DesignExampleMapsFieldByField) {
  auto spec = LoadJobSpecFile("core/testdata/good_specs/fashion_mnist_mlp.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "fashion-mnist-mlp");
  EXPECT_EQ(spec->model().type(), v1::MODEL_TYPE_MLP);
  EXPECT_THAT(spec->model().hidden_sizes(), ::testing::ElementsAre(512, 512));
  EXPECT_EQ(spec->model().num_classes(), 10);
  EXPECT_EQ(spec->data().format(), v1::DATA_FORMAT_IDX);
  EXPECT_EQ(spec->data().test().labels(),
            "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz");
  EXPECT_EQ(spec->optimizer().type(), "adam");
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.001);
  EXPECT_EQ(spec->mesh().type(), v1::MESH_TYPE_DATA_PARALLEL);
  EXPECT_EQ(spec->epochs(), 3);
  EXPECT_EQ(spec->metrics().at("step"), v1::REDUCTION_MAX);
  EXPECT_EQ(spec->backend(), v1::BACKEND_AUTO);
  EXPECT_EQ(spec->precision(), v1::PRECISION_FP32);
  // Derived and defaulted.
  EXPECT_EQ(spec->batch().per_device_batch_size(), 64);
  EXPECT_DOUBLE_EQ(spec->optimizer().hyperparameters().at("b1"), 0.9);
  EXPECT_DOUBLE_EQ(spec->optimizer().hyperparameters().at("b2"), 0.999);
  EXPECT_DOUBLE_EQ(spec->optimizer().hyperparameters().at("eps"), 1e-8);
  EXPECT_TRUE(spec->data().shuffle());
  EXPECT_EQ(spec->data().prefetch_size(), 2);
  EXPECT_EQ(RequiredDevices(*spec), 4);
  EXPECT_EQ(PerDeviceBatchSize(*spec), 64);
}

TEST(JobSpecTest, PrecisionIsReadAndNeedsCuda) {
  auto bf16 = LoadJobSpecFile("core/testdata/good_specs/fashion_mnist_mlp_bf16.yaml");
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->precision(), v1::PRECISION_BF16);
  v1::JobSpec cpu = *bf16;
  cpu.set_backend(v1::BACKEND_CPU);
  const absl::Status refused = ValidateJobSpec(cpu);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("spec.precision"));
  cpu.set_backend(v1::BACKEND_AUTO);  // decided when the devices are known
  EXPECT_TRUE(ValidateJobSpec(cpu).ok());
}

TEST(JobSpecTest, MeshTypesAndSizesAreDerived) {
  auto hybrid = LoadJobSpecFile("core/testdata/good_specs/fashion_mnist_mlp_hybrid.yaml");
  ASSERT_TRUE(hybrid.ok()) << hybrid.status();
  EXPECT_EQ(DataAxisSize(*hybrid), 2);
  EXPECT_EQ(ModelAxisSize(*hybrid), 2);
  EXPECT_EQ(hybrid->batch().global_batch_size(), 128);
  EXPECT_DOUBLE_EQ(hybrid->optimizer().hyperparameters().at("momentum"), 0.9);
  EXPECT_DOUBLE_EQ(hybrid->optimizer().hyperparameters().at("nesterov"), 1);

  auto mp = LoadJobSpecFile("core/testdata/good_specs/model_parallel_cross_host.yaml");
  ASSERT_TRUE(mp.ok()) << mp.status();
  EXPECT_EQ(DataAxisSize(*mp), 1);
  EXPECT_EQ(ModelAxisSize(*mp), 4);
  EXPECT_EQ(RequiredDevices(*mp), 4);
  EXPECT_EQ(mp->data().synthetic().num_outputs(), 10);
  EXPECT_EQ(mp->metrics().size(), 3u);

  auto linear = LoadJobSpecFile("core/testdata/good_specs/synthetic_linear.yaml");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->seed(), 18446744073709551615ull);
  EXPECT_EQ(linear->data().synthetic().num_outputs(), 2);
}

TEST(JobSpecTest, ErrorsCarryFileLineAndColumn) {
  const std::string yaml =
      "apiVersion: substrax/v1\n"
      "kind: TrainJob\n"
      "metadata: {name: x}\n"
      "spec:\n"
      "  mesh: {data_parallel_size: 2, model_parallel_size: 0}\n";
  auto spec = ParseJobSpecYaml(yaml, "job.yaml");
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("job.yaml:5:33: spec.mesh.model_parallel_size: must be >= 1, got 0"));
}

TEST(JobSpecTest, AllProblemsAreReportedTogether) {
  const std::string yaml =
      "apiVersion: substrax/v1\n"
      "kind: TrainJob\n"
      "metadata: {name: x}\n"
      "spec: {steps: 5}\n";
  auto spec = ParseJobSpecYaml(yaml, "job.yaml");
  ASSERT_FALSE(spec.ok());
  const std::string message(spec.status().message());
  for (const char* expected : {"spec.model: is required", "spec.data: is required",
                               "spec.optimizer: is required", "spec.mesh: is required",
                               "spec.batch: give global_batch_size"}) {
    EXPECT_THAT(message, HasSubstr(expected));
  }
}

// A doctor job (the coordinator's RunDoctor builds it): one device on each worker named, and
// nothing that trains.
TEST(JobSpecTest, ADoctorSpecTrainsNothingAndHasOneDeviceOnEachWorker) {
  v1::JobSpec spec;
  spec.set_name("doctor");
  spec.set_backend(v1::BACKEND_CPU);
  spec.mutable_doctor()->add_workers("w-1");
  spec.mutable_doctor()->add_workers("w-2");
  spec.mutable_mesh()->set_type(v1::MESH_TYPE_DATA_PARALLEL);
  spec.mutable_mesh()->set_data_parallel_size(2);
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);

  v1::JobSpec bad = spec;
  bad.mutable_doctor()->add_workers("w-1");
  bad.mutable_model()->set_type(v1::MODEL_TYPE_MLP);
  bad.set_steps(10);
  const std::string message(ValidateJobSpec(bad).message());
  EXPECT_THAT(message, HasSubstr("spec.doctor.workers: worker w-1 is named twice"));
  EXPECT_THAT(message, HasSubstr("spec.model: a doctor job checks the cluster and trains nothing"));
  EXPECT_THAT(message, HasSubstr("spec.steps: a doctor job"));
  EXPECT_THAT(message, HasSubstr("spec.mesh: a doctor job's mesh is {data_parallel_size: 3}"));
  bad = spec;
  bad.mutable_doctor()->clear_workers();
  EXPECT_THAT(std::string(ValidateJobSpec(bad).message()),
              HasSubstr("spec.doctor.workers: 1 to 128 workers, got 0"));
}

// A client that builds the proto itself (any gRPC client) gets the same checks, with paths.
TEST(JobSpecTest, ValidateJobSpecChecksProtosWithoutYaml) {
  v1::JobSpec spec;
  absl::Status empty = ValidateJobSpec(spec);
  EXPECT_EQ(empty.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(empty.message()), HasSubstr("metadata.name: is required"));
  EXPECT_THAT(std::string(empty.message()), HasSubstr("spec: give steps or epochs"));

  auto good = LoadJobSpecFile("core/testdata/good_specs/fashion_mnist_mlp.yaml");
  ASSERT_TRUE(good.ok());
  v1::JobSpec bad = *good;
  bad.mutable_mesh()->set_data_parallel_size(3);
  bad.mutable_batch()->clear_per_device_batch_size();
  EXPECT_THAT(std::string(ValidateJobSpec(bad).message()),
              HasSubstr("spec.batch.global_batch_size: 256 does not divide over the data axis "
                        "of size 3 (256 = 3 x 85 + 1); use a multiple of 3"));
  bad = *good;
  bad.mutable_optimizer()->set_learning_rate(std::nan(""));
  EXPECT_THAT(std::string(ValidateJobSpec(bad).message()),
              HasSubstr("spec.optimizer.learning_rate: must be a positive finite number"));
}

// Hyper-parameters are written inline under `optimizer`; the table decides which keys exist.
TEST(JobSpecTest, OptimizerHyperParametersAreInline) {
  auto parse = [](const std::string& optimizer) {
    return ParseJobSpecYaml(absl::StrCat("apiVersion: substrax/v1\n"
                                         "kind: TrainJob\n"
                                         "metadata: {name: x}\n"
                                         "spec:\n"
                                         "  model: {type: linear}\n"
                                         "  data: {format: synthetic, synthetic: {task: "
                                         "regression, num_train_examples: 8, num_features: 2}}\n"
                                         "  optimizer: ",
                                         optimizer,
                                         "\n"
                                         "  mesh: {data_parallel_size: 1}\n"
                                         "  batch: {global_batch_size: 4}\n"
                                         "  steps: 1\n"),
                            "job.yaml");
  };
  auto adam = parse("{type: adam, learning_rate: 0.1, b1: 0.5}");
  ASSERT_TRUE(adam.ok()) << adam.status();
  EXPECT_DOUBLE_EQ(adam->optimizer().hyperparameters().at("b1"), 0.5);
  EXPECT_DOUBLE_EQ(adam->optimizer().hyperparameters().at("b2"), 0.999);

  auto wrong_owner = parse("{type: sgd, learning_rate: 0.1, b1: 0.5}");
  EXPECT_THAT(std::string(wrong_owner.status().message()),
              HasSubstr("job.yaml:7:46: spec.optimizer.b1: is not used by optimizer sgd; remove "
                        "it (b1 is a hyper-parameter of adam"));
  auto typo = parse("{type: adam, learning_rate: 0.1, b3: 0.5}");
  EXPECT_THAT(std::string(typo.status().message()),
              HasSubstr("job.yaml:7:47: spec.optimizer.b3: unknown field (did you mean 'b2'?); "
                        "optimizer adam takes type, learning_rate, b1, b2, eps"));
  auto not_bool = parse("{type: momentum, learning_rate: 0.1, nesterov: 1}");
  EXPECT_THAT(std::string(not_bool.status().message()),
              HasSubstr("spec.optimizer.nesterov: expected true or false, got '1'"));
  auto range = parse("{type: momentum, learning_rate: 0.1, momentum: 1.5}");
  EXPECT_THAT(std::string(range.status().message()),
              HasSubstr("spec.optimizer.momentum: must be in [0, 1), got 1.5"));
}

// The reader follows job.proto's descriptors: every field of every section is a YAML key, so a
// field added to the proto is read without a change to the reader.
TEST(JobSpecTest, EveryProtoFieldIsAYamlKey) {
  auto takes = [](const std::string& section, const std::string& body) {
    auto spec = ParseJobSpecYaml(absl::StrCat("apiVersion: substrax/v1\nkind: TrainJob\n"
                                              "metadata: {name: x}\nspec: ",
                                              body),
                                 "job.yaml");
    EXPECT_FALSE(spec.ok());
    const std::string message(spec.status().message());
    const std::string marker = absl::StrCat(section, " takes ");
    const size_t at = message.find(marker);
    EXPECT_NE(at, std::string::npos) << message;
    if (at == std::string::npos) return std::vector<std::string>{};
    std::string list = message.substr(at + marker.size());
    list = list.substr(0, list.find('\n'));
    return std::vector<std::string>(absl::StrSplit(list, ", "));
  };
  const google::protobuf::Descriptor* job = v1::JobSpec::descriptor();
  std::vector<std::string> expected;
  for (int i = 0; i < job->field_count(); ++i) {
    if (job->field(i)->name() != "name") expected.push_back(job->field(i)->name());
  }
  EXPECT_EQ(takes("spec", "{not_a_field: 1}"), expected);
  for (int i = 0; i < job->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = job->field(i);
    if (f->message_type() == nullptr || f->is_map()) continue;
    // The optimizer's unknown keys are answered from its table row (OptimizerHyperParametersAreInline).
    if (f->name() == "optimizer") continue;
    std::vector<std::string> fields;
    for (int j = 0; j < f->message_type()->field_count(); ++j) {
      fields.push_back(f->message_type()->field(j)->name());
    }
    EXPECT_EQ(takes("spec." + f->name(), absl::StrCat("{", f->name(), ": {not_a_field: 1}}")),
              fields)
        << f->name();
  }
}

TEST(JobSpecTest, UnreadableFileIsNotFound) {
  auto spec = LoadJobSpecFile("core/testdata/no_such_file.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("no_such_file.yaml"));
}

TEST(JobSpecTest, EnumNamesMatchTheYaml) {
  EXPECT_EQ(ModelTypeName(v1::MODEL_TYPE_SOFTMAX_REGRESSION), "softmax_regression");
  EXPECT_EQ(MeshTypeName(v1::MESH_TYPE_HYBRID), "hybrid");
  EXPECT_EQ(DataFormatName(v1::DATA_FORMAT_IDX), "idx");
  EXPECT_EQ(BackendName(v1::BACKEND_CUDA), "cuda");
  EXPECT_EQ(PrecisionName(v1::PRECISION_BF16), "bf16");
  EXPECT_TRUE(IsClassification(v1::MODEL_TYPE_MLP));
  EXPECT_FALSE(IsClassification(v1::MODEL_TYPE_LINEAR));
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

TEST(ProgramSpecTest, ProgramMapsFieldByFieldAndNeedsNoModel) {
  auto spec = LoadJobSpecFile("core/testdata/good_specs/program.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->program().path(), "/opt/substrax/programs/train_mnist");
  EXPECT_THAT(spec->program().args(), ::testing::ElementsAre("--hidden", "512", "--lr", "0.001"));
  EXPECT_EQ(spec->program().env().at("OMP_NUM_THREADS"), "1");
  EXPECT_FALSE(spec->has_model());
  EXPECT_FALSE(spec->has_data());
  EXPECT_FALSE(spec->has_optimizer());
  EXPECT_EQ(spec->batch().per_device_batch_size(), 64);
  EXPECT_EQ(spec->metrics().at("val_accuracy"), v1::REDUCTION_MEAN);
  EXPECT_EQ(SchedulingBackend(*spec), v1::BACKEND_CPU);
}

TEST(ProgramSpecTest, DefaultsOfAMinimalProgramJob) {
  auto spec = LoadJobSpecFile("core/testdata/good_specs/program_minimal.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_batch());
  EXPECT_EQ(spec->length_case(), v1::JobSpec::LENGTH_NOT_SET);
  EXPECT_EQ(spec->report_every_steps(), 50);
  EXPECT_EQ(spec->metrics().at("loss"), v1::REDUCTION_MEAN);
  EXPECT_EQ(spec->metrics().at("step"), v1::REDUCTION_MAX);
  EXPECT_EQ(spec->backend(), v1::BACKEND_AUTO);
  // Auto never means CUDA for a program job in this version.
  EXPECT_EQ(SchedulingBackend(*spec), v1::BACKEND_CPU);
  EXPECT_EQ(RequiredDevices(*spec), 2);
  // An elastic axis without a batch may take any size in its range.
  v1::JobSpec elastic = *spec;
  elastic.mutable_mesh()->set_min_data_parallel_size(1);
  elastic.mutable_mesh()->set_data_parallel_size(3);
  EXPECT_THAT(DataParallelSizes(elastic), ::testing::ElementsAre(3, 2, 1));
}

TEST(ProgramSpecTest, ABuiltInJobStillNeedsItsModelAndLength) {
  auto spec = LoadJobSpecFile("core/testdata/good_specs/program_minimal.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  v1::JobSpec builtin = *spec;
  builtin.clear_program();
  const absl::Status refused = ValidateJobSpec(builtin);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("spec.model: is required"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("spec: give steps or epochs"));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("spec.batch: give global_batch_size"));
  EXPECT_EQ(SchedulingBackend(builtin), v1::BACKEND_AUTO);
}

TEST(ProgramSpecTest, NulInArgumentsIsRefusedFromAnyClient) {
  auto spec = LoadJobSpecFile("core/testdata/good_specs/program_minimal.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->mutable_program()->add_args(std::string("a\0b", 3));
  const absl::Status refused = ValidateJobSpec(*spec);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("spec.program.args[0]: must not contain a NUL character"));
}

}  // namespace
}  // namespace substrax

namespace substrax {
namespace {

TEST(CommandSpecTest, CommandMapsFieldByFieldAndKeepsItsBackend) {
  auto spec = LoadJobSpecFile("core/testdata/good_specs/command_torch.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_THAT(spec->command().argv(),
              ::testing::ElementsAre("python", "/srv/programs/train_ddp.py", "--epochs", "3"));
  EXPECT_EQ(spec->command().python_env(), "torch-2.1");
  EXPECT_EQ(spec->command().processes(), v1::COMMAND_PROCESSES_PER_DEVICE);
  EXPECT_EQ(spec->command().env().at("OMP_NUM_THREADS"), "4");
  EXPECT_EQ(spec->command().working_dir(), "/srv/programs");
  EXPECT_EQ(spec->metrics().at("tokens"), v1::REDUCTION_SUM);
  EXPECT_TRUE(RunsUserCode(*spec));
  // Unlike a program job, a command job's framework drives the GPUs.
  EXPECT_EQ(SchedulingBackend(*spec), v1::BACKEND_CUDA);
}

TEST(CommandSpecTest, DefaultsOfAMinimalCommandJob) {
  auto spec = LoadJobSpecFile("core/testdata/good_specs/command_minimal.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->command().processes(), v1::COMMAND_PROCESSES_PER_WORKER);
  EXPECT_FALSE(spec->has_batch());
  EXPECT_EQ(spec->length_case(), v1::JobSpec::LENGTH_NOT_SET);
  EXPECT_EQ(spec->backend(), v1::BACKEND_AUTO);
  EXPECT_EQ(SchedulingBackend(*spec), v1::BACKEND_AUTO);
  EXPECT_EQ(RequiredDevices(*spec), 2);
}

// What YAML cannot express (long lists, NUL, numbers outside the enum) is refused from a proto
// too: the coordinator validates what any client sent.
TEST(CommandSpecTest, LimitsHoldForSpecsFromAnyClient) {
  auto base = LoadJobSpecFile("core/testdata/good_specs/command_minimal.yaml");
  ASSERT_TRUE(base.ok()) << base.status();
  auto refusal = [](const v1::JobSpec& spec) { return std::string(ValidateJobSpec(spec).message()); };

  v1::JobSpec many = *base;
  for (int i = 0; i < kMaxCommandArgs; ++i) many.mutable_command()->add_argv("x");
  EXPECT_THAT(refusal(many), HasSubstr(absl::StrCat("spec.command.argv: ", kMaxCommandArgs + 1,
                                                    " arguments, more than the limit of ",
                                                    kMaxCommandArgs)));
  v1::JobSpec big = *base;
  big.mutable_command()->add_argv(std::string(kMaxCommandArgvBytes, 'a'));
  EXPECT_THAT(refusal(big), HasSubstr("bytes in all (a NUL after each), more than the limit of"));

  v1::JobSpec nul = *base;
  nul.mutable_command()->add_argv(std::string("a\0b", 3));
  EXPECT_THAT(refusal(nul), HasSubstr("spec.command.argv[1]: must not contain a NUL character"));

  v1::JobSpec vars = *base;
  for (int i = 0; i <= kMaxCommandEnvVars; ++i) {
    (*vars.mutable_command()->mutable_env())[absl::StrCat("JOB_V", i)] = "1";
  }
  EXPECT_THAT(refusal(vars), HasSubstr("spec.command.env: 257 variables, more than the limit"));
  v1::JobSpec env_bytes = *base;
  (*env_bytes.mutable_command()->mutable_env())["JOB_BIG"] =
      std::string(kMaxCommandEnvSpecBytes, 'v');
  EXPECT_THAT(refusal(env_bytes), HasSubstr(absl::StrCat("spec.command.env: ", kMaxCommandEnvSpecBytes + 9, " bytes in all")));

  v1::JobSpec processes = *base;
  processes.mutable_command()->set_processes(static_cast<v1::CommandProcesses>(7));
  EXPECT_THAT(refusal(processes),
              HasSubstr("spec.command.processes: unknown value 7; use one of per_worker, "
                        "per_device"));

  v1::JobSpec empty = *base;
  empty.mutable_command()->clear_argv();
  EXPECT_THAT(refusal(empty), HasSubstr("spec.command.argv: is required"));
  EXPECT_TRUE(ValidateJobSpec(*base).ok());
}

TEST(CommandSpecTest, PythonEnvNames) {
  EXPECT_EQ(PythonEnvNameProblem("torch-2.1_cpu"), "");
  EXPECT_THAT(PythonEnvNameProblem(""), HasSubstr("1 to 64 bytes, got 0"));
  EXPECT_THAT(PythonEnvNameProblem(".."), HasSubstr("'..' is not a name"));
  EXPECT_THAT(PythonEnvNameProblem("a/b"), HasSubstr("letters, digits"));
  EXPECT_EQ(PythonEnvNameProblem(std::string(kMaxPythonEnvNameBytes, 'a')), "");
}

}  // namespace
}  // namespace substrax
