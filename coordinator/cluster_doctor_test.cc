// Tests of Cluster: `substraxctl doctor`'s job (RunDoctor): which workers it tests and which not
// with why, one device on each worker tested, its processes' reports kept, no stall timeout,
// and no user-made doctor spec.
#include "coordinator/cluster.h"

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/cluster_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "rpc/proto_time.h"

namespace substrax {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST_F(ClusterTest, ADoctorJobRunsOneProcessOnEachWorkerItCanTest) {
  // w-1's only device runs a job (busy); w-4 stops heartbeating and dies.
  Register("w-1", "a", 1);
  const std::string busy = Submit(Spec("busy", 1));
  ASSERT_EQ(Get(busy).state(), v1::JOB_STATE_RUNNING);
  Register("w-2", "b", 2);
  Register("w-3", "c", 1);
  Register("w-4", "d", 1);
  RunFor(absl::Seconds(40), {"w-1", "w-2", "w-3"});

  absl::StatusOr<v1::Job> doctor = cluster_->RunDoctor({}, "admin");
  ASSERT_TRUE(doctor.ok()) << doctor.status();
  const v1::DoctorSpec& spec = doctor->spec().doctor();
  std::set<std::string> tested(spec.workers().begin(), spec.workers().end());
  EXPECT_EQ(tested, (std::set<std::string>{"w-2", "w-3"}));
  std::vector<std::string> untested;
  for (const v1::UntestedWorker& u : spec.untested()) {
    untested.push_back(u.worker_id() + " on " + u.host() + ": " + u.reason());
  }
  EXPECT_THAT(untested, ElementsAre("w-1 on a: busy: its device runs jobs (busy-1)",
                                    "w-4 on d: unreachable: no heartbeat for 40 s"));
  EXPECT_EQ(doctor->spec().mesh().data_parallel_size(), spec.workers_size());
  EXPECT_EQ(doctor->spec().max_duration_seconds(), 300);

  // Started at once on one device of each worker tested, and held there without step reports
  // past the progress timeout (max_duration_seconds bounds it instead).
  v1::Job running = Get(doctor->id());
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.transitions(0).reason();
  std::set<std::string> placed;
  for (const v1::Device& d : running.mesh().devices()) placed.insert(d.worker_id());
  EXPECT_EQ(placed, tested);
  EXPECT_EQ(running.mesh().devices_size(), spec.workers_size());
  RunFor(absl::Minutes(3), {"w-1", "w-2", "w-3"});
  ASSERT_EQ(Get(doctor->id()).state(), v1::JOB_STATE_RUNNING);

  // Each process's report is kept with its worker and host, in process order.
  const int n = spec.workers_size();
  for (int p = n - 1; p >= 0; --p) {
    const std::string worker = running.mesh().devices(p).worker_id();
    v1::ReportAttemptStatusRequest done;
    done.set_job_id(doctor->id());
    done.set_attempt(1);
    done.set_process_index(p);
    done.set_state(v1::RUNNER_STATE_SUCCEEDED);
    // Whatever the process says about itself, the coordinator's process table names it.
    done.set_worker_id(worker);
    done.mutable_doctor()->set_worker_id("someone-else");
    v1::DoctorFinding* f = done.mutable_doctor()->add_findings();
    f->set_check("cpu");
    f->set_verdict(v1::DOCTOR_VERDICT_OK);
    ASSERT_TRUE(cluster_->ReportAttemptStatus(done).ok());
  }
  const v1::Job ended = Get(doctor->id());
  EXPECT_EQ(ended.state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(ended.doctor_size(), n);
  for (int p = 0; p < n; ++p) {
    EXPECT_EQ(ended.doctor(p).process_index(), p);
    EXPECT_EQ(ended.doctor(p).worker_id(), running.mesh().devices(p).worker_id());
    EXPECT_NE(ended.doctor(p).host(), "");
    ASSERT_EQ(ended.doctor(p).findings_size(), 1);
  }
}

TEST_F(ClusterTest, DoctorRefusesUnknownOrRepeatedWorkersAndAClusterWithNoneToTest) {
  EXPECT_THAT(cluster_->RunDoctor({}, "admin").status().message(),
              HasSubstr("no worker has registered"));
  Register("w-1", "a", 1);
  EXPECT_EQ(cluster_->RunDoctor({"w-9"}, "admin").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster_->RunDoctor({"w-1", "w-1"}, "admin").status().message(),
              HasSubstr("w-1 is named twice"));
  ASSERT_EQ(Get(Submit(Spec("all", 1))).state(), v1::JOB_STATE_RUNNING);
  const absl::Status none = cluster_->RunDoctor({"w-1"}, "admin").status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.message(), HasSubstr("no worker can be tested now: w-1 (busy: its device "
                                        "runs jobs (all-1))"));
}

TEST_F(ClusterTest, ASubmittedDoctorSpecIsRefused) {
  RegisterTwoWorkers();
  v1::JobSpec spec;
  spec.set_name("doctor");
  spec.mutable_doctor()->add_workers("w-1");
  spec.set_backend(v1::BACKEND_CPU);
  spec.mutable_mesh()->set_type(v1::MESH_TYPE_DATA_PARALLEL);
  spec.mutable_mesh()->set_data_parallel_size(1);
  const absl::Status refused = cluster_->SubmitJob(spec, "mallory", true).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("run `substraxctl doctor`"));
}

}  // namespace
}  // namespace substrax
