#include "worker/collectives/gloo_errors.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gloo/common/error.h"
#include "gloo/common/logging.h"

namespace substrax {

GlooErrorKind ClassifyCurrentGlooException(std::string* message) {
  try {
    throw;
  } catch (const gloo::IoException& e) {
    *message = e.what();
    return absl::StrContains(*message, "Timed out") ? GlooErrorKind::kTimeout : GlooErrorKind::kIo;
  } catch (const gloo::EnforceNotMet& e) {
    *message = e.what();
    return GlooErrorKind::kMisuse;
  } catch (const gloo::InvalidOperationException& e) {
    *message = e.what();
    return GlooErrorKind::kInvalidOperation;
  } catch (const std::exception& e) {
    *message = e.what();
    return GlooErrorKind::kOther;
  } catch (...) {
    *message = "unknown exception";
    return GlooErrorKind::kOther;
  }
}

absl::Status TranslateGlooError(GlooErrorKind kind, absl::string_view gloo_message,
                                const CollectiveCall& call,
                                const std::vector<PeerMonitor::Death>& deaths) {
  const std::string where =
      absl::StrCat(call.op, " on communicator '", call.communicator, "' (rank ", call.rank, " of ",
                   call.size, ", ", call.self, ") failed: ");
  if ((kind == GlooErrorKind::kIo || kind == GlooErrorKind::kTimeout) && !deaths.empty()) {
    std::vector<std::string> dead;
    for (const PeerMonitor::Death& d : deaths) {
      std::string ranks = "no ranks of this group";
      if (d.process_index >= 0 &&
          d.process_index < static_cast<int>(call.ranks_of_process.size()) &&
          !call.ranks_of_process[d.process_index].empty()) {
        const auto& r = call.ranks_of_process[d.process_index];
        ranks = absl::StrCat(r.size() == 1 ? "rank " : "ranks ", absl::StrJoin(r, ", "));
      }
      std::string who;
      if (d.process_index >= 0 && d.process_index < static_cast<int>(call.process_names.size()) &&
          !call.process_names[d.process_index].empty()) {
        who = call.process_names[d.process_index] + ", ";
      }
      dead.push_back(
          absl::StrCat("process ", d.process_index, " (", who, ranks, ") died: ", d.reason));
    }
    return absl::UnavailableError(absl::StrCat(
        where, absl::StrJoin(dead, "; "),
        ". The job attempt cannot continue; check the dead process's log. (gloo: ", gloo_message,
        ")"));
  }
  switch (kind) {
    case GlooErrorKind::kIo:
      return absl::UnavailableError(absl::StrCat(
          where, "a connection to a peer broke and no process is known to have died; check the "
                 "network and the other processes' logs (gloo: ",
          gloo_message, ")"));
    case GlooErrorKind::kTimeout:
      return absl::DeadlineExceededError(absl::StrCat(
          where, "it did not complete within its timeout and every peer is still alive: a peer "
                 "is stuck, far slower, or called a different collective (gloo: ",
          gloo_message, ")"));
    case GlooErrorKind::kMisuse:
      return absl::InvalidArgumentError(
          absl::StrCat(where, "gloo rejected the call (", gloo_message, ")"));
    case GlooErrorKind::kInvalidOperation:
      return absl::FailedPreconditionError(absl::StrCat(
          where, "the communicator cannot run it in its current state (", gloo_message, ")"));
    case GlooErrorKind::kOther:
      break;
  }
  return absl::InternalError(absl::StrCat(where, gloo_message));
}

}  // namespace substrax
