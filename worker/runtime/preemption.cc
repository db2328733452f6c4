#include "worker/runtime/preemption.h"

#include <signal.h>

#include <atomic>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace substrax {
namespace {

// Lock-free (static_assert below): the only kind of object a signal handler may write.
std::atomic<bool> sigterm_received{false};
static_assert(std::atomic<bool>::is_always_lock_free);
std::atomic<bool> installed{false};

constexpr char kStoppedPayload[] = "type.substrax.dev/StoppedBySigterm";

void OnSigterm(int) {
  sigterm_received.store(true);
  // The next SIGTERM kills, as if this handler had never been there (signal() is
  // async-signal-safe).
  signal(SIGTERM, SIG_DFL);
}

}  // namespace

void InstallSigtermFlag() {
  if (installed.exchange(true)) return;
  struct sigaction action = {};
  action.sa_handler = OnSigterm;
  sigemptyset(&action.sa_mask);
  // Slow system calls (reads of sockets, waits) go on instead of failing with EINTR.
  action.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &action, nullptr);
}

bool SigtermReceived() { return sigterm_received.load(); }

void SetSigtermReceivedForTest(bool received) { sigterm_received.store(received); }

absl::Status StoppedBySigterm(int64_t step, bool checkpointed) {
  absl::Status status = absl::AbortedError(absl::StrCat(
      "stopped after step ", step, " by SIGTERM (preempted); ",
      checkpointed ? absl::StrCat("checkpoint of step ", step, " written")
                   : std::string("no checkpoint: the spec has none")));
  status.SetPayload(kStoppedPayload, absl::Cord(absl::StrCat(step)));
  return status;
}

bool IsStoppedBySigterm(const absl::Status& status) {
  return status.GetPayload(kStoppedPayload).has_value();
}

}  // namespace substrax
