// allreduce_mpi: the Open MPI peer of //bench:allreduce, which runs it under mpirun with the
// same plan flags (see allreduce_common.h). Every rank runs the plan with MPI_Allreduce (sum,
// float32, in place). With --shm_store=DIR the same two processes also connect our
// ShmCommunicator (cross-process mode, meeting through a FileStore in DIR) and the two take
// turns iteration by iteration, as ours and raw Gloo do in //bench:allreduce: the only way to
// compare two shared-memory all-reduces on a shared machine, whose load moves the median of one
// peer run alone by 2x or more from minute to minute. Rank 0 prints one line per peer and size:
//
//   result <peer> <bytes> <timed iterations> <median seconds of the slowest rank> <wrong elements>
//
// where <peer> is "mpi" or "shm". Exit status: 0 when every size ran (wrong elements are
// reported, not judged here: the launcher fails the run); 1 when MPI or the ShmCommunicator
// failed; CLI11's codes for a bad command line.
#include <mpi.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/allreduce_common.h"
#include "core/status.h"
#include "worker/collectives/shm_communicator.h"
#include "worker/collectives/store.h"

namespace substrax::bench {
namespace {

absl::Status MpiStatus(int code, const char* what) {
  if (code == MPI_SUCCESS) return absl::OkStatus();
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return absl::UnavailableError(absl::StrCat(what, " failed: ", text));
}

// Gathers every rank's samples of one peer at one size on rank 0 and prints its result line.
absl::Status Report(const char* peer, const SizePlan& size, const Samples& samples, int rank,
                    int num_ranks) {
  const int count = static_cast<int>(samples.seconds.size());
  std::vector<double> all(rank == 0 ? count * num_ranks : 0);
  SUBSTRAX_RETURN_IF_ERROR(
      MpiStatus(MPI_Gather(samples.seconds.data(), count, MPI_DOUBLE, all.data(), count,
                           MPI_DOUBLE, 0, MPI_COMM_WORLD),
                "MPI_Gather"));
  long long wrong = 0;
  const long long mine = samples.wrong_elements;
  SUBSTRAX_RETURN_IF_ERROR(MpiStatus(
      MPI_Reduce(&mine, &wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD), "MPI_Reduce"));
  if (rank != 0) return absl::OkStatus();
  std::vector<std::vector<double>> per_rank;
  for (int r = 0; r < num_ranks; ++r) {
    per_rank.emplace_back(all.begin() + r * count, all.begin() + (r + 1) * count);
  }
  std::printf("result %s %lld %d %.9e %lld\n", peer, static_cast<long long>(size.bytes), count,
              MedianOfSlowestRank(per_rank), wrong);
  std::fflush(stdout);
  return absl::OkStatus();
}

absl::Status Run(const PlanOptions& options, const std::string& shm_store, ShmWrites writes,
                 int rank, int num_ranks) {
  const std::vector<SizePlan> plan = MakePlan(options);
  if (plan.empty()) return absl::OkStatus();
  const AllReducePeer mpi{
      "mpi",
      [](absl::Span<float> data) {
        return MpiStatus(MPI_Allreduce(MPI_IN_PLACE, data.data(), static_cast<int>(data.size()),
                                       MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
                         "MPI_Allreduce");
      },
      [] { return MpiStatus(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); },
  };
  std::vector<const AllReducePeer*> peers = {&mpi};

  // Our ShmCommunicator, as //bench:allreduce connects it (default options but `writes`); no
  // PeerMonitor: mpirun ends the job when a rank dies.
  std::unique_ptr<FileStore> store;
  std::unique_ptr<ShmCommunicator> shm_comm;
  std::optional<AllReducePeer> shm;
  if (!shm_store.empty()) {
    SUBSTRAX_ASSIGN_OR_RETURN(store, FileStore::Create(shm_store));
    std::vector<RankInfo> ranks(num_ranks);
    for (int r = 0; r < num_ranks; ++r) {
      ranks[r].process_index = r;
      ranks[r].description = absl::StrCat("MPI rank ", r);
    }
    ShmCommunicatorOptions shm_options;
    shm_options.writes = writes;
    SUBSTRAX_ASSIGN_OR_RETURN(shm_comm, ShmCommunicator::Create(shm_options, store.get(), rank,
                                                                ranks, /*monitor=*/nullptr));
    shm = AllReducePeer{
        "shm",
        [&](absl::Span<float> data) { return shm_comm->AllReduce(data, ReduceOp::kSum); },
        [&] { return shm_comm->Barrier(); },
    };
    peers.push_back(&*shm);
  }

  std::vector<float> buffer(plan.back().elements());
  int iteration = 0;
  for (const SizePlan& size : plan) {
    std::vector<Samples> samples;
    SUBSTRAX_RETURN_IF_ERROR(RunSize(peers, options, size, rank, num_ranks, &iteration,
                                     absl::MakeSpan(buffer).subspan(0, size.elements()), &samples));
    for (size_t p = 0; p < peers.size(); ++p) {
      SUBSTRAX_RETURN_IF_ERROR(Report(peers[p]->name.c_str(), size, samples[p], rank, num_ranks));
    }
  }
  // Neither rank unmaps the segment while the other still runs its last call.
  if (shm.has_value()) SUBSTRAX_RETURN_IF_ERROR(shm->barrier());
  return absl::OkStatus();
}

}  // namespace
}  // namespace substrax::bench

int main(int argc, char** argv) {
  substrax::bench::PlanOptions options;
  CLI::App app{"Open MPI peer of //bench:allreduce; run by it under mpirun"};
  substrax::bench::AddPlanFlags(app, &options);
  std::string shm_store;
  app.add_option("--shm_store", shm_store,
                 "directory of a FileStore: also run our ShmCommunicator, taking turns with MPI");
  std::string writes = "auto";
  app.add_option("--shm_writes", writes,
                 "the ShmCommunicator's stores into its segment: auto (measured), cached or "
                 "streaming")
      ->check(CLI::IsMember({"auto", "cached", "streaming"}));
  CLI11_PARSE(app, argc, argv);
  const substrax::ShmWrites shm_writes = writes == "cached"      ? substrax::ShmWrites::kCached
                                         : writes == "streaming" ? substrax::ShmWrites::kStreaming
                                                                 : substrax::ShmWrites::kAuto;

  MPI_Init(&argc, &argv);
  // Errors come back as codes, so that a failure is reported with what was running.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, num_ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &num_ranks);
  const absl::Status status = substrax::bench::Run(options, shm_store, shm_writes, rank, num_ranks);
  if (!status.ok()) {
    std::fprintf(stderr, "allreduce_mpi rank %d of %d: %s\n", rank, num_ranks,
                 status.ToString().c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return 0;
}
