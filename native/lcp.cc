// See lcp.h.
#include "lcp.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "parallel.h"

namespace dpsynth {

template <class C, class I>
void lcp_array(const C* t, const I* sa, I* lcp, int64_t n, int threads) {
  if (n == 0) return;
  const int workers = n >= (1 << 16) ? threads : 1;
  const int64_t grain = grain_for(n, workers, 1 << 18);
  // phi[sa[r]] = sa[r - 1]: the suffix just before p in suffix-array order (-1 for the first).
  std::vector<I> phi(n);
  parallel_chunks(n, workers, grain, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) phi[sa[r]] = r == 0 ? I(-1) : sa[r - 1];
  });
  // Permuted LCP in text order, in place: plcp[i + 1] >= plcp[i] - 1, so each chunk restarts
  // from 0 and the whole stays linear (up to one longest LCP per chunk).
  parallel_chunks(n, workers, grain, [&](int64_t b, int64_t e, int) {
    int64_t h = 0;
    for (int64_t i = b; i < e; ++i) {
      int64_t j = phi[i];
      if (j < 0) {
        h = 0;
        phi[i] = 0;
        continue;
      }
      while (i + h < n && j + h < n && t[i + h] == t[j + h]) ++h;
      phi[i] = static_cast<I>(h);
      if (h > 0) --h;
    }
  });
  parallel_chunks(n, workers, grain, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) lcp[r] = phi[sa[r]];
  });
}

template <class I>
void cross_match(const I* sa, const I* lcp, I* out, int64_t n, int64_t split) {
  const I kInf = std::numeric_limits<I>::max();
  // run[s] = min LCP between the current suffix and the nearest earlier suffix of set s
  // (0 when there is none yet).
  I run[2] = {0, 0};
  for (int64_t r = 0; r < n; ++r) {
    if (r > 0) {
      run[0] = std::min(run[0], lcp[r]);
      run[1] = std::min(run[1], lcp[r]);
    }
    I p = sa[r];
    int s = p >= split;
    out[p] = run[1 - s];
    run[s] = kInf;
  }
  run[0] = run[1] = 0;
  for (int64_t r = n - 1; r >= 0; --r) {
    if (r + 1 < n) {
      run[0] = std::min(run[0], lcp[r + 1]);
      run[1] = std::min(run[1], lcp[r + 1]);
    }
    I p = sa[r];
    int s = p >= split;
    out[p] = std::max(out[p], run[1 - s]);
    run[s] = kInf;
  }
}

template void lcp_array<uint16_t, int32_t>(const uint16_t*, const int32_t*, int32_t*, int64_t, int);
template void lcp_array<uint16_t, int64_t>(const uint16_t*, const int64_t*, int64_t*, int64_t, int);
template void lcp_array<uint32_t, int32_t>(const uint32_t*, const int32_t*, int32_t*, int64_t, int);
template void lcp_array<uint32_t, int64_t>(const uint32_t*, const int64_t*, int64_t*, int64_t, int);
template void cross_match<int32_t>(const int32_t*, const int32_t*, int32_t*, int64_t, int64_t);
template void cross_match<int64_t>(const int64_t*, const int64_t*, int64_t*, int64_t, int64_t);

}  // namespace dpsynth
