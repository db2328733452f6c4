// `substraxctl doctor`: a preflight of the cluster (docs/diagnosis.md), judged and shown. The
// doctor job's processes report their host checks and raw link timings; the agents report their
// clocks and certificates; this file judges clocks, certificates and links (a link only makes
// sense against the others) and renders one table.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/format.h"
#include "rpc/proto_time.h"

namespace substrax::ctl {
namespace {

v1::DoctorFinding Finding(std::string check, v1::DoctorVerdict verdict, std::string seen,
                          std::string fix = "") {
  v1::DoctorFinding f;
  f.set_check(std::move(check));
  f.set_verdict(verdict);
  f.set_seen(std::move(seen));
  f.set_fix(std::move(fix));
  return f;
}

std::string Milliseconds(absl::Duration d) {
  return absl::StrFormat("%.2f ms", absl::ToDoubleMilliseconds(d));
}

std::string Rate(double bytes_per_second) {
  if (bytes_per_second >= 1e9) return absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9);
  return absl::StrFormat("%.0f MB/s", bytes_per_second / 1e6);
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

v1::DoctorFinding JudgeClock(const v1::Worker& worker) {
  if (!worker.has_clock()) {
    return Finding("clock", v1::DOCTOR_VERDICT_WARNING, "not measured yet",
                   "wait for a heartbeat, or upgrade the agent (it measures its clock with "
                   "every heartbeat)");
  }
  const absl::Duration offset = FromProtoDuration(worker.clock().offset());
  const absl::Duration bound = FromProtoDuration(worker.clock().round_trip()) / 2;
  const double seconds = absl::ToDoubleSeconds(absl::AbsDuration(offset));
  const std::string seen =
      absl::StrFormat("%s %s the coordinator's (within %s)",
                      seconds >= 1 ? absl::StrFormat("%.1f s", seconds)
                                   : Milliseconds(absl::AbsDuration(offset)),
                      offset >= absl::ZeroDuration() ? "ahead of" : "behind",
                      Milliseconds(bound));
  // Only what the measurement can tell apart from its own error counts.
  const absl::Duration beyond = absl::AbsDuration(offset) - bound;
  if (beyond >= kDoctorClockProblem) {
    return Finding("clock", v1::DOCTOR_VERDICT_PROBLEM, seen,
                   "synchronize the host's clock (chrony or systemd-timesyncd, against the "
                   "coordinator's time servers): logs, metrics, checkpoints and certificates "
                   "use wall time");
  }
  if (beyond >= kDoctorClockWarning) {
    return Finding("clock", v1::DOCTOR_VERDICT_WARNING, seen,
                   "check the host's time synchronization (chronyc tracking)");
  }
  return Finding("clock", v1::DOCTOR_VERDICT_OK, seen);
}

// Nothing when the agent has no certificate (a plaintext cluster).
std::optional<v1::DoctorFinding> JudgeCertificate(const v1::Worker& worker, absl::Time now) {
  if (!worker.has_certificate_not_after()) return std::nullopt;
  const absl::Time not_after = FromProtoTime(worker.certificate_not_after());
  const absl::Duration left = not_after - now;
  const std::string when = absl::FormatTime("%Y-%m-%d %H:%M UTC", not_after, absl::UTCTimeZone());
  const std::string fix = absl::StrCat(
      "issue a new certificate for ", worker.worker_id(),
      " (substraxctl certs issue --name ", worker.worker_id(),
      " --role worker ...) and put it in place of the agent's --tls-cert and --tls-key: the "
      "agent reads them again within its reload interval");
  if (left <= absl::ZeroDuration()) {
    return Finding("certificate", v1::DOCTOR_VERDICT_PROBLEM,
                   absl::StrCat("expired ", FormatShortDuration(-left), " ago (", when, ")"), fix);
  }
  const std::string seen = absl::StrCat("expires in ", FormatShortDuration(left), " (", when, ")");
  if (left < kDoctorCertificateProblem) {
    return Finding("certificate", v1::DOCTOR_VERDICT_PROBLEM, seen, fix);
  }
  if (left < kDoctorCertificateWarning) {
    return Finding("certificate", v1::DOCTOR_VERDICT_WARNING, seen, fix);
  }
  return Finding("certificate", v1::DOCTOR_VERDICT_OK, seen);
}

struct MeasuredLink {
  int low = 0, high = 0;
  v1::DoctorLink link;  // as the lower process measured it (or the higher, if only it did)
};

}  // namespace

std::vector<v1::DoctorFinding> JudgeLinks(const v1::Job& job, std::vector<int>* owners) {
  // Each pair once; the lower process's measurement.
  std::map<std::pair<int, int>, MeasuredLink> pairs;
  std::map<int, const v1::DoctorReport*> by_process;
  for (const v1::DoctorReport& r : job.doctor()) by_process[r.process_index()] = &r;
  for (const v1::DoctorReport& r : job.doctor()) {
    for (const v1::DoctorLink& l : r.links()) {
      const int low = std::min(r.process_index(), l.peer());
      const int high = std::max(r.process_index(), l.peer());
      auto [it, inserted] = pairs.try_emplace({low, high});
      if (inserted || r.process_index() == low) it->second = {low, high, l};
    }
  }
  std::vector<double> latencies, rates;
  for (const auto& [key, m] : pairs) {
    if (!m.link.error().empty()) continue;
    latencies.push_back(absl::ToDoubleSeconds(FromProtoDuration(m.link.latency())));
    rates.push_back(m.link.bytes_per_second());
  }
  const double median_latency = Median(latencies);
  const double median_rate = Median(rates);
  const std::string of_links =
      absl::StrCat(latencies.size(), latencies.size() == 1 ? " link" : " links");
  std::vector<v1::DoctorFinding> findings;
  for (const auto& [key, m] : pairs) {
    auto peer = by_process.find(m.high);
    const std::string peer_name =
        peer == by_process.end()
            ? absl::StrCat("process ", m.high)
            : absl::StrCat(peer->second->worker_id(), " (host ", peer->second->host(), ")");
    const std::string check = absl::StrCat("link to ", peer_name);
    owners->push_back(m.low);
    if (!m.link.error().empty()) {
      findings.push_back(Finding(check, v1::DOCTOR_VERDICT_PROBLEM,
                                 absl::StrCat("not measured: ", m.link.error()),
                                 "check that the two workers reach each other on their agents' "
                                 "--listen-host addresses (firewall, routes, MTU)"));
      continue;
    }
    const absl::Duration latency = FromProtoDuration(m.link.latency());
    const double seconds = absl::ToDoubleSeconds(latency);
    std::string seen = absl::StrCat("latency ", Milliseconds(latency), ", ",
                                    Rate(m.link.bytes_per_second()));
    const std::string path_fix =
        "check the network path between the two hosts (NIC, cable, switch port, a tc qdisc, "
        "congestion): every collective between them waits for it";
    const bool slow_against_others =
        latencies.size() >= 3 && seconds >= kDoctorLinkFactor * median_latency &&
        latency - absl::Seconds(median_latency) >= kDoctorLinkMinExcess;
    const bool narrow_against_others =
        rates.size() >= 3 && m.link.bytes_per_second() * kDoctorLinkFactor <= median_rate;
    if (slow_against_others || narrow_against_others) {
      absl::StrAppend(&seen, slow_against_others
                                 ? absl::StrFormat("; %.0fx the median latency of the %s (%s)",
                                                   seconds / median_latency, of_links,
                                                   Milliseconds(absl::Seconds(median_latency)))
                                 : absl::StrFormat("; 1/%.0f of the median bandwidth of the %s "
                                                   "(%s)",
                                                   median_rate / m.link.bytes_per_second(),
                                                   of_links, Rate(median_rate)));
      findings.push_back(Finding(check, v1::DOCTOR_VERDICT_PROBLEM, seen, path_fix));
    } else if (latency >= kDoctorLinkSlowLatency ||
               m.link.bytes_per_second() < kDoctorLinkLowBandwidth) {
      findings.push_back(Finding(
          check, v1::DOCTOR_VERDICT_WARNING,
          absl::StrCat(seen, "; ",
                       latency >= kDoctorLinkSlowLatency
                           ? absl::StrCat("more than ", Milliseconds(kDoctorLinkSlowLatency))
                           : absl::StrCat("below ", Rate(kDoctorLinkLowBandwidth))),
          path_fix));
    } else {
      findings.push_back(Finding(check, v1::DOCTOR_VERDICT_OK, seen));
    }
  }
  return findings;
}

namespace {

// What the worker's agent reports with its heartbeats: its clock and certificate, judged.
void AddAgentFindings(const v1::Worker& worker, absl::Time now, v1::DoctorReport* out) {
  *out->add_findings() = JudgeClock(worker);
  if (std::optional<v1::DoctorFinding> cert = JudgeCertificate(worker, now); cert.has_value()) {
    *out->add_findings() = *std::move(cert);
  }
}

}  // namespace

v1::DoctorSummary SummarizeDoctor(const v1::Job& job, const v1::ListWorkersResponse& workers,
                                  absl::Time now) {
  v1::DoctorSummary summary;
  summary.set_job_id(job.id());
  summary.set_job_state(job.state());
  summary.set_job_error(job.error());
  *summary.mutable_untested() = job.spec().doctor().untested();
  std::map<std::string, const v1::Worker*> known;
  for (const v1::Worker& w : workers.workers()) known[w.worker_id()] = &w;
  std::map<std::string, const v1::DoctorReport*> report_of;
  for (const v1::DoctorReport& r : job.doctor()) report_of[r.worker_id()] = &r;
  // Tested workers: in process order once they reported (Job.doctor is), else as the spec
  // names them.
  std::vector<std::string> order;
  for (const v1::DoctorReport& r : job.doctor()) order.push_back(r.worker_id());
  for (const std::string& w : job.spec().doctor().workers()) {
    if (report_of.count(w) == 0) order.push_back(w);
  }
  std::map<int, int> slot_of_process;
  for (const std::string& id : order) {
    v1::DoctorReport* out = summary.add_workers();
    out->set_worker_id(id);
    out->set_process_index(-1);
    auto w = known.find(id);
    if (auto r = report_of.find(id); r != report_of.end()) {
      out->set_process_index(r->second->process_index());
      out->set_host(r->second->host());
      *out->mutable_findings() = r->second->findings();
      slot_of_process[out->process_index()] = summary.workers_size() - 1;
    } else {
      if (w != known.end()) out->set_host(w->second->host());
      *out->add_findings() = Finding(
          "doctor process", v1::DOCTOR_VERDICT_PROBLEM,
          job.state() == v1::JOB_STATE_RUNNING || job.state() == v1::JOB_STATE_PENDING
              ? absl::StrCat("no report yet (the doctor job is ", JobStateName(job.state()), ")")
              : absl::StrCat("no report: the doctor job ", JobStateName(job.state()),
                             job.error().empty() ? "" : absl::StrCat(": ", job.error())),
          absl::StrCat("see `substraxctl logs ", job.id(), "`"));
    }
    if (w != known.end()) AddAgentFindings(*w->second, now, out);
  }
  std::vector<int> owners;
  const std::vector<v1::DoctorFinding> links = JudgeLinks(job, &owners);
  for (size_t i = 0; i < links.size(); ++i) {
    auto slot = slot_of_process.find(owners[i]);
    if (slot == slot_of_process.end()) continue;
    *summary.mutable_workers(slot->second)->add_findings() = links[i];
  }
  // Untested but alive: their agents still report clock and certificate.
  for (const v1::UntestedWorker& u : job.spec().doctor().untested()) {
    auto w = known.find(u.worker_id());
    if (w == known.end() || w->second->state() != v1::WORKER_STATE_ALIVE) continue;
    v1::DoctorReport* out = summary.add_workers();
    out->set_worker_id(u.worker_id());
    out->set_host(w->second->host());
    out->set_process_index(-1);
    AddAgentFindings(*w->second, now, out);
  }
  for (const v1::DoctorReport& r : summary.workers()) {
    for (const v1::DoctorFinding& f : r.findings()) {
      if (f.verdict() == v1::DOCTOR_VERDICT_PROBLEM) summary.set_problems(summary.problems() + 1);
      if (f.verdict() == v1::DOCTOR_VERDICT_WARNING) summary.set_warnings(summary.warnings() + 1);
    }
  }
  return summary;
}

std::string FormatDoctor(const v1::DoctorSummary& summary, const FormatOptions& options) {
  Table table({"WORKER", "HOST", "CHECK", "RESULT", "SEEN"});
  std::string fixes;
  for (const v1::DoctorReport& r : summary.workers()) {
    bool first = true;
    for (const v1::DoctorFinding& f : r.findings()) {
      const bool problem = f.verdict() == v1::DOCTOR_VERDICT_PROBLEM;
      const bool warning = f.verdict() == v1::DOCTOR_VERDICT_WARNING;
      table.AddRow({first ? r.worker_id() : "", first ? r.host() : "", f.check(),
                    Cell(problem ? "PROBLEM" : warning ? "WARNING" : "ok",
                         problem ? kRed : warning ? kYellow : kGreen),
                    f.seen()});
      first = false;
      if (!f.fix().empty() && (problem || warning)) {
        absl::StrAppend(&fixes, "  ", r.worker_id(), " ", f.check(), ": ", f.fix(), "\n");
      }
    }
  }
  std::string out = table.Render(options.color);
  if (!fixes.empty()) absl::StrAppend(&out, "\nWhat to do:\n", fixes);
  if (!summary.untested().empty()) {
    absl::StrAppend(&out, "\nNot tested (no host checks or links):\n");
    for (const v1::UntestedWorker& u : summary.untested()) {
      absl::StrAppend(&out, "  ",
                      u.worker_id().empty()
                          ? u.reason()
                          : absl::StrCat(u.worker_id(), " (host ", u.host(), "): ", u.reason()),
                      "\n");
    }
  }
  const int tested = static_cast<int>(std::count_if(
      summary.workers().begin(), summary.workers().end(),
      [](const v1::DoctorReport& r) { return r.process_index() >= 0; }));
  absl::StrAppend(&out, "\n", summary.problems(),
                  summary.problems() == 1 ? " problem, " : " problems, ", summary.warnings(),
                  summary.warnings() == 1 ? " warning" : " warnings", " on ", tested,
                  tested == 1 ? " tested worker" : " tested workers", " (doctor job ",
                  summary.job_id(), ", ", JobStateName(summary.job_state()), ")\n");
  return out;
}

}  // namespace substrax::ctl
