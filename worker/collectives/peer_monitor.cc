#include "worker/collectives/peer_monitor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/status.h"

namespace substrax {
namespace {

constexpr char kGoodbye = 'B';

std::string Errno(const char* what) { return absl::StrCat(what, ": ", std::strerror(errno)); }

// Resolves host:port to an IPv4 address.
absl::StatusOr<sockaddr_in> Resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0 || result == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", ::gai_strerror(rc)));
  }
  sockaddr_in addr = *reinterpret_cast<sockaddr_in*>(result->ai_addr);
  ::freeaddrinfo(result);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  return addr;
}

bool WriteAll(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly `size` bytes, waiting up to `deadline`.
bool ReadAll(int fd, void* data, size_t size, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    pollfd pfd{fd, POLLIN, 0};
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(ms, 1000)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      if (absl::Now() >= deadline) return false;
      continue;
    }
    const ssize_t n = ::recv(fd, p, size, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PeerMonitor>> PeerMonitor::Start(const Options& options,
                                                                Store* store) {
  if (options.num_processes < 1 || options.process_index < 0 ||
      options.process_index >= options.num_processes) {
    return absl::InvalidArgumentError(absl::StrCat("peer monitor: process ", options.process_index,
                                                   " of ", options.num_processes));
  }
  SUBSTRAX_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(options.listen_host, 0));
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(Errno("peer monitor: socket"));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, options.num_processes) != 0) {
    const std::string error = Errno("peer monitor: listen");
    ::close(fd);
    return absl::UnavailableError(absl::StrCat(error, " on ", options.listen_host));
  }
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) {
    ::close(fd);
    return absl::UnavailableError(Errno("peer monitor: pipe"));
  }
  std::unique_ptr<PeerMonitor> monitor(new PeerMonitor(options, fd, wake[0], wake[1]));
  SUBSTRAX_RETURN_IF_ERROR(monitor->Connect(store));
  monitor->watcher_ = std::thread([m = monitor.get()] { m->Watch(); });
  return monitor;
}

PeerMonitor::PeerMonitor(const Options& options, int listen_fd, int wake_read, int wake_write)
    : options_(options), listen_fd_(listen_fd), wake_read_(wake_read), wake_write_(wake_write) {}

absl::Status PeerMonitor::Connect(Store* store) {
  sockaddr_in self{};
  socklen_t len = sizeof(self);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&self), &len);
  const std::string key_prefix = "peer_monitor/";
  SUBSTRAX_RETURN_IF_ERROR(store->Set(absl::StrCat(key_prefix, options_.process_index),
                                      absl::StrCat(options_.listen_host, ":", ntohs(self.sin_port))));
  const absl::Time deadline = absl::Now() + options_.connect_timeout;
  const int32_t me = options_.process_index;

  // One connection per pair: a process dials every higher index and accepts every lower one.
  for (int peer = me + 1; peer < options_.num_processes; ++peer) {
    auto address = store->Get(absl::StrCat(key_prefix, peer), deadline - absl::Now());
    if (!address.ok()) {
      return Annotate(address.status(), absl::StrCat("peer monitor: process ", peer));
    }
    std::pair<std::string, std::string> host_port = absl::StrSplit(*address, ':');
    int port = 0;
    if (!absl::SimpleAtoi(host_port.second, &port)) {
      return absl::UnavailableError(absl::StrCat("peer monitor: bad address '", *address,
                                                 "' published by process ", peer));
    }
    SUBSTRAX_ASSIGN_OR_RETURN(sockaddr_in addr, Resolve(host_port.first, port));
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        !WriteAll(fd, &me, sizeof(me))) {
      const std::string error = Errno("connect");
      if (fd >= 0) ::close(fd);
      return absl::UnavailableError(absl::StrCat("peer monitor: cannot reach process ", peer,
                                                 " at ", *address, ": ", error));
    }
    fds_.push_back(fd);
    peer_of_fd_.push_back(peer);
  }
  for (int accepted = 0; accepted < me; ++accepted) {
    pollfd pfd{listen_fd_, POLLIN, 0};
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (ms <= 0 || ::poll(&pfd, 1, static_cast<int>(ms)) <= 0) {
      return absl::DeadlineExceededError(absl::StrCat(
          "peer monitor: only ", accepted, " of the ", me, " lower-numbered processes connected within ",
          absl::FormatDuration(options_.connect_timeout)));
    }
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    int32_t peer = -1;
    if (fd < 0 || !ReadAll(fd, &peer, sizeof(peer), deadline) || peer < 0 || peer >= me) {
      if (fd >= 0) ::close(fd);
      return absl::UnavailableError(absl::StrCat("peer monitor: bad connection from a peer (",
                                                 peer, ")"));
    }
    fds_.push_back(fd);
    peer_of_fd_.push_back(peer);
  }
  return absl::OkStatus();
}

void PeerMonitor::Watch() {
  std::vector<bool> open(fds_.size(), true);
  std::vector<bool> said_goodbye(fds_.size(), false);
  while (true) {
    std::vector<pollfd> pfds;
    std::vector<size_t> which;
    pfds.push_back({wake_read_, POLLIN, 0});
    for (size_t i = 0; i < fds_.size(); ++i) {
      if (!open[i]) continue;
      pfds.push_back({fds_[i], POLLIN, 0});
      which.push_back(i);
    }
    if (::poll(pfds.data(), pfds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (pfds[0].revents != 0) return;  // asked to stop
    for (size_t k = 1; k < pfds.size(); ++k) {
      if (pfds[k].revents == 0) continue;
      const size_t i = which[k - 1];
      char buffer[64];
      const ssize_t n = ::recv(fds_[i], buffer, sizeof(buffer), 0);
      if (n > 0) {
        said_goodbye[i] = said_goodbye[i] || std::find(buffer, buffer + n, kGoodbye) != buffer + n;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      open[i] = false;
      if (said_goodbye[i]) continue;
      const std::string reason = n == 0 ? std::string("its connection closed without goodbye")
                                        : absl::StrCat("its connection failed: ", std::strerror(errno));
      absl::MutexLock lock(&mu_);
      deaths_.push_back({peer_of_fd_[i], absl::Now(), reason});
    }
  }
}

PeerMonitor::~PeerMonitor() {
  for (int fd : fds_) WriteAll(fd, &kGoodbye, 1);
  const char stop = 's';
  (void)!::write(wake_write_, &stop, 1);
  if (watcher_.joinable()) watcher_.join();
  for (int fd : fds_) ::close(fd);
  ::close(listen_fd_);
  ::close(wake_read_);
  ::close(wake_write_);
}

std::vector<PeerMonitor::Death> PeerMonitor::Deaths() const {
  absl::MutexLock lock(&mu_);
  return deaths_;
}

bool PeerMonitor::AwaitDeath(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !deaths_.empty(); };
  return mu_.AwaitWithTimeout(absl::Condition(&any), timeout);
}

}  // namespace substrax
