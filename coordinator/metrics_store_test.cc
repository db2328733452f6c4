#include "coordinator/metrics_store.h"

#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace substrax {
namespace {

using ::testing::_;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::FieldsAre;
using ::testing::HasSubstr;

v1::StepReport Report(int attempt, int64_t step, int device, const std::string& host,
                      double loss, int64_t seconds = 0) {
  v1::StepReport r;
  r.set_job_id("job-1");
  r.set_attempt(attempt);
  r.set_step(step);
  r.set_device_id(device);
  r.set_host(host);
  (*r.mutable_values())["loss"] = loss;
  r.set_samples_per_second(10.0 * (device + 1));
  r.mutable_time()->set_seconds(seconds != 0 ? seconds : 1000 + step * 10 + device);
  return r;
}

// Devices 0, 1 on host a and 2, 3 on host b; losses 1, 2, 3, 4 at step 10 and 5, 6, 7, 8 at 20.
// Device 3 skipped step 20 (late or gone).
void Fill(MetricsStore& store) {
  const std::vector<std::string> hosts = {"a", "a", "b", "b"};
  for (int d = 0; d < 4; ++d) store.Add(Report(1, 10, d, hosts[d], 1.0 + d));
  for (int d = 0; d < 3; ++d) store.Add(Report(1, 20, d, hosts[d], 5.0 + d));
}

class MetricsStoreTest : public ::testing::Test {
 protected:
  MetricsStoreTest() { Fill(store); }
  MetricsStore store;
};

v1::QueryMetricsRequest Request(v1::Reduction reduction, v1::GroupBy group_by = v1::GROUP_BY_NONE,
                                std::vector<std::string> names = {"loss"}) {
  v1::QueryMetricsRequest request;
  request.set_job_id("job-1");
  for (auto& n : names) request.add_names(n);
  request.set_reduction(reduction);
  request.set_group_by(group_by);
  return request;
}

// (group, step, value, num_values) of every point, in order.
using Flat = std::tuple<std::string, int64_t, double, int>;
std::vector<Flat> Flatten(const v1::QueryMetricsResponse& response) {
  std::vector<Flat> out;
  for (const auto& s : response.series()) {
    for (const auto& p : s.points()) out.emplace_back(s.group(), p.step(), p.value(), p.num_values());
  }
  return out;
}

std::vector<Flat> Query(const MetricsStore& store, const v1::QueryMetricsRequest& request,
                        const DeclaredReductions& declared = {}) {
  auto response = store.Query(request, declared);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? Flatten(*response) : std::vector<Flat>{};
}

TEST_F(MetricsStoreTest, ReductionsAcrossDevicesAndSkippedDevice) {
  // Step 20 combines the three devices that reported it: device 3 never blocks it.
  EXPECT_THAT(Query(store, Request(v1::REDUCTION_MEAN)),
              ElementsAre(Flat{"", 10, 2.5, 4}, Flat{"", 20, 6.0, 3}));
  EXPECT_THAT(Query(store, Request(v1::REDUCTION_SUM)),
              ElementsAre(Flat{"", 10, 10.0, 4}, Flat{"", 20, 18.0, 3}));
  EXPECT_THAT(Query(store, Request(v1::REDUCTION_MAX)),
              ElementsAre(Flat{"", 10, 4.0, 4}, Flat{"", 20, 7.0, 3}));
  EXPECT_THAT(Query(store, Request(v1::REDUCTION_MIN)),
              ElementsAre(Flat{"", 10, 1.0, 4}, Flat{"", 20, 5.0, 3}));
}

TEST_F(MetricsStoreTest, PointTimeIsLatestArrivalAndSeriesCarryReduction) {
  auto response = store.Query(Request(v1::REDUCTION_SUM), {});
  ASSERT_TRUE(response.ok());
  ASSERT_EQ(response->series_size(), 1);
  EXPECT_EQ(response->series(0).name(), "loss");
  EXPECT_EQ(response->series(0).reduction(), v1::REDUCTION_SUM);
  EXPECT_EQ(response->series(0).points(0).time().seconds(), 1000 + 100 + 3);
  EXPECT_EQ(response->series(0).points(1).time().seconds(), 1000 + 200 + 2);
}

TEST_F(MetricsStoreTest, NoneKeepsEveryDeviceWhateverTheGrouping) {
  const std::vector<Flat> expected = {{"0", 10, 1.0, 1}, {"0", 20, 5.0, 1}, {"1", 10, 2.0, 1},
                                      {"1", 20, 6.0, 1}, {"2", 10, 3.0, 1}, {"2", 20, 7.0, 1},
                                      {"3", 10, 4.0, 1}};
  EXPECT_EQ(Query(store, Request(v1::REDUCTION_NONE)), expected);
  EXPECT_EQ(Query(store, Request(v1::REDUCTION_NONE, v1::GROUP_BY_HOST)), expected);
}

TEST_F(MetricsStoreTest, GroupByDeviceAndHost) {
  EXPECT_THAT(Query(store, Request(v1::REDUCTION_MEAN, v1::GROUP_BY_HOST)),
              ElementsAre(Flat{"a", 10, 1.5, 2}, Flat{"a", 20, 5.5, 2}, Flat{"b", 10, 3.5, 2},
                          Flat{"b", 20, 7.0, 1}));
  auto by_device = store.Query(Request(v1::REDUCTION_MAX, v1::GROUP_BY_DEVICE), {});
  ASSERT_TRUE(by_device.ok());
  ASSERT_EQ(by_device->series_size(), 4);
  EXPECT_EQ(by_device->series(3).group(), "3");
  EXPECT_EQ(by_device->series(3).reduction(), v1::REDUCTION_MAX);
  EXPECT_EQ(by_device->series(3).points_size(), 1);
}

TEST(MetricsStoreGroupsTest, SortDeviceIdsNumerically) {
  MetricsStore store;
  store.Add(Report(1, 1, 10, "a", 1.0));
  store.Add(Report(1, 1, 9, "a", 1.0));
  auto response = store.Query(Request(v1::REDUCTION_MEAN, v1::GROUP_BY_DEVICE), {});
  ASSERT_TRUE(response.ok());
  ASSERT_EQ(response->series_size(), 2);
  EXPECT_EQ(response->series(0).group(), "9");
  EXPECT_EQ(response->series(1).group(), "10");
}

TEST_F(MetricsStoreTest, StepRanges) {
  auto request = Request(v1::REDUCTION_SUM);
  request.mutable_steps()->set_first(15);
  EXPECT_THAT(Query(store, request), ElementsAre(Flat{"", 20, 18.0, 3}));
  request.mutable_steps()->set_first(10);
  request.mutable_steps()->set_last(10);
  EXPECT_THAT(Query(store, request), ElementsAre(Flat{"", 10, 10.0, 4}));
  request.mutable_steps()->set_first(11);
  request.mutable_steps()->set_last(19);
  auto empty = store.Query(request, {});
  ASSERT_TRUE(empty.ok());
  ASSERT_EQ(empty->series_size(), 1);  // the series is named, with no points
  EXPECT_EQ(empty->series(0).points_size(), 0);

  request.mutable_steps()->set_first(20);
  request.mutable_steps()->set_last(10);
  EXPECT_EQ(store.Query(request, {}).status().code(), absl::StatusCode::kInvalidArgument);
  request.mutable_steps()->set_first(-1);
  request.mutable_steps()->set_last(0);
  EXPECT_EQ(store.Query(request, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MetricsStoreTest, UnknownJobAndName) {
  auto request = Request(v1::REDUCTION_MEAN);
  request.set_job_id("other");
  EXPECT_EQ(store.Query(request, {}).status().code(), absl::StatusCode::kNotFound);
  auto unknown = store.Query(Request(v1::REDUCTION_MEAN, v1::GROUP_BY_NONE, {"accuracy"}), {});
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(unknown.status().message(), HasSubstr("'accuracy'"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("loss"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("samples_per_second"));
}

TEST_F(MetricsStoreTest, DeclaredReductionsWhenUnspecified) {
  DeclaredReductions declared;
  declared["loss"] = v1::REDUCTION_MAX;
  auto request = Request(v1::REDUCTION_UNSPECIFIED, v1::GROUP_BY_NONE,
                         {"loss", "samples_per_second", "compute_seconds"});
  request.mutable_steps()->set_first(10);
  request.mutable_steps()->set_last(10);
  auto response = store.Query(request, declared);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->series_size(), 3);
  EXPECT_EQ(response->series(0).reduction(), v1::REDUCTION_MAX);
  EXPECT_EQ(response->series(0).points(0).value(), 4.0);
  // Throughput adds up over devices; other undeclared metrics default to the mean.
  EXPECT_EQ(response->series(1).reduction(), v1::REDUCTION_SUM);
  EXPECT_EQ(response->series(1).points(0).value(), 100.0);
  EXPECT_EQ(response->series(2).reduction(), v1::REDUCTION_MEAN);
  // Without a reduction declared for loss: mean.
  EXPECT_THAT(Query(store, Request(v1::REDUCTION_UNSPECIFIED)),
              ElementsAre(Flat{"", 10, 2.5, 4}, Flat{"", 20, 6.0, 3}));
}

TEST_F(MetricsStoreTest, AllNamesWhenNoneAsked) {
  auto response = store.Query(Request(v1::REDUCTION_MEAN, v1::GROUP_BY_NONE, {}), {});
  ASSERT_TRUE(response.ok());
  std::vector<std::string> names;
  for (const auto& s : response->series()) names.push_back(s.name());
  EXPECT_THAT(names, ElementsAre("collective_seconds", "compute_seconds", "data_wait_seconds",
                                 "loss", "samples_per_second"));
}

TEST_F(MetricsStoreTest, LatestAttemptWithPointsAndResentReportsReplace) {
  store.Add(Report(2, 5, 0, "a", 9.0));
  store.Add(Report(2, 5, 0, "a", 8.0));  // resent: replaces
  EXPECT_THAT(Query(store, Request(v1::REDUCTION_SUM)), ElementsAre(Flat{"", 5, 8.0, 1}));
}

TEST_F(MetricsStoreTest, AnEarlierAttemptOnRequest) {
  store.Add(Report(3, 5, 0, "a", 9.0));
  auto request = Request(v1::REDUCTION_MAX);
  auto latest = store.Query(request, {});
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(latest->attempt(), 3);
  request.set_attempt(1);
  auto first = store.Query(request, {});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->attempt(), 1);
  EXPECT_THAT(Flatten(*first), ElementsAre(Flat{"", 10, 4.0, 4}, Flat{"", 20, 7.0, 3}));
  // Attempt 2 never reported: NOT_FOUND naming the attempts that did.
  request.set_attempt(2);
  auto none = store.Query(request, {});
  ASSERT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("attempts with metrics: 1, 3"));
  request.set_attempt(-1);
  EXPECT_EQ(store.Query(request, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MetricsStoreTest, LatestForProgress) {
  DeclaredReductions declared;
  declared["loss"] = v1::REDUCTION_MIN;
  std::optional<v1::JobProgress> progress = store.Latest("job-1", 1, declared);
  ASSERT_TRUE(progress.has_value());
  // Step 20 lacks device 3: progress is step 10, the newest every device reported.
  EXPECT_EQ(progress->step(), 10);
  EXPECT_EQ(progress->metrics().at("loss"), 1.0);
  EXPECT_EQ(progress->metrics().count("samples_per_second"), 0u);
  // Devices 0..2 at step 20 (10 + 20 + 30) and device 3, which skipped it, at step 10 (40).
  EXPECT_EQ(progress->samples_per_second(), 100.0);
  EXPECT_FALSE(store.Latest("job-1", 2, declared).has_value());
  EXPECT_FALSE(store.Latest("other", 1, declared).has_value());
}

// Devices 0, 1 on host a and 2, 3 on host b, as an attempt's mesh.
const ExpectedDevices kMesh = {{0, "a"}, {1, "a"}, {2, "b"}, {3, "b"}};

// (step, value, num_values, expected_values, partial) of every point, the value rounded to 4
// places as the numbers below are given.
using Marked = std::tuple<int64_t, double, int, int, bool>;
std::vector<Marked> Marks(const MetricsStore& store, v1::GroupBy group_by = v1::GROUP_BY_NONE) {
  auto response = store.Query(Request(v1::REDUCTION_MEAN, group_by), {}, kMesh);
  EXPECT_TRUE(response.ok()) << response.status();
  std::vector<Marked> out;
  if (!response.ok()) return out;
  for (const auto& s : response->series()) {
    for (const auto& p : s.points()) {
      out.emplace_back(p.step(), std::round(p.value() * 1e4) / 1e4, p.num_values(),
                       p.expected_values(), p.partial());
    }
  }
  return out;
}

// The bug of issue 34: host a's devices reported step 20 first, and their mean (0.3836) was
// shown as the job's, whose mean over all four devices is 0.3657.
TEST(MetricsStorePartialTest, AStepIsProgressOnlyOnceEveryDeviceReportedIt) {
  MetricsStore store(/*keep_steps=*/8);
  for (int d = 0; d < 4; ++d) store.Add(Report(1, 10, d, kMesh.at(d), 0.5), kMesh);
  store.Add(Report(1, 20, 0, "a", 0.3900), kMesh);
  store.Add(Report(1, 20, 1, "a", 0.3772), kMesh);

  std::optional<v1::JobProgress> progress = store.Latest("job-1", 1, {}, kMesh);
  ASSERT_TRUE(progress.has_value());
  EXPECT_EQ(progress->step(), 10);
  EXPECT_EQ(progress->metrics().at("loss"), 0.5);
  EXPECT_THAT(Marks(store),
              ElementsAre(Marked{10, 0.5, 4, 4, false}, Marked{20, 0.3836, 2, 4, true}));
  // Per host: a is whole at step 20, b has no point; a device series expects its one device.
  EXPECT_THAT(Marks(store, v1::GROUP_BY_HOST),
              ElementsAre(Marked{10, 0.5, 2, 2, false}, Marked{20, 0.3836, 2, 2, false},
                          Marked{10, 0.5, 2, 2, false}));
  EXPECT_THAT(Marks(store, v1::GROUP_BY_DEVICE), Each(FieldsAre(_, _, 1, 1, false)));

  // Process 1 drives devices 2 and 3: one of its two reports is not enough.
  store.Add(Report(1, 20, 2, "b", 0.3500), kMesh);
  EXPECT_EQ(store.Latest("job-1", 1, {}, kMesh)->step(), 10);
  store.Add(Report(1, 20, 3, "b", 0.3456), kMesh);
  progress = store.Latest("job-1", 1, {}, kMesh);
  ASSERT_TRUE(progress.has_value());
  EXPECT_EQ(progress->step(), 20);
  EXPECT_NEAR(progress->metrics().at("loss"), 0.3657, 1e-9);
  // Step 10 is left behind by the window.
  EXPECT_THAT(Marks(store), ElementsAre(Marked{20, 0.3657, 4, 4, false}));
}

TEST(MetricsStorePartialTest, ADeviceThatNeverReportedHoldsProgressBackButHasASeries) {
  MetricsStore store;
  for (int d = 0; d < 3; ++d) store.Add(Report(1, 10, d, kMesh.at(d), 1.0));
  EXPECT_FALSE(store.Latest("job-1", 1, {}, kMesh).has_value());
  // Without the mesh, the devices that reported are all a store knows of.
  EXPECT_EQ(store.Latest("job-1", 1, {})->step(), 10);
  EXPECT_THAT(Marks(store), ElementsAre(Marked{10, 1.0, 3, 4, true}));
  auto by_device = store.Query(Request(v1::REDUCTION_MEAN, v1::GROUP_BY_DEVICE), {}, kMesh);
  ASSERT_TRUE(by_device.ok()) << by_device.status();
  ASSERT_EQ(by_device->series_size(), 4);
  EXPECT_EQ(by_device->series(3).group(), "3");
  EXPECT_EQ(by_device->series(3).points_size(), 0);
}

TEST(MetricsStorePartialTest, TheWindowKeepsTheStepsADeviceBehindHasNotReported) {
  MetricsStore store(/*keep_steps=*/4);
  const ExpectedDevices two = {{0, "a"}, {1, "b"}};
  // Device 0's reports run three steps ahead of device 1's, which has not reported yet.
  for (int64_t step = 10; step <= 40; step += 10) store.Add(Report(1, step, 0, "a", 1.0), two);
  store.Add(Report(1, 10, 1, "b", 3.0), two);
  EXPECT_EQ(store.Latest("job-1", 1, {}, two)->step(), 10);
  store.Add(Report(1, 20, 1, "b", 3.0), two);
  std::optional<v1::JobProgress> progress = store.Latest("job-1", 1, {}, two);
  ASSERT_TRUE(progress.has_value());
  EXPECT_EQ(progress->step(), 20);
  EXPECT_EQ(progress->metrics().at("loss"), 2.0);
  // A device further behind than keep_steps loses its oldest steps: progress waits for a step
  // still kept.
  for (int64_t step = 50; step <= 80; step += 10) store.Add(Report(1, step, 0, "a", 1.0), two);
  store.Add(Report(1, 30, 1, "b", 3.0), two);
  EXPECT_FALSE(store.Latest("job-1", 1, {}, two).has_value());
  store.Add(Report(1, 50, 1, "b", 3.0), two);
  EXPECT_EQ(store.Latest("job-1", 1, {}, two)->step(), 50);
}

}  // namespace
}  // namespace substrax
