// The scheduling configuration file (ParseSchedulingConfig) and admission at
// submit (Admit).
#include <string>

#include "absl/strings/str_cat.h"
#include "coordinator/scheduler.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace scheduling {
namespace {

using ::testing::HasSubstr;

constexpr const char* kConfig = R"(policy: queues
queues:
  - name: research
    cohort: lab
    quotas:
      - {backend: cuda, devices: 16, borrowing_limit: 8}
      - {backend: cpu, devices: 64}
    submitters: {owners: [alice], roles: [researcher]}
  - name: vision
    cohort: lab
    quotas: [{backend: cuda, devices: 16}]
  - name: solo
    quotas: [{backend: cuda, devices: 4, borrowing_limit: 0}]
default_queue: vision
priority_classes:
  - {name: low, value: -10}
  - {name: normal, value: 0}
  - {name: urgent, value: 100}
default_priority_class: normal
fair_share_window_seconds: 600
)";

v1::SchedulingConfig Parse(const std::string& yaml) {
  absl::StatusOr<v1::SchedulingConfig> config = ParseSchedulingConfig(yaml, "queues.yaml");
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : v1::SchedulingConfig();
}

std::string Error(const std::string& yaml) {
  absl::StatusOr<v1::SchedulingConfig> config = ParseSchedulingConfig(yaml, "queues.yaml");
  EXPECT_FALSE(config.ok());
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(config.status().message());
}

TEST(ParseSchedulingConfig, ReadsEveryField) {
  v1::SchedulingConfig c = Parse(kConfig);
  EXPECT_EQ(c.policy(), v1::SCHEDULING_POLICY_QUEUES);
  ASSERT_EQ(c.queues_size(), 3);
  EXPECT_EQ(c.queues(0).cohort(), "lab");
  ASSERT_EQ(c.queues(0).quotas_size(), 2);
  EXPECT_EQ(c.queues(0).quotas(0).devices(), 16);
  EXPECT_EQ(c.queues(0).quotas(0).borrowing_limit(), 8);
  EXPECT_FALSE(c.queues(1).quotas(0).has_borrowing_limit());
  EXPECT_TRUE(c.queues(2).quotas(0).has_borrowing_limit());
  EXPECT_EQ(c.queues(0).submitters().roles(0), "researcher");
  EXPECT_EQ(c.default_queue(), "vision");
  EXPECT_EQ(c.priority_classes_size(), 3);  // no "default" added: one is named
  EXPECT_EQ(c.fair_share_window_seconds(), 600);
  EXPECT_EQ(c.preemption_grace_seconds(), 30);
}

TEST(ParseSchedulingConfig, Defaults) {
  v1::SchedulingConfig c = Parse("queues: [{name: team-a}, {name: team-b}]\n");
  EXPECT_EQ(c.policy(), v1::SCHEDULING_POLICY_QUEUES);
  EXPECT_EQ(c.default_queue(), "team-a");
  ASSERT_EQ(c.priority_classes_size(), 1);
  EXPECT_EQ(c.priority_classes(0).name(), "default");
  EXPECT_EQ(c.priority_classes(0).value(), 0);
  EXPECT_EQ(c.default_priority_class(), "default");
  EXPECT_EQ(c.fair_share_window_seconds(), 3600);
  EXPECT_EQ(c.preemption_grace_seconds(), 30);
  // A grace written as 0 stays 0: kill at once.
  EXPECT_EQ(Parse("policy: fifo\npreemption_grace_seconds: 0\n").preemption_grace_seconds(), 0);
}

TEST(ParseSchedulingConfig, DefaultConfiguration) {
  v1::SchedulingConfig c = DefaultSchedulingConfig();
  EXPECT_EQ(c.policy(), v1::SCHEDULING_POLICY_QUEUES);
  ASSERT_EQ(c.queues_size(), 1);
  EXPECT_EQ(c.queues(0).name(), "default");
  EXPECT_TRUE(c.queues(0).quotas().empty());  // no quota: no limit
  EXPECT_EQ(c.default_queue(), "default");
  EXPECT_EQ(c.default_priority_class(), "default");
}

TEST(ParseSchedulingConfig, TypeAndStructureErrorsNameThePathAndPosition) {
  EXPECT_THAT(Error("queues:\n  - name: a\n    quotas: [{backend: cuda, devices: "
                    "many}]\n"),
              HasSubstr("queues.yaml:3:30: queues[0].quotas[0].devices: expected an integer, "
                        "got 'many'"));
  EXPECT_THAT(Error("queues: [{name: a, quota: 3}]\n"),
              HasSubstr("queues[0].quota: unknown field (did you mean 'quotas'?)"));
  EXPECT_THAT(Error("policy: lottery\n"),
              HasSubstr("policy: unknown scheduling policy 'lottery'; use one "
                        "of queues, fifo"));
  EXPECT_THAT(Error("queues: {name: a}\n"), HasSubstr("queues: expected a list of mappings"));
  EXPECT_THAT(Error("queues: [\n"), HasSubstr("queues.yaml:"));
  EXPECT_THAT(Error("queues: [\n"), HasSubstr("not valid YAML"));
  EXPECT_THAT(Error(""), HasSubstr("queues.yaml: the document is empty"));
}

TEST(ParseSchedulingConfig, ValidationErrorsNameThePath) {
  EXPECT_THAT(Error("queues: [{name: a, quotas: [{backend: tpu, devices: 1}]}]\n"),
              HasSubstr("queues[0].quotas[0].backend: unknown backend 'tpu'; use cpu "
                        "or cuda"));
  EXPECT_THAT(Error("queues: [{name: a, quotas: [{backend: cpu, devices: -1}]}]\n"),
              HasSubstr("queues[0].quotas[0].devices: must be >= 0, got -1"));
  EXPECT_THAT(Error("queues: [{name: a, quotas: [{backend: cpu, devices: 1, "
                    "borrowing_limit: -2}]}]\n"),
              HasSubstr("queues[0].quotas[0].borrowing_limit: must be >= 0, got -2"));
  EXPECT_THAT(Error("queues: [{name: a, quotas: [{backend: cpu}, {backend: cpu}]}]\n"),
              HasSubstr("queues[0].quotas[1].backend: a second quota for cpu"));
  EXPECT_THAT(Error("queues: [{name: a}, {name: a}]\n"), HasSubstr("queues.yaml:1:"));
  EXPECT_THAT(Error("queues: [{name: a}, {name: a}]\n"),
              HasSubstr("queues[1].name: queue 'a' is defined twice"));
  EXPECT_THAT(Error("queues: [{name: Team_A}]\n"),
              HasSubstr("queues[0].name: 'Team_A' is not a DNS-1123 label"));
  EXPECT_THAT(Error("queues: [{name: a, cohort: Lab}]\n"),
              HasSubstr("queues[0].cohort: 'Lab' is not a DNS-1123 label"));
  EXPECT_THAT(Error("queues: [{name: a}]\ndefault_queue: b\n"),
              HasSubstr("default_queue: no queue is named 'b'; the queues are a"));
  EXPECT_THAT(Error("priority_classes: [{name: hi, value: 1}, {name: hi, value: 2}]\n"),
              HasSubstr("priority_classes[1].name: priority class 'hi' is defined twice"));
  EXPECT_THAT(Error("priority_classes: [{name: hi, value: 1}]\ndefault_priority_class: "
                    "lo\n"),
              HasSubstr("default_priority_class: no priority class is named 'lo'"));
  EXPECT_THAT(Error("fair_share_window_seconds: 0\n"),
              HasSubstr("fair_share_window_seconds: must be > 0, got 0"));
  EXPECT_THAT(Error("preemption_grace_seconds: -1\n"),
              HasSubstr("preemption_grace_seconds: must be >= 0, got -1"));
}

TEST(ParseSchedulingConfig, BoundsTheInput) {
  std::string queues = "queues:\n";
  for (int i = 0; i < 1001; ++i) absl::StrAppend(&queues, "  - {name: q", i, "}\n");
  EXPECT_THAT(Error(queues), HasSubstr("queues: at most 1000 queues, got 1001"));
  std::string quotas = "queues: [{name: a, quotas: [";
  for (int i = 0; i < 65; ++i) absl::StrAppend(&quotas, i ? ", " : "", "{backend: cpu}");
  EXPECT_THAT(Error(quotas + "]}]\n"),
              HasSubstr("queues[0].quotas: at most 64 quotas per queue, got 65"));
  std::string owners = "queues: [{name: a, submitters: {owners: [";
  for (int i = 0; i < 1001; ++i) absl::StrAppend(&owners, i ? ", " : "", "u", i);
  EXPECT_THAT(Error(owners + "]}}]\n"),
              HasSubstr("queues[0].submitters: at most 1000 owners and roles per queue"));
}

TEST(Admit, DefaultsAndRefusals) {
  Scheduler s(Parse(kConfig));
  absl::StatusOr<Scheduler::Admission> a = s.Admit("", "", "cuda", 1, "bob", {}, false);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->queue, "vision");
  EXPECT_EQ(a->priority_class, "normal");
  EXPECT_EQ(a->priority, 0);
  a = s.Admit("vision", "urgent", "cuda", 1, "bob", {}, false);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->priority, 100);

  a = s.Admit("nope", "", "cuda", 1, "bob", {}, false);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("unknown queue 'nope'; the queues are research, "
                                              "vision, solo"));
  a = s.Admit("", "vip", "cuda", 1, "bob", {}, false);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(a.status().message(), HasSubstr("low, normal, urgent"));
}

TEST(Admit, Submitters) {
  Scheduler s(Parse(kConfig));
  EXPECT_TRUE(s.Admit("research", "", "cuda", 1, "alice", {}, false).ok());
  EXPECT_TRUE(s.Admit("research", "", "cuda", 1, "carol", {"researcher"}, false).ok());
  EXPECT_TRUE(s.Admit("research", "", "cuda", 1, "root", {}, true).ok());
  absl::StatusOr<Scheduler::Admission> a = s.Admit("research", "", "cuda", 1, "bob", {"x"}, false);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(a.status().message(), HasSubstr("'bob' may not submit to queue 'research'"));
}

TEST(Admit, RefusesWhatTheQueueCouldNeverHold) {
  Scheduler s(Parse(kConfig));
  // research: 16 of its own, borrowing at most 8 of vision's 16.
  EXPECT_TRUE(s.Admit("research", "", "cuda", 24, "alice", {}, false).ok());
  absl::StatusOr<Scheduler::Admission> a = s.Admit("research", "", "cuda", 25, "alice", {}, false);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(a.status().message(), HasSubstr("queue 'research' can never hold more than 24 (its "
                                              "quota of 16 plus 8 "
                                              "borrowed from cohort 'lab')"));
  // vision may borrow all of research's 16.
  EXPECT_TRUE(s.Admit("vision", "", "cuda", 32, "bob", {}, false).ok());
  EXPECT_EQ(s.Admit("solo", "", "cuda", 5, "bob", {}, false).status().code(),
            absl::StatusCode::kResourceExhausted);
  // No quota for the pool: no limit.
  EXPECT_TRUE(s.Admit("vision", "", "cpu", 1000, "bob", {}, false).ok());
  Scheduler unlimited(DefaultSchedulingConfig());
  EXPECT_TRUE(unlimited.Admit("", "", "cuda", 100000, "bob", {}, false).ok());
}

}  // namespace
}  // namespace scheduling
}  // namespace substrax
