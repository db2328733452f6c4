// PeerMonitor: knows which other processes of a job have died, within milliseconds.
//
// Every process holds one TCP connection to every other. A process that ends normally says
// goodbye first; one that dies (crash, SIGKILL, OOM kill) has its sockets closed by its kernel,
// which every peer sees at once as end-of-stream without goodbye. Collectives consult the
// monitor when they fail, so that an error names the dead process and its ranks instead of
// "connection reset" on one rank and a bare timeout on another (Gloo only notices a dead peer
// on the connections an algorithm happens to use).
//
// A whole host that vanishes without closing its sockets is not seen here; the coordinator's
// worker leases cover that case.
//
// Thread-safe. One monitor per process, shared by all its device threads.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_PEER_MONITOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_PEER_MONITOR_H_

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collectives/store.h"

namespace substrax {

class PeerMonitor {
 public:
  struct Options {
    // This process and how many there are.
    int process_index = 0;
    int num_processes = 1;
    // Address to listen on; peers connect to it. An IP address or a host name.
    std::string listen_host = "127.0.0.1";
    // How long to wait for every peer to publish its address and connect.
    absl::Duration connect_timeout = absl::Seconds(60);
  };

  struct Death {
    int process_index = 0;
    absl::Time time;
    // What was seen: "connection closed without goodbye", "connection reset by peer".
    std::string reason;
  };

  // Listens, publishes this process's address under "peer_monitor/<index>" in `store`, and
  // connects with every other process. Errors: INVALID_ARGUMENT (bad options), UNAVAILABLE (cannot
  // listen or connect), DEADLINE_EXCEEDED (a peer did not appear within connect_timeout; the
  // message names it).
  static absl::StatusOr<std::unique_ptr<PeerMonitor>> Start(const Options& options, Store* store);

  // Says goodbye to every peer (a clean exit is not a death) and stops watching.
  ~PeerMonitor();

  // Deaths seen so far, in the order seen.
  std::vector<Death> Deaths() const;
  // Waits until at least one death is known or `timeout` passes; true if one is known.
  bool AwaitDeath(absl::Duration timeout) const;

  int process_index() const { return options_.process_index; }

 private:
  PeerMonitor(const Options& options, int listen_fd, int wake_read, int wake_write);
  absl::Status Connect(Store* store);
  void Watch();

  const Options options_;
  const int listen_fd_;
  const int wake_read_, wake_write_;
  // Connected sockets, and the process at the other end of each.
  std::vector<int> fds_;
  std::vector<int> peer_of_fd_;
  std::thread watcher_;

  mutable absl::Mutex mu_;
  std::vector<Death> deaths_ ABSL_GUARDED_BY(mu_);
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_PEER_MONITOR_H_
