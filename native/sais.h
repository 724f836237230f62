// Suffix arrays over integer alphabets by induced sorting (SA-IS, Nong, Zhang & Chan 2009).
//
// Linear time and space; 16- or 32-bit tokens; 32- or 64-bit indices. With threads >= 2 the
// type classification, bucket counting and LMS-substring naming run on several threads, and
// every induced-sorting pass (the bulk of the work) is pipelined over two threads: a reader
// thread resolves the next block's predecessor symbols (the random reads of the text) while
// the writer thread places the current block. Results are identical for every thread count.
#pragma once

#include <cstdint>

namespace dpsynth {

// Writes the suffix array of text[0, n) into sa[0, n). Every text[i] must be in
// [0, alphabet_size). Index type I must hold n (int32_t for n < 2^31 - 1).
template <class C, class I>
void suffix_array(const C* text, I* sa, int64_t n, int64_t alphabet_size, int threads);

}  // namespace dpsynth
