// Minimal std::thread helpers shared by the native sources.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace dpsynth {

// Calls fn(i) for i in [0, count), split into `threads` contiguous ranges run concurrently
// (the calling thread takes the first range).
template <class Fn>
void parallel_for(int64_t count, int threads, Fn&& fn) {
  int parts = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, count)));
  if (parts <= 1) {
    for (int64_t i = 0; i < count; ++i) fn(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(parts - 1);
  for (int p = 1; p < parts; ++p) {
    pool.emplace_back([&, p] {
      for (int64_t i = count * p / parts, e = count * (p + 1) / parts; i < e; ++i) fn(i);
    });
  }
  for (int64_t i = 0, e = count / parts; i < e; ++i) fn(i);
  for (auto& th : pool) th.join();
}

// Busy-waits until pred() holds, yielding the core after a short spin (so oversubscribed
// machines still make progress).
template <class Pred>
void spin_until(Pred&& pred) {
  for (int spins = 0; !pred(); ++spins) {
    if (spins < 256) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace dpsynth
