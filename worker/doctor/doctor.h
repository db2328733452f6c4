// The doctor's job process (`substrax-job run` for a job with spec.doctor, started by the agent
// through the launch contract like every job process; `substraxctl doctor`, docs/diagnosis.md):
// checks its host (checks.h, gpu.h), measures its links to the other processes of the doctor
// job (links.h) and writes what it found in its result (ReportAttemptStatusRequest.doctor),
// which its agent reports to the coordinator.
#ifndef SUBSTRAX_WORKER_DOCTOR_DOCTOR_H_
#define SUBSTRAX_WORKER_DOCTOR_DOCTOR_H_

#include <vector>

#include "absl/status/status.h"
#include "substrax/v1/job.pb.h"
#include "substrax/v1/program.pb.h"
#include "worker/doctor/checks.h"
#include "worker/doctor/links.h"

namespace substrax::doctor {

// The report of process `process_index` from its findings and links.
v1::DoctorReport ToReport(int process_index, const std::vector<Finding>& findings,
                          const std::vector<Link>& links);

// Runs the launch's doctor process. Errors: joining the job (also written to the result file);
// a failed check is a finding, not an error.
absl::Status RunDoctorProcess(v1::ProgramLaunch launch);

}  // namespace substrax::doctor

#endif  // SUBSTRAX_WORKER_DOCTOR_DOCTOR_H_
