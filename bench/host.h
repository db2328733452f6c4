// What the first line of a benchmark's output says about the machine it ran on.
#ifndef SUBSTRAX_BENCH_HOST_H_
#define SUBSTRAX_BENCH_HOST_H_

#include <string>

namespace substrax::bench {

// The 1- and 5-minute load averages, "2.57 3.41" (from /proc/loadavg; empty elsewhere): a
// busy machine's figures are read with that in mind.
std::string LoadAverage();

// The median time, in nanoseconds, for a cache line to go from CPU 0 to CPU 1 and back (two
// threads pinned to them hand a counter to each other 20000 times); 0 when there is no second
// CPU or pinning fails. On a VM it tells where the host has put the two vCPUs right now: on
// cores that share a cache, or farther apart, where every transfer between them costs several
// times more. Shared-memory collectives move their data that way, so their figures follow it.
double CrossCpuRoundTripNs();

}  // namespace substrax::bench

#endif  // SUBSTRAX_BENCH_HOST_H_
