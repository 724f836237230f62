// Matching statistics of many documents against one prebuilt suffix array (the sensitive
// set), without re-sorting it: each document suffix is located among the sensitive suffixes
// by backward search (LF mapping over the sensitive BWT), then compared with its two
// neighbours in sorted order.
#pragma once

#include <cstdint>

namespace dpsynth {

// The sensitive side, built once (see dpsynth/dedup/sensitive_sa.py):
//   text[0, m): sensitive tokens (< bound) with a unique separator (>= bound) after every
//     document, so text[m - 1] is a separator; sa, lcp: its suffix and LCP arrays.
//   first[c] for c in [0, bound]: the number of suffixes whose first symbol is a token < c
//     (first[bound] = number of token positions).
//   occ_start[c] for c in [0, bound]: occ_pos[occ_start[c], occ_start[c + 1]) lists, in
//     increasing order, the ranks r with text[sa[r] - 1] == c (the BWT positions of c).
//   occ_shift[c], ckpt_start[c] for c in [0, bound): c's rank space is cut into blocks of
//     2^occ_shift[c] ranks (8 to 16 occurrences each on average, OCC_BLOCK); ckpt[ckpt_start[c]
//     + j] is the index in occ_pos of c's first occurrence at a rank >= j << occ_shift[c], for
//     j in [0, (m >> occ_shift[c]) + 1], so a lookup searches one block only (ckpt < m, so it
//     has the index type I).
template <class I>
struct SensitiveSide {
  const uint32_t* text;
  const I* sa;
  const I* lcp;
  const int64_t* first;
  const int64_t* occ_start;
  const I* occ_pos;
  const uint8_t* occ_shift;
  const int64_t* ckpt_start;
  const I* ckpt;
  int64_t m;
  int64_t bound;
};

// For documents tokens[offsets[d], offsets[d + 1]) (a token >= bound never matches):
//   ms[i] = the longest prefix of tokens[i, end of its document) occurring in the text
//     (never across a separator);
//   best_lb[g] / best_la[g] for g in [0, m]: the largest LCP of any document suffix placed
//     between sensitive ranks g - 1 and g with the suffix of rank g / g - 1 (else untouched;
//     pass zeros). These feed sensitive_sweep.
// Time O(n log m): a binary search per token plus comparisons that amortise to O(n), as
// ms[i + 1] >= ms[i] - 1. Documents are handed to `threads` workers; identical results.
template <class C, class I>
void match_documents(const SensitiveSide<I>& s, const C* tokens, const int64_t* offsets,
                     int64_t num_docs, I* ms, I* best_la, I* best_lb, int threads);

// out[p] for p in [0, m): the longest common prefix of sensitive suffix p with any of the
// matched document suffixes, from best_la/best_lb (two sweeps over the suffix array).
template <class I>
void sensitive_sweep(const I* sa, const I* lcp, const I* best_la, const I* best_lb, int64_t m, I* out);

}  // namespace dpsynth
