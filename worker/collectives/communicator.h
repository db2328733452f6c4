// Communicator: the backend-neutral collectives one device uses to talk to the other devices of a
// group (the whole mesh, or the devices along one mesh axis). Implementations: Gloo over TCP
// (gloo_communicator.h); NCCL arrives with the GPU backend.
//
// Every rank of a group calls the same collectives in the same order (as with MPI, Gloo and
// NCCL); the implementation allocates the tags that match them up, never the caller. Every
// collective has a timeout. Errors are mapped once, by retry semantics:
//   UNAVAILABLE         a peer died or a connection broke (the message names the dead rank and
//                       host when known); the job attempt must be restarted.
//   DEADLINE_EXCEEDED   the collective did not finish within its timeout and no peer is known
//                       to be dead (a peer is stuck or far slower).
//   INVALID_ARGUMENT    the call itself is wrong (buffer sizes, root out of range); checked here
//                       before anything is sent.
//   FAILED_PRECONDITION the communicator is unusable (an earlier collective failed).
//
// A Communicator is used by one thread (the device's) at a time.
#ifndef SUBSTRAX_WORKER_COLLECTIVES_COMMUNICATOR_H_
#define SUBSTRAX_WORKER_COLLECTIVES_COMMUNICATOR_H_

#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/metric_reductions.h"

namespace substrax {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "world", "axis 'data' group 1": for messages.
  virtual const std::string& name() const = 0;

  // In place: every rank ends with the reduction of all ranks' `data`. kMean divides the sum
  // by size().
  absl::Status AllReduce(absl::Span<float> data, ReduceOp op);
  absl::Status AllReduce(absl::Span<double> data, ReduceOp op);
  // output = the inputs of ranks 0..size-1 concatenated; output.size() == input.size() * size().
  absl::Status AllGather(absl::Span<const float> input, absl::Span<float> output);
  absl::Status AllGather(absl::Span<const double> input, absl::Span<double> output);
  // Every rank ends with root's `data`.
  absl::Status Broadcast(absl::Span<float> data, int root);
  // output = block rank() of the reduction of all inputs; input.size() == output.size() * size().
  absl::Status ReduceScatter(absl::Span<const float> input, absl::Span<float> output,
                             ReduceOp op);
  // Returns once every rank has entered the barrier.
  absl::Status Barrier();

 protected:
  // Called with arguments already checked.
  virtual absl::Status DoAllReduce(absl::Span<float> data, ReduceOp op) = 0;
  virtual absl::Status DoAllReduce(absl::Span<double> data, ReduceOp op) = 0;
  virtual absl::Status DoAllGather(absl::Span<const float> input, absl::Span<float> output) = 0;
  virtual absl::Status DoAllGather(absl::Span<const double> input,
                                   absl::Span<double> output) = 0;
  virtual absl::Status DoBroadcast(absl::Span<float> data, int root) = 0;
  virtual absl::Status DoReduceScatter(absl::Span<const float> input, absl::Span<float> output,
                                       ReduceOp op) = 0;
  virtual absl::Status DoBarrier() = 0;

 private:
  absl::Status CheckSizes(const char* op, size_t input, size_t output, size_t expected_output);
};

}  // namespace substrax

#endif  // SUBSTRAX_WORKER_COLLECTIVES_COMMUNICATOR_H_
