// allreduce_mpi: the Open MPI peer of //bench:allreduce, which runs it under mpirun with the
// same plan flags (see allreduce_common.h). Every rank runs the plan with MPI_Allreduce (sum,
// float32, in place); rank 0 prints one line per size:
//
//   result <bytes> <timed iterations> <median seconds of the slowest rank> <wrong elements>
//
// Exit status: 0 when every size ran (wrong elements are reported, not judged here: the
// launcher fails the run); 1 when MPI failed; CLI11's codes for a bad command line.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/allreduce_common.h"
#include "core/status.h"

namespace substrax::bench {
namespace {

absl::Status MpiStatus(int code, const char* what) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return absl::UnavailableError(absl::StrCat(what, " failed: ", text));
}

absl::Status Run(const PlanOptions& options, int rank, int num_ranks) {
  const std::vector<SizePlan> plan = MakePlan(options);
  if (plan.empty()) return absl::OkStatus();
  const AllReducePeer mpi{
      "MPI",
      [](absl::Span<float> data) {
        return MpiStatus(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()),
                                       MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                         "MPI_Allreduce");
      },
      [] { return MpiStatus(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); },
  };

  std::vector<float> buffer(plan.back().elements());
  int iteration = 0;
  for (const SizePlan& size : plan) {
    std::vector<Samples> samples;
    SUBSTRAX_RETURN_IF_ERROR(RunSize({&mpi}, options, size, rank, num_ranks, &iteration,
                                     absl::MakeSpan(buffer).subspan(0, size.elements()), &samples));
    const int count = static_cast<int>(samples[0].seconds.size());
    std::vector<double> all(rank == 0 ? count * num_ranks : 0);
    SUBSTRAX_RETURN_IF_ERROR(MpiStatus(MPI_Gather(samples[0].seconds.data(), count, MPI_DOUBLE,
                                                  all.data(), count, MPI_DOUBLE, 0, MPI_COMM_WORLD),
                                       "MPI_Gather"));
    long long wrong = 0;
    const long long mine = samples[0].wrong_elements;
    SUBSTRAX_RETURN_IF_ERROR(MpiStatus(
        MPI_Reduce(&mine, &wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD), "MPI_Reduce"));
    if (rank != 0) continue;
    std::vector<std::vector<double>> per_rank;
    for (int r = 0; r < num_ranks; ++r) {
      per_rank.emplace_back(all.begin() + r * count, all.begin() + (r + 1) * count);
    }
    std::printf("result %lld %d %.9e %lld\n", static_cast<long long>(size.bytes), count,
                MedianOfSlowestRank(per_rank), wrong);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace substrax::bench

int main(int argc, char** argv) {
  substrax::bench::PlanOptions options;
  CLI::App app{"Open MPI peer of //bench:allreduce; run by it under mpirun"};
  substrax::bench::AddPlanFlags(app, &options);
  CLI11_PARSE(app, argc, argv);

  MPI_Init(&argc, &argv);
  // Errors come back as codes, so that a failure is reported with what was running.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, num_ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &num_ranks);
  const absl::Status status = substrax::bench::Run(options, rank, num_ranks);
  if (!status.ok()) {
    std::fprintf(stderr, "allreduce_mpi rank %d of %d: %s\n", rank, num_ranks,
                 status.ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
