#include "coordinator/queues_view.h"

#include "gtest/gtest.h"

namespace substrax {
namespace {

v1::SchedulingConfig TwoQueues() {
  v1::SchedulingConfig config;
  config.set_policy(v1::SCHEDULING_POLICY_QUEUES);
  v1::QueueConfig* research = config.add_queues();
  research->set_name("research");
  research->set_cohort("lab");
  v1::DeviceQuota* cpu = research->add_quotas();
  cpu->set_backend("cpu");
  cpu->set_devices(16);
  v1::DeviceQuota* cuda = research->add_quotas();
  cuda->set_backend("cuda");
  cuda->set_devices(8);
  cuda->set_borrowing_limit(4);
  config.add_queues()->set_name("vision");
  config.set_default_queue("research");
  v1::PriorityClass* low = config.add_priority_classes();
  low->set_name("low");
  v1::PriorityClass* high = config.add_priority_classes();
  high->set_name("high");
  high->set_value(1000);
  config.set_default_priority_class("low");
  return config;
}

TEST(QueuesViewTest, QueuesInTheConfigurationsOrderWithTheirQuotasAndUse) {
  scheduling::QueueStatus research;
  research.name = "research";
  research.cohort = "lab";
  research.used = {{"cpu", 20}};
  research.borrowed = {{"cpu", 4}};
  research.pending = {{"high", 2}, {"low", 5}};
  research.fair_share = 0.25;
  QueuesConfigStatus source;
  source.source = "/etc/substrax/queues.yaml";
  source.loaded = absl::FromUnixSeconds(1000);
  source.last_error = "queues[0].name: 'Bad' is not a DNS-1123 label";

  const v1::ListQueuesResponse r = MakeListQueuesResponse(TwoQueues(), {research}, source);

  EXPECT_EQ(r.policy(), v1::SCHEDULING_POLICY_QUEUES);
  ASSERT_EQ(r.queues_size(), 2);
  const v1::QueueState& q = r.queues(0);
  EXPECT_EQ(q.name(), "research");
  EXPECT_EQ(q.cohort(), "lab");
  ASSERT_EQ(q.devices_size(), 2);
  EXPECT_EQ(q.devices(0).backend(), "cpu");
  EXPECT_EQ(q.devices(0).quota(), 16);
  EXPECT_FALSE(q.devices(0).has_borrowing_limit());
  EXPECT_EQ(q.devices(0).used(), 20);
  EXPECT_EQ(q.devices(0).borrowed(), 4);
  EXPECT_EQ(q.devices(1).backend(), "cuda");
  EXPECT_EQ(q.devices(1).quota(), 8);
  EXPECT_EQ(q.devices(1).borrowing_limit(), 4);
  EXPECT_EQ(q.devices(1).used(), 0);
  EXPECT_EQ(q.pending().at("high"), 2);
  EXPECT_EQ(q.pending().at("low"), 5);
  EXPECT_DOUBLE_EQ(q.fair_share(), 0.25);
  // No pass has seen vision yet: its configuration alone.
  EXPECT_EQ(r.queues(1).name(), "vision");
  EXPECT_EQ(r.queues(1).devices_size(), 0);
  EXPECT_TRUE(r.queues(1).pending().empty());

  EXPECT_EQ(r.default_queue(), "research");
  ASSERT_EQ(r.priority_classes_size(), 2);
  EXPECT_EQ(r.priority_classes(0).name(), "high");
  EXPECT_EQ(r.priority_classes(1).name(), "low");
  EXPECT_EQ(r.default_priority_class(), "low");
  EXPECT_EQ(r.config_source(), "/etc/substrax/queues.yaml");
  EXPECT_EQ(r.config_load_time().seconds(), 1000);
  EXPECT_EQ(r.config_error(), source.last_error);
}

TEST(QueuesViewTest, AQueueGoneFromTheConfigurationIsShownWhileItsJobsHoldDevices) {
  scheduling::QueueStatus old;
  old.name = "old";
  old.used = {{"cuda", 2}};
  const v1::ListQueuesResponse r = MakeListQueuesResponse(TwoQueues(), {old}, {});
  ASSERT_EQ(r.queues_size(), 3);
  EXPECT_EQ(r.queues(2).name(), "old");
  ASSERT_EQ(r.queues(2).devices_size(), 1);
  EXPECT_FALSE(r.queues(2).devices(0).has_quota());
  EXPECT_EQ(r.queues(2).devices(0).used(), 2);
  EXPECT_EQ(r.config_source(), "built-in default");
  EXPECT_FALSE(r.has_config_load_time());
  EXPECT_TRUE(r.config_error().empty());
}

}  // namespace
}  // namespace substrax
