// Python bindings of dpsynth._native. Binds only: the algorithms live in sais.cc and lcp.cc;
// dtype/width/contiguity policy lives in dpsynth/dedup/suffix_array.py. Arrays are taken
// without conversion (the wrapper passes exact dtypes) and the GIL is released while working.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>

#include "lcp.h"
#include "sais.h"

namespace py = pybind11;

namespace {

template <class T>
using Arr = py::array_t<T, py::array::c_style>;

void check_same_size(int64_t a, int64_t b, const char* what) {
  if (a != b) throw std::invalid_argument(std::string(what) + ": array lengths differ");
}

template <class C, class I>
void bind_sa(py::module_& m) {
  m.def(
      "suffix_array",
      [](Arr<C> text, Arr<I> out, int64_t alphabet_size, int threads) {
        check_same_size(text.size(), out.size(), "suffix_array");
        const C* t = text.data();
        I* sa = out.mutable_data();
        int64_t n = text.size();
        py::gil_scoped_release release;
        dpsynth::suffix_array<C, I>(t, sa, n, alphabet_size, threads);
      },
      py::arg("text").noconvert(), py::arg("out").noconvert(), py::arg("alphabet_size"),
      py::arg("threads"));
  m.def(
      "lcp_array",
      [](Arr<C> text, Arr<I> sa, Arr<I> out, int threads) {
        check_same_size(text.size(), sa.size(), "lcp_array");
        check_same_size(text.size(), out.size(), "lcp_array");
        const C* t = text.data();
        const I* s = sa.data();
        I* l = out.mutable_data();
        int64_t n = text.size();
        py::gil_scoped_release release;
        dpsynth::lcp_array<C, I>(t, s, l, n, threads);
      },
      py::arg("text").noconvert(), py::arg("sa").noconvert(), py::arg("out").noconvert(),
      py::arg("threads"));
}

template <class I>
void bind_cross(py::module_& m) {
  m.def(
      "cross_match",
      [](Arr<I> sa, Arr<I> lcp, Arr<I> out, int64_t split) {
        check_same_size(sa.size(), lcp.size(), "cross_match");
        check_same_size(sa.size(), out.size(), "cross_match");
        const I* s = sa.data();
        const I* l = lcp.data();
        I* o = out.mutable_data();
        int64_t n = sa.size();
        py::gil_scoped_release release;
        dpsynth::cross_match<I>(s, l, o, n, split);
      },
      py::arg("sa").noconvert(), py::arg("lcp").noconvert(), py::arg("out").noconvert(),
      py::arg("split"));
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "dpsynth native code: SA-IS suffix arrays, LCP arrays, cross-set matching.";
  bind_sa<uint16_t, int32_t>(m);
  bind_sa<uint16_t, int64_t>(m);
  bind_sa<uint32_t, int32_t>(m);
  bind_sa<uint32_t, int64_t>(m);
  bind_cross<int32_t>(m);
  bind_cross<int64_t>(m);
}
