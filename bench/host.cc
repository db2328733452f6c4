#include "bench/host.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace substrax::bench {

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return absl::StrCat(one, " ", five);
}

namespace {

bool PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
}

}  // namespace

double CrossCpuRoundTripNs() {
  if (sysconf(_SC_NPROCESSORS_ONLN) < 2) return 0;
  constexpr int kRounds = 20000;
  constexpr int kBatch = 100;  // round trips per timed sample
  alignas(64) std::atomic<int> turn{0};
  // The peer pins itself, says whether that worked (1 or -1), and waits to be told to go (1) or
  // not (-1): spinning unpinned could share one CPU with the other spinner.
  std::atomic<int> peer_pinned{0}, go{0};
  std::thread peer([&] {
    peer_pinned = PinTo(1) ? 1 : -1;
    while (go.load() == 0) std::this_thread::yield();
    if (go.load() < 0) return;
    for (int expect = 1; expect < 2 * kRounds; expect += 2) {
      while (turn.load(std::memory_order_acquire) != expect) {
      }
      turn.store(expect + 1, std::memory_order_release);
    }
  });
  cpu_set_t before;
  const bool saved = pthread_getaffinity_np(pthread_self(), sizeof(before), &before) == 0;
  const bool pinned = saved && PinTo(0);
  while (peer_pinned.load() == 0) std::this_thread::yield();
  const bool run = pinned && peer_pinned.load() > 0;
  go = run ? 1 : -1;
  std::vector<double> samples;
  for (int round = 0; run && round < kRounds; round += kBatch) {
    const auto start = std::chrono::steady_clock::now();
    for (int k = round; k < round + kBatch; ++k) {
      turn.store(2 * k + 1, std::memory_order_release);
      while (turn.load(std::memory_order_acquire) != 2 * k + 2) {
      }
    }
    samples.push_back(
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start)
            .count() /
        kBatch);
  }
  peer.join();
  if (saved) pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
  if (samples.empty()) return 0;
  std::nth_element(samples.begin(), samples.begin() + samples.size() / 2, samples.end());
  return samples[samples.size() / 2];
}

}  // namespace substrax::bench
