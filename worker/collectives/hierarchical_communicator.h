// HierarchicalCommunicator: a Communicator over a group whose ranks sit on several hosts, with
// more than one rank on some host. Ranks of one host reach each other far faster (shared memory,
// or at least loopback) than the network, so the all-reduce, which carries the gradients and is
// by far the most frequent collective, is done in three levels:
//
//   1. inside each host: `local` all-reduces the host's ranks (kSum for kMean, else the op);
//   2. between hosts: the host's leader (its lowest group rank) all-reduces the host results
//      over `leaders`, one rank per host (same op);
//   3. inside each host: `local` broadcasts the leader's result to the host's other ranks.
//
// so each host sends its data over the network once, not once per rank. kMean multiplies the
// sum by 1/size() at the end, as GlooCommunicator does, so it is the mean over every rank of the
// group (not a mean of host means). Every rank ends with the leader's bits, and each level is
// deterministic for a fixed topology, so the result is bitwise the same on every rank and in
// every run with the same topology (though not bitwise the flat Gloo ring's: the summation
// order differs).
//
// The other collectives (AllGather, Broadcast, ReduceScatter, Barrier) run on `all`, a flat
// communicator over every rank with the group's own ranks, so their rank-order semantics are
// exactly those of a flat group.
//
// Errors: those of the part that failed (codes kept), annotated with the level ("inside host b",
// "between hosts"); afterwards every collective is FAILED_PRECONDITION. When a failure leaves the
// host's other ranks waiting for this rank inside the host (the leader failed between hosts), the
// local part is destroyed at once, so that they fail now (a peer gone) rather than at their
// timeout.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_HIERARCHICAL_COMMUNICATOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_HIERARCHICAL_COMMUNICATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/collectives/communicator.h"

namespace substrax {

// How the ranks of a group (given each rank's host, in rank order) fall on hosts.
struct HostTopology {
  explicit HostTopology(const std::vector<std::string>& host_of_rank);

  int num_hosts() const { return static_cast<int>(hosts.size()); }
  // The leader of host h: its lowest group rank, which is also its rank among the leaders (h).
  int leader_of_host(int h) const { return ranks_of_host[h].front(); }
  bool is_leader(int rank) const { return local_rank[rank] == 0; }

  // Hosts in order of their first rank, so that host h's leader has rank h among the leaders.
  std::vector<std::string> hosts;
  // The group ranks on each host, ascending: a rank's local rank is its index there.
  std::vector<std::vector<int>> ranks_of_host;
  // For each group rank: its host's index and its rank inside the host.
  std::vector<int> host_index;
  std::vector<int> local_rank;
};

// The parts of one rank's HierarchicalCommunicator (see the header comment).
struct HierarchicalParts {
  // The group's ranks on this rank's host; local rank = index among them in group-rank order.
  std::unique_ptr<Communicator> local;
  // One rank per host (their leaders), rank = host index; null on every rank but the leader.
  std::unique_ptr<Communicator> leaders;
  // Every rank of the group, with its group rank.
  std::unique_ptr<Communicator> all;
};

class HierarchicalCommunicator final : public Communicator {
 public:
  // Rank `rank` of the group whose rank r is on host host_of_rank[r]. Errors: INVALID_ARGUMENT
  // when the parts do not fit the topology (a missing part, a size or rank that differs from the
  // topology's: the message names the part).
  static absl::StatusOr<std::unique_ptr<HierarchicalCommunicator>> Create(
      std::string name, const std::vector<std::string>& host_of_rank, int rank,
      HierarchicalParts parts);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  // Forwarded to every part.
  void PeerDied(const std::string& who) override;

 protected:
  CollectiveEvent DoAllReduce(void* data, DataType type, size_t count, ReduceOp op,
                              ExecutionContext context) override;
  CollectiveEvent DoAllGather(const void* input, void* output, DataType type, size_t count,
                              ExecutionContext context) override;
  CollectiveEvent DoBroadcast(void* data, DataType type, size_t count, int root,
                              ExecutionContext context) override;
  CollectiveEvent DoReduceScatter(const void* input, void* output, DataType type, size_t count,
                                  ReduceOp op, ExecutionContext context) override;
  CollectiveEvent DoBarrier(ExecutionContext context) override;

 private:
  HierarchicalCommunicator(std::string name, int rank, int size, std::string host,
                           HierarchicalParts parts)
      : name_(std::move(name)),
        rank_(rank),
        size_(size),
        host_(std::move(host)),
        parts_(std::move(parts)) {}

  // INVALID_ARGUMENT for a CUDA stream (the parts move host memory on the calling thread); not a
  // failure of the group, as GlooCommunicator's.
  absl::Status CheckHost(const char* op, ExecutionContext context) const;
  // FAILED_PRECONDITION once a collective has failed, else OK.
  absl::Status Usable(const char* op) const;
  // Records a failure of `op` at `level` and returns it annotated.
  absl::Status Fail(const char* op, const std::string& level, const absl::Status& status);
  absl::Status AllReduceLevels(void* data, DataType type, size_t count, ReduceOp op,
                               ExecutionContext context);
  // Runs `op` on the flat part.
  template <typename Fn>
  CollectiveEvent OnAll(const char* op, ExecutionContext context, Fn&& fn);

  const std::string name_;
  const int rank_;
  const int size_;
  const std::string host_;  // this rank's host, for messages
  HierarchicalParts parts_;
  absl::Status broken_;
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_HIERARCHICAL_COMMUNICATOR_H_
