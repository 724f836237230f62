// LCP arrays (Kasai et al. 2001, in the permuted-LCP form of Kärkkäinen et al. 2009) and
// cross-set matching statistics over a suffix array.
#pragma once

#include <cstdint>

namespace dpsynth {

// lcp[0] = 0 and lcp[r] = length of the longest common prefix of the suffixes sa[r - 1] and
// sa[r]. Linear time; `threads` split the text into ranges computed concurrently.
template <class C, class I>
void lcp_array(const C* text, const I* sa, I* lcp, int64_t n, int threads);

// For a text whose positions [0, split) form set A and [split, n) set B: out[p] = the longest
// common prefix of suffix p with any suffix of the other set (0 if that set is empty).
// Two linear sweeps over the suffix array keeping running LCP minima since the last suffix of
// each set.
template <class I>
void cross_match(const I* sa, const I* lcp, I* out, int64_t n, int64_t split);

}  // namespace dpsynth
