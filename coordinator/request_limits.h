// The size limits of every request the coordinator serves, checked by the rpc layer
// (server_calls.cc, server_heartbeats.cc) before a request reaches the Cluster or the
// Rendezvous, so that nothing a client sends is stored or relayed unbounded: names (ids, hosts,
// metric names) at most limits::kMaxNameBytes, paths kMaxPathBytes, a cancel reason
// kMaxReasonBytes, and every repeated field its own count (limits.h). docs/operations.md lists
// them per rpc.
//
// What the Cluster and the Rendezvous check themselves, with the state they need, stays there:
// a spec's size and contents (SubmitJob), a registration's devices and roots (RegisterWorker),
// runners per heartbeat, step reports (CheckReportLimits), checkpoint records' count and paths,
// a shipped log piece's size, rendezvous keys, values and totals. The text a runner reports about
// its failure (error, stderr tail) is cut, not refused: a failing process's report must land.
//
// Every function answers OK or INVALID_ARGUMENT naming the field (as a path into the request,
// "final_metrics name 'xx...'") and the limit. Pure; thread-safe.
#ifndef SUBSTRAX_COORDINATOR_REQUEST_LIMITS_H_
#define SUBSTRAX_COORDINATOR_REQUEST_LIMITS_H_

#include "absl/status/status.h"
#include "substrax/v1/coordinator_service.pb.h"
#include "substrax/v1/job_service.pb.h"
#include "substrax/v1/metrics_service.pb.h"

namespace substrax {

// CoordinatorService (the daemons and the runners).
absl::Status CheckRequest(const v1::RegisterWorkerRequest& request);
absl::Status CheckRequest(const v1::HeartbeatRequest& request);
absl::Status CheckRequest(const v1::WatchAssignmentsRequest& request);
absl::Status CheckRequest(const v1::ReportStepsRequest& request);
absl::Status CheckRequest(const v1::ReportAttemptStatusRequest& request);
absl::Status CheckRequest(const v1::ReportCheckpointsRequest& request);
absl::Status CheckRequest(const v1::KeyValueSetRequest& request);
absl::Status CheckRequest(const v1::KeyValueGetRequest& request);
absl::Status CheckRequest(const v1::BarrierRequest& request);
absl::Status CheckRequest(const v1::ShipLogsRequest& request);

// JobService (users).
absl::Status CheckRequest(const v1::SubmitJobRequest& request);
absl::Status CheckRequest(const v1::GetJobRequest& request);
absl::Status CheckRequest(const v1::DiagnoseJobRequest& request);
absl::Status CheckRequest(const v1::RunDoctorRequest& request);
absl::Status CheckRequest(const v1::ListJobsRequest& request);
absl::Status CheckRequest(const v1::CancelJobRequest& request);
absl::Status CheckRequest(const v1::DeleteJobRequest& request);
absl::Status CheckRequest(const v1::WatchJobRequest& request);
absl::Status CheckRequest(const v1::ListWorkersRequest& request);
absl::Status CheckRequest(const v1::ListQueuesRequest& request);
absl::Status CheckRequest(const v1::GetMeshRequest& request);
absl::Status CheckRequest(const v1::ReadLogsRequest& request);

// MetricsService.
absl::Status CheckRequest(const v1::QueryMetricsRequest& request);

}  // namespace substrax

#endif  // SUBSTRAX_COORDINATOR_REQUEST_LIMITS_H_
