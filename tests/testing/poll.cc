#include "tests/testing/poll.h"

#include <signal.h>
#include <sys/wait.h>

namespace substrax::testing {

std::optional<int> WaitOrKill(pid_t pid, absl::Time deadline) {
  int status = 0;
  const bool ended = PollUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; }, deadline,
                               "the child to exit");
  if (!ended) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return std::nullopt;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace substrax::testing
