// See match.h.
#include "match.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "parallel.h"

namespace dpsynth {
namespace {

// Look-ahead of the software prefetches in match_one, in positions: the suffix array, LCP and
// best_* entries of the neighbours kPrefetch ahead, then (those now cached) the text where
// their comparison starts kPrefetch2 ahead.
constexpr int64_t kPrefetch = 32;
constexpr int64_t kPrefetch2 = 12;
// Documents whose backward searches run interleaved.
constexpr int kLanes = 16;

// A token's backward-search constants in one 16-byte entry (built per call, bound entries):
// ckpt_start[c] in the low 56 bits of `ckpt`, occ_shift[c] in the top 8; first[c] - occ_start[c].
struct Symbol {
  uint64_t ckpt;
  int64_t base;
};
constexpr int kShiftBit = 56;
constexpr uint64_t kCkptMask = (uint64_t(1) << kShiftBit) - 1;

// The number of entries < x in the increasing p[0, n). Branch-free on the data (the loop
// count depends on n only), so the searches of several lanes overlap in the pipeline.
template <class I>
inline int64_t count_less(const I* p, int64_t n, int64_t x) {
  if (n <= 0) return 0;
  const I* base = p;
  while (n > 1) {
    const int64_t half = n >> 1;
    base = static_cast<int64_t>(base[half]) < x ? base + half : base;
    n -= half;
  }
  return (base - p) + (static_cast<int64_t>(*base) < x);
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
    if (i + kPrefetch < e) {
      const int64_t q = ms[i + kPrefetch];
      __builtin_prefetch(&s.sa[q > 0 ? q - 1 : 0]);
      __builtin_prefetch(&s.lcp[q < m ? q : m - 1]);
      __builtin_prefetch(&best_la[q], 1);
      __builtin_prefetch(&best_lb[q], 1);
    }
    if (i + kPrefetch2 < e) {
      const int64_t q = ms[i + kPrefetch2];
      if (q > 0 && q < m) {
        const int64_t l0 = s.lcp[q];
        __builtin_prefetch(&s.text[s.sa[q - 1] + l0]);
        __builtin_prefetch(&s.text[s.sa[q] + l0]);
      }
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

// Documents [d, d_end): the backward search (ms[i] = the rank of each suffix among the
// sensitive suffixes, the number smaller), then match_one as soon as a document's ranks are
// complete. kLanes documents are searched at once (a finished one replaced by the next) in
// rounds of two passes over the lanes: the first reads each lane's checkpoint (prefetched in
// the previous round) and prefetches the occ_pos entries its search will probe first; the
// second searches (branch-free) and prefetches the next checkpoint. So every lane's two
// dependent loads per token are in flight together with the other lanes'.
// A document end acts as a separator above every sensitive symbol (rank m); tokens the
// sensitive text lacks sort after its tokens and before its separators.
template <class C, class I>
void match_range(const SensitiveSide<I>& s, const Symbol* sym, const C* t, const int64_t* offsets, int64_t d,
                 int64_t d_end, I* ms, I* best_la, I* best_lb) {
  const uint64_t bound = static_cast<uint64_t>(s.bound);
  // Per lane: its document, position, rank so far, and the block being searched.
  int64_t doc[kLanes], i[kLanes], r[kLanes], lo[kLanes], n[kLanes], base[kLanes];
  auto fetch_ckpt = [&](int g) {  // what the next step of lane g reads first
    const uint64_t c = t[i[g]];
    if (c < bound) __builtin_prefetch(s.ckpt + (sym[c].ckpt & kCkptMask) + (r[g] >> (sym[c].ckpt >> kShiftBit)));
  };
  auto start = [&](int g) {  // the next non-empty document into lane g; false if none left
    for (; d < d_end; ++d) {
      if (offsets[d + 1] > offsets[d]) {
        doc[g] = d++;
        i[g] = offsets[doc[g] + 1] - 1;
        r[g] = s.m;
        fetch_ckpt(g);
        return true;
      }
    }
    return false;
  };
  int active = 0;
  while (active < kLanes && start(active)) ++active;
  while (active > 0) {
    for (int g = 0; g < active; ++g) {
      const uint64_t c = t[i[g]];
      if (c < bound) {
        const Symbol y = sym[c];
        const I* block = s.ckpt + (y.ckpt & kCkptMask) + (r[g] >> (y.ckpt >> kShiftBit));
        lo[g] = block[0];
        n[g] = block[1] - block[0];
        base[g] = y.base;
        // The first probes: both ends and the middle; the quarters too in a long block.
        const I* p = s.occ_pos + lo[g];
        __builtin_prefetch(p);
        if (n[g] > 1) __builtin_prefetch(p + n[g] / 2);
        if (n[g] > 2) __builtin_prefetch(p + n[g] - 1);
        if (n[g] > 32) {
          __builtin_prefetch(p + n[g] / 4);
          __builtin_prefetch(p + 3 * n[g] / 4);
        }
      } else {
        lo[g] = n[g] = 0;
        base[g] = s.first[bound];
      }
    }
    for (int g = 0; g < active; ++g) {
      r[g] = base[g] + lo[g] + count_less(s.occ_pos + lo[g], n[g], r[g]);
      ms[i[g]] = static_cast<I>(r[g]);
      if (--i[g] >= offsets[doc[g]]) {
        fetch_ckpt(g);
        continue;
      }
      match_one<C, I>(s, t, offsets[doc[g]], offsets[doc[g] + 1], ms, best_la, best_lb);
      if (!start(g)) {  // no document left: move the last lane here
        --active;
        doc[g] = doc[active];
        i[g] = i[active];
        r[g] = r[active];
        lo[g] = lo[active];
        n[g] = n[active];
        base[g] = base[active];
        --g;  // the moved lane has not had its turn in this pass yet
      }
    }
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
  std::vector<Symbol> sym(s.bound);
  for (int64_t c = 0; c < s.bound; ++c)
    sym[c] = Symbol{static_cast<uint64_t>(s.ckpt_start[c]) | (uint64_t{s.occ_shift[c]} << kShiftBit),
                    s.first[c] - s.occ_start[c]};
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
    for (int64_t p = pb; p < pe; ++p)
      match_range<C, I>(s, sym.data(), tokens, offsets, cut[p], cut[p + 1], ms, la, lb);
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
  if (m <= 0) return;
  // Downwards (in rank order, into down): document suffixes placed at ranks <= q reach suffix
  // q through the LCP minimum. Upwards likewise from ranks > q; only then one scattered
  // write per suffix (not a scattered write and a scattered read-modify-write).
  std::unique_ptr<I[]> down(new I[m]);
  I cur = 0;
  for (int64_t q = 0; q < m; ++q) {
    if (q > 0) cur = std::min(cur, lcp[q]);
    cur = std::max(cur, best_lb[q]);
    down[q] = cur;
  }
  cur = 0;
  for (int64_t q = m - 1; q >= 0; --q) {
    if (q + 1 < m) cur = std::min(cur, lcp[q + 1]);
    cur = std::max(cur, best_la[q + 1]);
    out[sa[q]] = std::max(down[q], cur);
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
