// What the first line of a benchmark's output says about the machine it ran on.
#ifndef SUBSTRAX_BENCH_HOST_H_
#define SUBSTRAX_BENCH_HOST_H_

#include <string>

namespace substrax::bench {

// The 1- and 5-minute load averages, "2.57 3.41" (from /proc/loadavg; empty elsewhere): a
// busy machine's figures are read with that in mind.
std::string LoadAverage();

}  // namespace substrax::bench

#endif  // SUBSTRAX_BENCH_HOST_H_
