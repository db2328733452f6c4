// How a job process tells the agent's two kinds of SIGTERM apart. The agent's stops (a cancel, a
// preemption, a failed attempt) send a plain SIGTERM, which the built-in trainer and SDK programs
// answer with a final checkpoint (worker/runtime/preemption.h). A supervisor's fence (the lease
// lapsed or the agent is gone: the coordinator may start the attempt elsewhere at any moment)
// queues its SIGTERM to the job's leader with sigqueue and this value first, then signals the
// group: the process must die at once, as it always did, never write a checkpoint that a newer
// attempt could race.
#ifndef SUBSTRAX_CONTRACT_STOP_SIGNAL_H_
#define SUBSTRAX_CONTRACT_STOP_SIGNAL_H_

namespace substrax {

// si_value.sival_int of a fence's SIGTERM (si_code SI_QUEUE): "FENC".
inline constexpr int kFenceSigtermValue = 0x46454e43;

}  // namespace substrax

#endif  // SUBSTRAX_CONTRACT_STOP_SIGNAL_H_
