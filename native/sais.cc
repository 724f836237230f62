// SA-IS with a virtual sentinel; the linear-time helpers run on several threads.
// See sais.h for the contract. Layout of the recursion follows Nong's SA-IS: after sorting
// the LMS substrings, their names are written into the free half of `sa`, compacted into the
// reduced string at sa[n - m, n), whose suffix array is computed into sa[0, m).
#include "sais.h"

#include <algorithm>
#include <vector>

#include "parallel.h"

namespace dpsynth {
namespace {

// Smallest input handled by the threaded code paths; below it threads only cost.
constexpr int64_t kParallelMin = 1 << 16;
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

// Induces L then S suffixes from the seeds already in sa (other slots EMPTY = -1).
template <class C, class I>
void induce(const C* t, I* sa, int64_t n, int64_t K, const TypeBits& bits,
            const std::vector<I>& start) {
  std::vector<I> ptr(start.begin(), start.begin() + K);
  sa[ptr[t[n - 1]]++] = static_cast<I>(n - 1);  // induced by the virtual sentinel
  induce_pass_serial<true>(t, sa, n, bits, ptr.data());
  for (int64_t c = 0; c < K; ++c) ptr[c] = start[c + 1];
  induce_pass_serial<false>(t, sa, n, bits, ptr.data());
}

// sa[a, b) = EMPTY (-1), in parallel chunks.
template <class I>
void fill(I* sa, int64_t a, int64_t b, int threads) {
  parallel_chunks(b - a, b - a >= kParallelMin ? threads : 1, grain_for(b - a, threads),
                  [&](int64_t lo, int64_t hi, int) { std::fill(sa + a + lo, sa + a + hi, I(-1)); });
}

// Writes the LMS positions of [1, n) in increasing order to out (two passes over fixed parts:
// count, then write at the prefix-summed offsets).
template <class I>
void list_lms(const TypeBits& bits, int64_t n, I* out, int threads) {
  int64_t parts = (threads > 1 && n >= kParallelMin) ? 8 * threads : 1;
  std::vector<int64_t> count(parts + 1, 0);
  auto range = [&](int64_t p, int64_t& a, int64_t& b) {
    a = std::max<int64_t>(1, n * p / parts);
    b = n * (p + 1) / parts;
  };
  parallel_chunks(parts, threads, 1, [&](int64_t pb, int64_t pe, int) {
    for (int64_t p = pb; p < pe; ++p) {
      int64_t a, b, c = 0;
      range(p, a, b);
      for (int64_t i = a; i < b; ++i) c += bits.lms(i);
      count[p + 1] = c;
    }
  });
  for (int64_t p = 0; p < parts; ++p) count[p + 1] += count[p];
  parallel_chunks(parts, threads, 1, [&](int64_t pb, int64_t pe, int) {
    for (int64_t p = pb; p < pe; ++p) {
      int64_t a, b, j = count[p];
      range(p, a, b);
      for (int64_t i = a; i < b; ++i)
        if (bits.lms(i)) out[j++] = static_cast<I>(i);
    }
  });
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
  fill(sa, 0, n, threads);
  {
    std::vector<I> tail(start.begin() + 1, start.end());
    for (int64_t i = n - 1; i >= 1; --i)
      if (bits.lms(i)) sa[--tail[t[i]]] = static_cast<I>(i);
  }
  induce(t, sa, n, K, bits, start);

  // Compact the sorted LMS positions into sa[0, m).
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    I v = sa[i];
    if (v > 0 && bits.lms(v)) sa[m++] = v;
  }
  // No LMS suffix: inducing from the (trivially sorted) empty set already sorted everything.
  if (m == 0) return;

  // Name the LMS substrings (equal substrings share a name) at sa[m + p / 2].
  fill(sa, m, n, threads);
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
  list_lms(bits, n, reduced, threads);
  parallel_chunks(m, m >= kParallelMin ? threads : 1, grain_for(m, threads), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) sa[i] = reduced[sa[i]];
  });
  fill(sa, m, n, threads);
  {
    std::vector<I> tail(start.begin() + 1, start.end());
    for (int64_t i = m - 1; i >= 0; --i) {
      I p = sa[i];
      sa[i] = -1;
      sa[--tail[t[p]]] = p;
    }
  }
  induce(t, sa, n, K, bits, start);
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
