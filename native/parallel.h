// Minimal std::thread helpers shared by the native sources. Work is handed out in chunks
// from an atomic counter, so a worker that the OS deschedules delays the others by at most
// one chunk (the machine may be shared).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace dpsynth {

// Calls fn(begin, end, worker) over [0, count) in chunks of `grain` taken dynamically by
// `threads` workers (the calling thread is worker 0). Runs inline when one chunk suffices.
// Returns when every chunk is done; helper threads are detached, so a helper the OS has not
// yet scheduled when the work runs out costs nothing (it finds no chunk and exits, touching
// only the shared counters it co-owns).
template <class Fn>
void parallel_chunks(int64_t count, int threads, int64_t grain, Fn&& fn) {
  grain = std::max<int64_t>(1, grain);
  if (count <= 0) return;
  if (threads <= 1 || count <= grain) {
    fn(int64_t{0}, count, 0);
    return;
  }
  struct Counters {
    std::atomic<int64_t> next{0}, done{0};
  };
  auto counters = std::make_shared<Counters>();
  auto* f = &fn;  // dereferenced only for claimed chunks, which all finish before we return
  auto work = [counters, f, count, grain](int worker) {
    for (;;) {
      int64_t b = counters->next.fetch_add(grain, std::memory_order_relaxed);
      if (b >= count) return;
      int64_t e = std::min(count, b + grain);
      (*f)(b, e, worker);
      counters->done.fetch_add(e - b, std::memory_order_release);
    }
  };
  int workers = static_cast<int>(std::min<int64_t>(threads, (count + grain - 1) / grain));
  for (int w = 1; w < workers; ++w) std::thread(work, w).detach();
  work(0);
  spin_until([&] { return counters->done.load(std::memory_order_acquire) == count; });
}

// A grain giving each of `threads` workers several chunks (at least `min_grain` items each).
inline int64_t grain_for(int64_t count, int threads, int64_t min_grain = 1 << 15) {
  return std::max<int64_t>(min_grain, count / (8 * std::max(1, threads)) + 1);
}

// Busy-waits until pred() holds, yielding the core after a short spin.
template <class Pred>
void spin_until(Pred&& pred) {
  for (int spins = 0; !pred(); ++spins) {
    if (spins < 128) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace dpsynth
