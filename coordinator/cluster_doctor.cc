// `substraxctl doctor` (docs/diagnosis.md): the doctor job the coordinator builds, one process
// on each worker it can test, and the workers it cannot test with why.
#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/cluster.h"
#include "coordinator/cluster_internal.h"
#include "coordinator/limits.h"
#include "core/job_spec.h"

namespace substrax {

using cluster_internal::Count;

namespace {

// How long a doctor job may run in all: its links take seconds, its checks less.
constexpr int64_t kDoctorMaxSeconds = 300;

v1::UntestedWorker Untested(const v1::Worker& worker, std::string reason) {
  v1::UntestedWorker u;
  u.set_worker_id(worker.worker_id());
  u.set_host(worker.host());
  u.set_reason(std::move(reason));
  return u;
}

}  // namespace

absl::StatusOr<v1::Job> Cluster::RunDoctor(const std::vector<std::string>& requested,
                                           const std::string& owner) {
  if (static_cast<int>(requested.size()) > limits::kMaxWorkers) {
    return absl::InvalidArgumentError(absl::StrCat("workers: ", requested.size(),
                                                   " named, more than the limit of ",
                                                   limits::kMaxWorkers));
  }
  v1::JobSpec spec;
  std::vector<v1::UntestedWorker> untested;
  {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> candidates = requested;
    std::set<std::string> seen;
    for (const std::string& id : requested) {
      if (!seen.insert(id).second) {
        return absl::InvalidArgumentError(absl::StrCat("workers: ", id, " is named twice"));
      }
      if (workers_.count(id) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "workers: no worker named ", BoundedText(id, 64),
            " is known; `substraxctl workers` lists them"));
      }
    }
    if (candidates.empty()) candidates = worker_order_;
    const absl::Time now = lease_clock_();
    for (const std::string& id : candidates) {
      const WorkerEntry& worker = workers_.at(id);
      const v1::Worker& w = worker.proto;
      if (w.state() != v1::WORKER_STATE_ALIVE) {
        untested.push_back(Untested(
            w, absl::StrCat("unreachable: no heartbeat for ",
                            absl::ToInt64Seconds(now - worker.last_heartbeat), " s")));
        continue;
      }
      std::set<std::string> jobs;
      int busy = 0;
      for (const v1::Device& device : w.devices()) {
        auto held = busy_devices_.find(device.id());
        if (held == busy_devices_.end()) continue;
        ++busy;
        jobs.insert(held->second);
      }
      if (busy == w.devices_size()) {
        std::vector<std::string> named(jobs.begin(), jobs.end());
        if (named.size() > 3) named.resize(3), named.push_back("...");
        untested.push_back(Untested(
            w, absl::StrCat("busy: ", busy == 1 ? "its device runs" : absl::StrCat(
                                                                         "all ", busy,
                                                                         " devices run"),
                            " jobs (", absl::StrJoin(named, ", "), ")")));
        continue;
      }
      if (spec.doctor().workers_size() >= kMaxDoctorWorkers) {
        untested.push_back(Untested(w, absl::StrCat("not tested: a run tests at most ",
                                                    kMaxDoctorWorkers,
                                                    " workers; name the others with --worker")));
        continue;
      }
      spec.mutable_doctor()->add_workers(id);
    }
  }
  if (spec.doctor().workers().empty()) {
    std::vector<std::string> why;
    for (const v1::UntestedWorker& u : untested) {
      why.push_back(absl::StrCat(u.worker_id(), " (", u.reason(), ")"));
    }
    return absl::FailedPreconditionError(
        why.empty() ? "no worker has registered: start agents first"
                    : absl::StrCat("no worker can be tested now: ", absl::StrJoin(why, "; ")));
  }
  const int listed = std::min<int>(untested.size(), kMaxDoctorUntestedListed);
  for (int i = 0; i < listed; ++i) *spec.mutable_doctor()->add_untested() = untested[i];
  if (static_cast<int>(untested.size()) > listed) {
    v1::UntestedWorker* more = spec.mutable_doctor()->add_untested();
    more->set_reason(absl::StrCat("and ", Count(untested.size() - listed, "more worker"),
                                  " not tested"));
  }
  spec.set_name("doctor");
  spec.set_backend(v1::BACKEND_CPU);
  spec.mutable_mesh()->set_type(v1::MESH_TYPE_DATA_PARALLEL);
  spec.mutable_mesh()->set_data_parallel_size(spec.doctor().workers_size());
  spec.set_max_duration_seconds(kDoctorMaxSeconds);
  return SubmitChecked(std::move(spec), owner, /*admin=*/true, "", {"admin"});
}

void Cluster::NoteDoctorReportLocked(JobEntry& entry, int process_index,
                                     const v1::DoctorReport& report) {
  v1::DoctorReport stored = report;
  const std::string& worker_id = entry.processes[process_index].worker_id;
  stored.set_process_index(process_index);
  stored.set_worker_id(worker_id);
  stored.set_host(workers_.at(worker_id).proto.host());
  auto* reports = entry.job.mutable_doctor();
  for (v1::DoctorReport& r : *reports) {
    if (r.process_index() == process_index) {
      r = std::move(stored);
      return;
    }
  }
  *reports->Add() = std::move(stored);
  std::sort(reports->begin(), reports->end(),
            [](const v1::DoctorReport& a, const v1::DoctorReport& b) {
              return a.process_index() < b.process_index();
            });
}

namespace cluster_internal {

std::vector<Device> DoctorDevices(const v1::JobSpec& spec, const std::vector<Device>& devices) {
  // The first device of each worker tested, of any kind: the doctor computes nothing on it.
  std::set<std::string> wanted(spec.doctor().workers().begin(), spec.doctor().workers().end());
  std::vector<Device> chosen;
  for (const Device& device : devices) {
    if (wanted.erase(device.worker_id) > 0) chosen.push_back(device);
  }
  return chosen;
}

}  // namespace cluster_internal
}  // namespace substrax
