// cross_cpu: prints how long a cache line takes from CPU 0 to CPU 1 and back, in nanoseconds
// (bench/host.h, CrossCpuRoundTripNs; 0 when it cannot be measured). bench/train_throughput.sh
// prints it with every round: on a VM it moves by several times from minute to minute, and the
// step time of devices that meet at every step moves with it.
#include <cstdio>

#include "bench/host.h"

int main() {
  std::printf("%.0f\n", substrax::bench::CrossCpuRoundTripNs());
  return 0;
}
