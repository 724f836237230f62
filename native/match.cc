// See match.h.
#include "match.h"

#include <algorithm>
#include <vector>

#include "parallel.h"

namespace dpsynth {
namespace {

// Look-ahead of software prefetches, in positions.
constexpr int64_t kPrefetch = 16;
// Documents whose backward searches run interleaved.
constexpr int kLanes = 8;

// Backward search: ms[i] = the rank of each suffix of the documents [a_g, e_g) among the
// sensitive suffixes (the number smaller), for up to kLanes documents at once (their
// dependent lookups interleave, so the memory accesses overlap). A document end acts as a
// separator above every sensitive symbol (rank m); tokens the sensitive text lacks sort
// after its tokens and before its separators.
template <class C, class I>
void ranks(const SensitiveSide<I>& s, const C* t, const int64_t* a, const int64_t* e, int lanes, I* ms) {
  int64_t r[kLanes], i[kLanes];
  int active = 0;
  for (int g = 0; g < lanes; ++g) {
    r[g] = s.m;
    i[g] = e[g] - 1;
    active += i[g] >= a[g];
  }
  const uint64_t bound = static_cast<uint64_t>(s.bound);
  while (active > 0) {
    for (int g = 0; g < lanes; ++g) {
      if (i[g] < a[g]) continue;
      const uint64_t c = t[i[g]];
      if (c < bound) {
        const int64_t* block = s.ckpt + s.ckpt_start[c] + (r[g] >> s.occ_shift[c]);
        const I* lo = s.occ_pos + block[0];
        const I* hi = s.occ_pos + block[1];
        r[g] = s.first[c] + (std::lower_bound(lo, hi, static_cast<I>(r[g])) - s.occ_pos) - s.occ_start[c];
      } else {
        r[g] = s.first[bound];
      }
      ms[i[g]] = static_cast<I>(r[g]);
      if (--i[g] < a[g]) --active;
    }
  }
}

// Matches one document [a, e); ms[a, e) holds the backward-search ranks on entry.
template <class C, class I>
void match_one(const SensitiveSide<I>& s, const C* t, int64_t a, int64_t e, I* ms, I* best_la,
               I* best_lb) {
  const int64_t m = s.m, bound = s.bound;
  // Longest match with the two neighbours; ms[i] >= ms[i - 1] - 1 bounds the comparisons.
  auto extend = [&](int64_t i, int64_t p, int64_t k) {
    while (i + k < e) {
      const uint64_t x = t[i + k];
      if (x >= static_cast<uint64_t>(bound) || s.text[p + k] != x) break;
      ++k;
    }
    return k;
  };
  int64_t h = 0;
  for (int64_t i = a; i < e; ++i) {
    if (i + kPrefetch < e) {  // the ranks are known: fetch the neighbours' entries early
      const int64_t q = ms[i + kPrefetch];
      __builtin_prefetch(&s.sa[q > 0 ? q - 1 : 0]);
      __builtin_prefetch(&s.lcp[q < s.m ? q : s.m - 1]);
    }
    const int64_t rank = ms[i];
    int64_t la = 0, lb = 0;
    if (rank == 0) {
      lb = extend(i, s.sa[0], h);
    } else if (rank == m) {
      la = extend(i, s.sa[m - 1], h);
    } else {
      const int64_t pa = s.sa[rank - 1], pb = s.sa[rank], l0 = s.lcp[rank];
      la = lb = l0;
      if (i + l0 < e && t[i + l0] < static_cast<uint64_t>(bound)) {
        const uint64_t x = t[i + l0];
        if (s.text[pa + l0] == x)
          la = extend(i, pa, std::max(h, l0 + 1));
        else if (s.text[pb + l0] == x)
          lb = extend(i, pb, std::max(h, l0 + 1));
      }
    }
    const int64_t best = std::max(la, lb);
    ms[i] = static_cast<I>(best);
    if (rank > 0 && la > best_la[rank]) best_la[rank] = static_cast<I>(la);
    if (rank < m && lb > best_lb[rank]) best_lb[rank] = static_cast<I>(lb);
    h = best > 0 ? best - 1 : 0;
  }
}

}  // namespace

template <class C, class I>
void match_documents(const SensitiveSide<I>& s, const C* tokens, const int64_t* offsets,
                     int64_t num_docs, I* ms, I* best_la, I* best_lb, int threads) {
  const int64_t n = num_docs > 0 ? offsets[num_docs] : 0;
  if (n == 0) return;
  if (s.m == 0) {
    std::fill(ms, ms + n, I(0));
    return;
  }
  // Parts of whole documents with about equal token counts, taken dynamically.
  const int64_t parts = threads > 1 && n >= (1 << 16) ? std::min<int64_t>(num_docs, 16 * threads) : 1;
  std::vector<int64_t> cut(parts + 1, num_docs);
  cut[0] = 0;
  for (int64_t p = 1; p < parts; ++p)
    cut[p] = std::upper_bound(offsets, offsets + num_docs + 1, n * p / parts) - offsets - 1;
  const int workers = static_cast<int>(std::min<int64_t>(threads, parts));
  // Workers other than 0 keep their own best_la/best_lb, max-reduced at the end.
  std::vector<std::vector<I>> local(std::max(0, workers - 1));
  parallel_chunks(parts, workers, 1, [&](int64_t pb, int64_t pe, int w) {
    I* la = best_la;
    I* lb = best_lb;
    if (w > 0) {
      auto& v = local[w - 1];
      if (v.empty()) v.assign(2 * (s.m + 1), I(0));
      la = v.data();
      lb = v.data() + s.m + 1;
    }
    for (int64_t p = pb; p < pe; ++p) {
      // Documents [cut[p], cut[p + 1]) in groups of kLanes: ranks interleaved, then matched.
      for (int64_t d = cut[p]; d < cut[p + 1]; d += kLanes) {
        const int lanes = static_cast<int>(std::min<int64_t>(kLanes, cut[p + 1] - d));
        ranks<C, I>(s, tokens, offsets + d, offsets + d + 1, lanes, ms);
        for (int g = 0; g < lanes; ++g) match_one<C, I>(s, tokens, offsets[d + g], offsets[d + g + 1], ms, la, lb);
      }
    }
  });
  const int64_t len = s.m + 1;
  for (auto& v : local) {
    if (v.empty()) continue;
    parallel_chunks(len, workers, grain_for(len, workers), [&](int64_t b, int64_t e, int) {
      for (int64_t g = b; g < e; ++g) {
        best_la[g] = std::max(best_la[g], v[g]);
        best_lb[g] = std::max(best_lb[g], v[len + g]);
      }
    });
  }
}

template <class I>
void sensitive_sweep(const I* sa, const I* lcp, const I* best_la, const I* best_lb, int64_t m, I* out) {
  // Downwards: document suffixes placed at ranks <= q reach suffix q through the LCP minimum.
  I cur = 0;
  for (int64_t q = 0; q < m; ++q) {
    if (q > 0) cur = std::min(cur, lcp[q]);
    cur = std::max(cur, best_lb[q]);
    out[sa[q]] = cur;
  }
  cur = 0;
  for (int64_t q = m - 1; q >= 0; --q) {
    if (q + 1 < m) cur = std::min(cur, lcp[q + 1]);
    cur = std::max(cur, best_la[q + 1]);
    out[sa[q]] = std::max(out[sa[q]], cur);
  }
}

template void match_documents<uint16_t, int32_t>(const SensitiveSide<int32_t>&, const uint16_t*, const int64_t*,
                                                 int64_t, int32_t*, int32_t*, int32_t*, int);
template void match_documents<uint16_t, int64_t>(const SensitiveSide<int64_t>&, const uint16_t*, const int64_t*,
                                                 int64_t, int64_t*, int64_t*, int64_t*, int);
template void match_documents<uint32_t, int32_t>(const SensitiveSide<int32_t>&, const uint32_t*, const int64_t*,
                                                 int64_t, int32_t*, int32_t*, int32_t*, int);
template void match_documents<uint32_t, int64_t>(const SensitiveSide<int64_t>&, const uint32_t*, const int64_t*,
                                                 int64_t, int64_t*, int64_t*, int64_t*, int);
template void sensitive_sweep<int32_t>(const int32_t*, const int32_t*, const int32_t*, const int32_t*, int64_t,
                                       int32_t*);
template void sensitive_sweep<int64_t>(const int64_t*, const int64_t*, const int64_t*, const int64_t*, int64_t,
                                       int64_t*);

}  // namespace dpsynth
