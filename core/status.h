// Status helpers used across substrax: early-return macros for absl::Status and
// absl::StatusOr, and a way to add context to an error without losing its code.
//
// Errors travel upward through every layer, and each hop says who it was:
//   SUBSTRAX_RETURN_IF_ERROR(Annotate(status, "worker w-3 (host gpu-7)"));
#ifndef SUBSTRAX_CORE_STATUS_H_
#define SUBSTRAX_CORE_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace substrax {

// Returns `status` with "context: " put before its message; the code and payloads are kept. An
// OK status is returned unchanged.
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  absl::Status annotated(status.code(), absl::StrCat(context, ": ", status.message()));
  // Payloads (what a caller may test the error for) survive the added context.
  status.ForEachPayload([&annotated](absl::string_view url, const absl::Cord& payload) {
    annotated.SetPayload(url, payload);
  });
  return annotated;
}

}  // namespace substrax

#define SUBSTRAX_STATUS_CONCAT_INNER_(a, b) a##b
#define SUBSTRAX_STATUS_CONCAT_(a, b) SUBSTRAX_STATUS_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status); returns it from the enclosing function if it is an error.
#define SUBSTRAX_RETURN_IF_ERROR(expr)                                        \
  do {                                                                        \
    ::absl::Status substrax_status_ = (expr);                                 \
    if (!substrax_status_.ok()) return substrax_status_;                      \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); returns its status if it is an error, otherwise
// moves the value into `lhs` (a declaration such as `auto mesh` or an existing variable).
#define SUBSTRAX_ASSIGN_OR_RETURN(lhs, rexpr) \
  SUBSTRAX_ASSIGN_OR_RETURN_IMPL_(SUBSTRAX_STATUS_CONCAT_(substrax_statusor_, __LINE__), lhs, rexpr)

#define SUBSTRAX_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                    \
  if (!statusor.ok()) return std::move(statusor).status();    \
  lhs = std::move(statusor).value()

// Aborts with file:line and `message` when `cond` is false. Only for broken invariants of our own
// code (a programming error), never for bad input: bad input gets an absl::Status.
#define SUBSTRAX_CHECK(cond, message)                                                   \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: check failed: %s: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(message).c_str());                                       \
      std::abort();                                                                     \
    }                                                                                   \
  } while (false)

#endif  // SUBSTRAX_CORE_STATUS_H_
