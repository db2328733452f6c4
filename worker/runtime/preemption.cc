#include "worker/runtime/preemption.h"

#include <signal.h>

#include <atomic>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "contract/stop_signal.h"

namespace substrax {
namespace {

// Lock-free (static_assert below): the only kind of object a signal handler may write.
std::atomic<bool> sigterm_received{false};
static_assert(std::atomic<bool>::is_always_lock_free);
constexpr char kStoppedPayload[] = "type.substrax.dev/StoppedBySigterm";

void OnSigterm(int, siginfo_t* info, void*) {
  // The next SIGTERM kills, as if this handler had never been there (signal() and raise() are
  // async-signal-safe).
  signal(SIGTERM, SIG_DFL);
  if (info != nullptr && info->si_code == SI_QUEUE &&
      info->si_value.sival_int == kFenceSigtermValue) {
    // A fence: the attempt may already run elsewhere; end now (delivered when this returns).
    raise(SIGTERM);
    return;
  }
  sigterm_received.store(true);
}

}  // namespace

void InstallSigtermFlag() {
  struct sigaction action = {};
  action.sa_sigaction = OnSigterm;
  sigemptyset(&action.sa_mask);
  // Slow system calls (reads of sockets, waits) go on instead of failing with EINTR.
  action.sa_flags = SA_RESTART | SA_SIGINFO;
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
