// SA-IS with a virtual sentinel, parallel helpers and a two-thread pipelined induction.
// See sais.h for the contract. Layout of the recursion follows Nong's SA-IS: after sorting
// the LMS substrings, their names are written into the free half of `sa`, compacted into the
// reduced string at sa[n - m, n), whose suffix array is computed into sa[0, m).
#include "sais.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "parallel.h"

namespace dpsynth {
namespace {

// Smallest input handled by the threaded code paths; below it threads only cost.
constexpr int64_t kParallelMin = 1 << 16;
// Entries per block of the pipelined induction.
constexpr int64_t kBlock = 1 << 14;
// Blocks the reader thread may run ahead of the writer.
constexpr int64_t kRing = 4;
// Pause instructions the writer waits for a block the reader is still resolving.
constexpr int kPatience = 1 << 12;
// Look-ahead of software prefetches, in entries.
constexpr int64_t kPrefetch = 32;

// One bit per position: 1 = S-type suffix, 0 = L-type.
class TypeBits {
 public:
  explicit TypeBits(int64_t n) : words_((n + 63) / 64 + 1, 0) {}
  bool s(int64_t i) const { return (words_[i >> 6] >> (i & 63)) & 1; }
  bool lms(int64_t i) const { return i > 0 && s(i) && !s(i - 1); }
  void set(int64_t i) { words_[i >> 6] |= uint64_t{1} << (i & 63); }
  void set_range(int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) set(i);
  }
  const uint64_t* word_ptr(int64_t i) const { return &words_[i >> 6]; }

 private:
  std::vector<uint64_t> words_;
};

template <class I>
inline I load_relaxed(const I* p) {
  return __atomic_load_n(p, __ATOMIC_RELAXED);
}
template <class I>
inline void store_relaxed(I* p, I v) {
  __atomic_store_n(p, v, __ATOMIC_RELAXED);
}

// Classifies every suffix as S or L. Chunks are classified independently (word-aligned so
// no two threads write one word); the trailing run of each chunk that equals the next
// chunk's first symbol takes that symbol's type, fixed right to left afterwards.
template <class C>
void classify(const C* t, int64_t n, TypeBits& bits, int threads) {
  if (n == 0) return;
  // Fixed, word-aligned parts (so the fix-up below is deterministic), taken dynamically.
  int64_t parts = (threads > 1 && n >= kParallelMin) ? std::min<int64_t>(8 * threads, n / 4096) : 1;
  std::vector<int64_t> bounds(parts + 1);
  for (int64_t p = 0; p <= parts; ++p) bounds[p] = std::min(n, ((n * p / parts) + 63) / 64 * 64);
  bounds[parts] = n;
  std::vector<int64_t> run_start(parts, 0);
  parallel_chunks(parts, threads, 1, [&](int64_t pb, int64_t pe, int) {
    for (int64_t p = pb; p < pe; ++p) {
      int64_t a = bounds[p], b = bounds[p + 1];
      if (a >= b) continue;
      bool next_s;  // type of position i + 1
      int64_t i = b - 1;
      if (b == n) {
        next_s = false;  // the last suffix is L (greater than the empty sentinel)
        --i;
      } else {
        // Provisional: the trailing run equal to t[b] copies t[b]'s type later.
        int64_t r = b - 1;
        while (r >= a && t[r] == t[b]) --r;
        run_start[p] = r + 1;
        i = r;
        if (i < a) continue;
        next_s = t[i] < t[i + 1];
        if (next_s) bits.set(i);
        --i;
      }
      for (; i >= a; --i) {
        bool s = t[i] < t[i + 1] || (t[i] == t[i + 1] && next_s);
        if (s) bits.set(i);
        next_s = s;
      }
    }
  });
  for (int64_t p = parts - 2; p >= 0; --p) {
    int64_t b = bounds[p + 1];
    if (bounds[p] >= b) continue;
    if (bits.s(b)) bits.set_range(run_start[p], b);
  }
}

// Bucket boundaries: start[c] = first slot of bucket c, start[K] = n.
template <class C, class I>
std::vector<I> bucket_starts(const C* t, int64_t n, int64_t K, int threads) {
  std::vector<I> start(K + 1, 0);
  int workers = (threads > 1 && n >= kParallelMin && K <= n) ? threads : 1;
  std::vector<std::vector<I>> local(workers - 1, std::vector<I>(K + 1, 0));
  parallel_chunks(n, workers, grain_for(n, workers), [&](int64_t b, int64_t e, int w) {
    I* h = w == 0 ? start.data() : local[w - 1].data();
    for (int64_t i = b; i < e; ++i) ++h[t[i] + 1];
  });
  for (auto& h : local)
    for (int64_t c = 0; c <= K; ++c) start[c] += h[c];
  for (int64_t c = 0; c < K; ++c) start[c + 1] += start[c];
  return start;
}

// ----------------------------------------------------------------------------- induction

// One pass of induced sorting. Forward (L pass): scans sa left to right and puts each
// L-type predecessor u = v - 1 at the head of bucket t[u]. Backward (S pass): scans right to
// left and puts each S-type predecessor at the tail of its bucket.
template <bool kForward, class C, class I>
void induce_pass_serial(const C* t, I* sa, int64_t n, const TypeBits& bits, I* ptr) {
  auto step = [&](int64_t i) {
    I v = sa[i];
    if (v > 0) {
      I u = v - 1;
      if (bits.s(u) != kForward) {
        if (kForward)
          sa[ptr[t[u]]++] = u;
        else
          sa[--ptr[t[u]]] = u;
      }
    }
    // Two-stage prefetch: the predecessor's symbol far ahead, its bucket pointer nearer.
    int64_t k = kForward ? i + 2 * kPrefetch : i - 2 * kPrefetch;
    if (k >= 0 && k < n) {
      I w = sa[k];
      if (w > 0) {
        __builtin_prefetch(&t[w - 1]);
        __builtin_prefetch(bits.word_ptr(w - 1));
      }
    }
    k = kForward ? i + kPrefetch : i - kPrefetch;
    if (k >= 0 && k < n) {
      I w = sa[k];
      if (w > 0) __builtin_prefetch(&ptr[t[w - 1]]);
    }
  };
  if (kForward)
    for (int64_t i = 0; i < n; ++i) step(i);
  else
    for (int64_t i = n - 1; i >= 0; --i) step(i);
}

// The same pass on two threads. A reader thread resolves, for each entry of a block, the
// predecessor and its symbol (the random reads of the text and types) into a ring buffer; the
// writer (calling thread) places them (the random writes). Blocks are claimed in order from
// an atomic counter: when the reader has not claimed the writer's next block, the writer
// claims and processes it itself, so the writer never waits on a descheduled reader. Entries
// still empty when the reader saw them are resolved again by the writer, which alone writes
// sa; so the result equals the serial pass. Requires every non-empty slot the reader sees to
// be final for this pass.
template <bool kForward, class C, class I>
void induce_pass_pipelined(const C* t, I* sa, int64_t n, const TypeBits& bits, I* ptr) {
  constexpr I kRecheck = -1;  // slot was empty when read (EMPTY is -1 too)
  constexpr I kSkip = -2;     // nothing to induce
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
  std::vector<I> pred(kRing * kBlock);
  std::vector<C> sym(kRing * kBlock);
  std::atomic<int64_t> claimed{0}, consumed{0};
  std::vector<std::atomic<int64_t>> ready(kRing);
  for (auto& r : ready) r.store(-1, std::memory_order_relaxed);
  auto block_range = [&](int64_t k, int64_t& lo, int64_t& hi) {
    if (kForward) {
      lo = k * kBlock;
      hi = std::min(n, lo + kBlock);
    } else {
      hi = n - k * kBlock;
      lo = std::max<int64_t>(0, hi - kBlock);
    }
  };
  std::thread reader([&] {
    for (;;) {
      int64_t k = claimed.load(std::memory_order_acquire);
      if (k >= nblocks) return;
      if (k - consumed.load(std::memory_order_acquire) >= kRing) {
        std::this_thread::yield();
        continue;
      }
      if (!claimed.compare_exchange_weak(k, k + 1, std::memory_order_acq_rel)) continue;
      int64_t lo, hi;
      block_range(k, lo, hi);
      I* pb = &pred[(k % kRing) * kBlock];
      C* sb = &sym[(k % kRing) * kBlock];
      for (int64_t s = 0, len = hi - lo; s < len; ++s) {
        int64_t idx = kForward ? lo + s : hi - 1 - s;
        int64_t pf = kForward ? idx + kPrefetch : idx - kPrefetch;
        if (pf >= 0 && pf < n) {
          I w = load_relaxed(&sa[pf]);
          if (w > 0) {
            __builtin_prefetch(&t[w - 1]);
            __builtin_prefetch(bits.word_ptr(w - 1));
          }
        }
        I v = load_relaxed(&sa[idx]);
        int64_t j = idx - lo;
        if (v < 0) {
          pb[j] = kRecheck;
        } else if (v > 0 && bits.s(v - 1) != kForward) {
          pb[j] = v - 1;
          sb[j] = t[v - 1];
        } else {
          pb[j] = kSkip;
        }
      }
      ready[k % kRing].store(k, std::memory_order_release);
    }
  });
  auto place = [&](I u, C c) {
    if (kForward)
      store_relaxed(&sa[ptr[c]++], u);
    else
      store_relaxed(&sa[--ptr[c]], u);
  };
  for (int64_t k = 0; k < nblocks; ++k) {
    int64_t lo, hi;
    block_range(k, lo, hi);
    int64_t len = hi - lo;
    int64_t expect = k;
    bool direct = claimed.load(std::memory_order_acquire) == k &&
                  claimed.compare_exchange_strong(expect, k + 1, std::memory_order_acq_rel);
    if (!direct) {
      // The reader holds this block: wait briefly, then do it here rather than stall on a
      // reader the OS has descheduled (its late result for this block is then ignored).
      for (int spins = 0; ready[k % kRing].load(std::memory_order_acquire) != k; ++spins) {
        if (spins == kPatience) {
          direct = true;
          break;
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
    if (direct) {
      // Process this block like the serial pass.
      for (int64_t s = 0; s < len; ++s) {
        int64_t idx = kForward ? lo + s : hi - 1 - s;
        int64_t pf = kForward ? idx + kPrefetch : idx - kPrefetch;
        if (pf >= 0 && pf < n) {
          I w = sa[pf];
          if (w > 0) {
            __builtin_prefetch(&t[w - 1]);
            __builtin_prefetch(bits.word_ptr(w - 1));
          }
        }
        I v = sa[idx];
        if (v > 0 && bits.s(v - 1) != kForward) place(v - 1, t[v - 1]);
      }
    } else {
      const I* pb = &pred[(k % kRing) * kBlock];
      const C* sb = &sym[(k % kRing) * kBlock];
      for (int64_t s = 0; s < len; ++s) {
        int64_t j = kForward ? s : len - 1 - s;
        int64_t jp = kForward ? s + 8 : len - 1 - s - 8;
        if (jp >= 0 && jp < len && pb[jp] >= 0) {
          I dst = kForward ? ptr[sb[jp]] : ptr[sb[jp]] - 1;
          __builtin_prefetch(&sa[dst], 1);
        }
        int64_t jq = kForward ? s + 24 : len - 1 - s - 24;
        if (jq >= 0 && jq < len && pb[jq] >= 0) __builtin_prefetch(&ptr[sb[jq]], 1);
        I u = pb[j];
        if (u >= 0) {
          place(u, sb[j]);
        } else if (u == kRecheck) {
          I v = sa[lo + j];
          if (v > 0 && bits.s(v - 1) != kForward) place(v - 1, t[v - 1]);
        }
      }
    }
    consumed.store(k + 1, std::memory_order_release);
  }
  reader.join();
}

// Induces L then S suffixes from the seeds already in sa (other slots EMPTY = -1).
template <class C, class I>
void induce(const C* t, I* sa, int64_t n, int64_t K, const TypeBits& bits,
            const std::vector<I>& start, int threads) {
  std::vector<I> ptr(start.begin(), start.begin() + K);
  sa[ptr[t[n - 1]]++] = static_cast<I>(n - 1);  // induced by the virtual sentinel
  bool pipelined = threads > 1 && n >= kParallelMin;
  if (pipelined)
    induce_pass_pipelined<true>(t, sa, n, bits, ptr.data());
  else
    induce_pass_serial<true>(t, sa, n, bits, ptr.data());
  if (pipelined) {
    // The S pass rewrites every S slot before scanning it; clearing stale seeds first makes
    // every non-empty slot final, as the pipelined pass requires.
    parallel_chunks(K, threads, grain_for(K, threads, 1024), [&](int64_t b, int64_t e, int) {
      for (int64_t c = b; c < e; ++c) std::fill(sa + ptr[c], sa + start[c + 1], I(-1));
    });
  }
  for (int64_t c = 0; c < K; ++c) ptr[c] = start[c + 1];
  if (pipelined)
    induce_pass_pipelined<false>(t, sa, n, bits, ptr.data());
  else
    induce_pass_serial<false>(t, sa, n, bits, ptr.data());
}

// True when the LMS substrings starting at a and b (types included) are equal.
template <class C>
bool lms_equal(const C* t, int64_t n, const TypeBits& bits, int64_t a, int64_t b) {
  for (int64_t d = 0;; ++d) {
    if (a + d == n || b + d == n) return false;
    if (t[a + d] != t[b + d] || bits.s(a + d) != bits.s(b + d)) return false;
    if (d > 0) {
      bool ea = bits.lms(a + d), eb = bits.lms(b + d);
      if (ea != eb) return false;
      if (ea) return true;
    }
  }
}

template <class C, class I>
void sais(const C* t, I* sa, int64_t n, int64_t K, int threads) {
  if (n == 0) return;
  if (n == 1) {
    sa[0] = 0;
    return;
  }
  TypeBits bits(n);
  classify(t, n, bits, threads);
  std::vector<I> start = bucket_starts<C, I>(t, n, K, threads);

  // Stage 1: sort the LMS substrings by inducing from LMS positions at their bucket tails.
  std::fill(sa, sa + n, I(-1));
  {
    std::vector<I> tail(start.begin() + 1, start.end());
    for (int64_t i = n - 1; i >= 1; --i)
      if (bits.lms(i)) sa[--tail[t[i]]] = static_cast<I>(i);
  }
  induce(t, sa, n, K, bits, start, threads);

  // Compact the sorted LMS positions into sa[0, m).
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    I v = sa[i];
    if (v > 0 && bits.lms(v)) sa[m++] = v;
  }
  // No LMS suffix: inducing from the (trivially sorted) empty set already sorted everything.
  if (m == 0) return;

  // Name the LMS substrings (equal substrings share a name) at sa[m + p / 2].
  std::fill(sa + m, sa + n, I(-1));
  std::vector<uint8_t> differs(m);
  differs[0] = 1;
  parallel_chunks(m - 1, m >= kParallelMin ? threads : 1, grain_for(m, threads), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b + 1; i < e + 1; ++i) differs[i] = !lms_equal(t, n, bits, sa[i - 1], sa[i]);
  });
  I name = -1;
  for (int64_t i = 0; i < m; ++i) {
    name += differs[i];
    sa[m + (sa[i] >> 1)] = name;
  }
  std::vector<uint8_t>().swap(differs);
  int64_t names = static_cast<int64_t>(name) + 1;
  for (int64_t i = n - 1, j = n - 1; i >= m; --i)
    if (sa[i] >= 0) sa[j--] = sa[i];

  // Stage 2: sort the reduced string (recursively unless the names are unique).
  I* reduced = sa + (n - m);
  if (names < m) {
    sais<I, I>(reduced, sa, m, names, threads);
  } else {
    for (int64_t i = 0; i < m; ++i) sa[reduced[i]] = static_cast<I>(i);
  }

  // Stage 3: map reduced ranks to text positions, seed the sorted LMS suffixes at the tails
  // of their buckets (right to left, so no unread entry is overwritten) and induce.
  for (int64_t i = 1, j = 0; i < n; ++i)
    if (bits.lms(i)) reduced[j++] = static_cast<I>(i);
  parallel_chunks(m, m >= kParallelMin ? threads : 1, grain_for(m, threads), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sa[i] = reduced[sa[i]];
  });
  std::fill(sa + m, sa + n, I(-1));
  {
    std::vector<I> tail(start.begin() + 1, start.end());
    for (int64_t i = m - 1; i >= 0; --i) {
      I p = sa[i];
      sa[i] = -1;
      sa[--tail[t[p]]] = p;
    }
  }
  induce(t, sa, n, K, bits, start, threads);
}

}  // namespace

template <class C, class I>
void suffix_array(const C* text, I* sa, int64_t n, int64_t alphabet_size, int threads) {
  sais<C, I>(text, sa, n, alphabet_size, std::max(1, threads));
}

template void suffix_array<uint16_t, int32_t>(const uint16_t*, int32_t*, int64_t, int64_t, int);
template void suffix_array<uint16_t, int64_t>(const uint16_t*, int64_t*, int64_t, int64_t, int);
template void suffix_array<uint32_t, int32_t>(const uint32_t*, int32_t*, int64_t, int64_t, int);
template void suffix_array<uint32_t, int64_t>(const uint32_t*, int64_t*, int64_t, int64_t, int);

}  // namespace dpsynth
