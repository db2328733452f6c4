#include "worker/collectives/cpu_group_connector.h"

#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace substrax {

const char* CpuCollectivesName(CpuCollectives collectives) {
  switch (collectives) {
    case CpuCollectives::kAuto:
      return "auto";
    case CpuCollectives::kGloo:
      return "gloo";
  }
  return "unknown";
}

absl::StatusOr<CpuCollectives> ParseCpuCollectives(absl::string_view name) {
  for (CpuCollectives c : {CpuCollectives::kAuto, CpuCollectives::kGloo}) {
    if (name == CpuCollectivesName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "'", name,
      "' is not a CPU collectives choice: 'auto' (per group: shared memory inside a host, "
      "hierarchical across hosts) or 'gloo' (flat Gloo over TCP for every group)"));
}

LocalFactory GlooLocalFactory(const std::string& listen_host) {
  LocalFactory factory;
  factory.description = "Gloo";
  factory.create =
      [listen_host](const LocalCommunicatorOptions& options, Store* store, int rank,
                    std::vector<RankInfo> ranks,
                    const PeerMonitor* monitor) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    GlooCommunicatorOptions gloo;
    gloo.name = options.name;
    gloo.timeout = options.timeout;
    gloo.connect_timeout = options.connect_timeout;
    gloo.listen_host = listen_host;
    return GlooCommunicator::Create(gloo, store, rank, std::move(ranks), monitor);
  };
  return factory;
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuGroupConnector::Gloo(
    const std::string& name, const std::string& prefix, int rank,
    std::vector<RankInfo> ranks) const {
  GlooCommunicatorOptions options = options_.gloo;
  options.name = name;
  PrefixStore store(store_, prefix);
  return GlooCommunicator::Create(options, &store, rank, std::move(ranks), monitor_);
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuGroupConnector::Local(
    const std::string& name, const std::string& prefix, int rank,
    std::vector<RankInfo> ranks) const {
  const LocalCommunicatorOptions options{name, options_.gloo.timeout,
                                         options_.gloo.connect_timeout};
  PrefixStore store(store_, prefix);
  return options_.local.create(options, &store, rank, std::move(ranks), monitor_);
}

namespace {

// "1 host", "2 hosts".
std::string Count(int n, const char* what) { return absl::StrCat(n, " ", what, n == 1 ? "" : "s"); }

}  // namespace

void CpuGroupConnector::Log(const CommunicatorGroup& group, const std::string& path) const {
  const int me = process_of_position_[group.positions[group.rank]];
  for (int r = 0; r < group.rank; ++r) {
    if (process_of_position_[group.positions[r]] == me) return;  // an earlier rank logs it
  }
  const std::string line =
      absl::StrCat("collectives: ", group.name, " (",
                   Count(static_cast<int>(group.members.size()), "rank"), "): ", path);
  if (options_.log) {
    options_.log(line);
  } else {
    // One write, so that lines of several device threads do not interleave.
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuGroupConnector::ConnectWorld(
    const CommunicatorGroup& world) {
  SUBSTRAX_ASSIGN_OR_RETURN(std::vector<RankInfo> ranks, RanksOfGroup(world, process_of_position_));
  std::vector<std::string> host_of_rank;
  for (const Device& d : world.members) host_of_rank.push_back(d.host);
  const HostTopology topology(host_of_rank);
  const int hosts = topology.num_hosts();
  if (options_.collectives == CpuCollectives::kGloo) {
    Log(world, absl::StrCat("Gloo (cpu collectives 'gloo'): ", Count(hosts, "host")));
    return Gloo(world.name, world.store_prefix, world.rank, std::move(ranks));
  }
  if (!options_.local.create) {
    return absl::InvalidArgumentError(absl::StrCat(
        "connecting communicator '", world.name,
        "': CPU collectives 'auto' need a factory for the communicators inside a host"));
  }
  if (hosts == 1) {
    Log(world,
        absl::StrCat("one host (", topology.hosts.front(), "): ", options_.local.description));
    return Local(world.name, absl::StrCat(world.store_prefix, "/local/0"), world.rank,
                 std::move(ranks));
  }
  if (hosts == static_cast<int>(ranks.size())) {
    Log(world, absl::StrCat("Gloo: ", hosts, " hosts, one rank on each"));
    return Gloo(world.name, world.store_prefix, world.rank, std::move(ranks));
  }
  Log(world, absl::StrCat("hierarchical: ", hosts, " hosts (", options_.local.description,
                          " inside a host, Gloo between hosts)"));
  return Hierarchical(world, host_of_rank, topology, ranks);
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuGroupConnector::Hierarchical(
    const CommunicatorGroup& group, const std::vector<std::string>& host_of_rank,
    const HostTopology& topology, const std::vector<RankInfo>& ranks) {
  const int host = topology.host_index[group.rank];
  const std::string& host_name = topology.hosts[host];
  auto subset = [&ranks](const std::vector<int>& members) {
    std::vector<RankInfo> out;
    for (int r : members) out.push_back(ranks[r]);
    return out;
  };
  // The order every member follows (local, leaders, all): see the header comment.
  HierarchicalParts parts;
  SUBSTRAX_ASSIGN_OR_RETURN(
      parts.local, Local(absl::StrCat(group.name, " inside host ", host_name),
                         absl::StrCat(group.store_prefix, "/local/", host),
                         topology.local_rank[group.rank], subset(topology.ranks_of_host[host])));
  if (topology.is_leader(group.rank)) {
    std::vector<int> leaders;
    for (int h = 0; h < topology.num_hosts(); ++h) leaders.push_back(topology.leader_of_host(h));
    SUBSTRAX_ASSIGN_OR_RETURN(
        parts.leaders, Gloo(absl::StrCat(group.name, " between hosts"),
                            absl::StrCat(group.store_prefix, "/leaders"), host, subset(leaders)));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(
      parts.all, Gloo(group.name, absl::StrCat(group.store_prefix, "/all"), group.rank, ranks));
  SUBSTRAX_ASSIGN_OR_RETURN(
      std::unique_ptr<HierarchicalCommunicator> comm,
      HierarchicalCommunicator::Create(group.name, host_of_rank, group.rank, std::move(parts)));
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::StatusOr<std::unique_ptr<Communicator>> CpuGroupConnector::ConnectAxis(
    Communicator&, const CommunicatorGroup& group) {
  return ConnectWorld(group);
}

}  // namespace substrax
