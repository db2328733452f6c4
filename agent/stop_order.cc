#include "agent/stop_order.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "rpc/proto_time.h"

namespace substrax {

StopOrder StopOrderOf(const v1::StopAttempt& stop, absl::Duration stop_grace,
                      absl::string_view from) {
  StopOrder order;
  order.preempt = stop.preempt();
  order.grace = stop_grace;
  if (!order.preempt) {
    order.reason = absl::StrCat(from, stop.reason());
    return order;
  }
  // The coordinator keeps the attempt running (its store and tokens valid) for its grace: the
  // agent's own, when longer, is the floor it was configured with.
  if (stop.has_grace()) order.grace = std::max(stop_grace, FromProtoDuration(stop.grace()));
  order.reason = absl::StrCat("preempted: ", from, stop.reason());
  return order;
}

std::string StopLogLine(const StopOrder& order) {
  if (!order.preempt) return "";
  return absl::StrCat(order.reason, "; SIGTERM, SIGKILL after ",
                      absl::FormatDuration(order.grace));
}

}  // namespace substrax
