// Suffix arrays over integer alphabets by induced sorting (SA-IS, Nong, Zhang & Chan 2009).
//
// Linear time and space; 16- or 32-bit tokens; 32- or 64-bit indices. With threads >= 2 the
// linear helper passes (type classification, bucket counting, LMS-substring naming, LMS
// listing, rank mapping, slot clearing) run on several threads in dynamically handed-out
// chunks; the induced-sorting passes are sequential (a two-thread pipeline of them was
// measured slower on a shared 2-CPU machine and removed). Results are identical for every
// thread count.
#pragma once

#include <cstdint>

namespace dpsynth {

// Writes the suffix array of text[0, n) into sa[0, n). Every text[i] must be in
// [0, alphabet_size). Index type I must hold n (int32_t for n < 2^31 - 1).
template <class C, class I>
void suffix_array(const C* text, I* sa, int64_t n, int64_t alphabet_size, int threads);

}  // namespace dpsynth
