// Python bindings of dpsynth._native. Binds only: the algorithms live in sais.cc, lcp.cc,
// match.cc and decode.cc; dtype/width/contiguity policy lives in
// dpsynth/dedup/suffix_array.py and (decoding) dpsynth/data/tokenizers.py. Arrays are taken
// without conversion (the wrapper passes exact dtypes) and the GIL is released while working.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "decode.h"
#include "lcp.h"
#include "match.h"
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

template <class C, class I>
void bind_match(py::module_& m) {
  m.def(
      "match_documents",
      [](Arr<uint32_t> text, Arr<I> sa, Arr<I> lcp, Arr<int64_t> first, Arr<int64_t> occ_start,
         Arr<I> occ_pos, Arr<uint8_t> occ_shift, Arr<int64_t> ckpt_start, Arr<I> ckpt, int64_t bound, Arr<C> tokens, Arr<int64_t> offsets, Arr<I> ms, Arr<I> best_la,
         Arr<I> best_lb, int threads) {
        int64_t m = text.size();
        check_same_size(sa.size(), m, "match_documents");
        check_same_size(lcp.size(), m, "match_documents");
        check_same_size(first.size(), bound + 1, "match_documents");
        check_same_size(occ_start.size(), bound + 1, "match_documents");
        check_same_size(occ_shift.size(), bound, "match_documents");
        check_same_size(ckpt_start.size(), bound, "match_documents");
        check_same_size(ms.size(), tokens.size(), "match_documents");
        check_same_size(best_la.size(), m + 1, "match_documents");
        check_same_size(best_lb.size(), m + 1, "match_documents");
        if (offsets.size() < 1) throw std::invalid_argument("match_documents: empty offsets");
        dpsynth::SensitiveSide<I> side{text.data(), sa.data(), lcp.data(), first.data(),
                                       occ_start.data(), occ_pos.data(), occ_shift.data(),
                                       ckpt_start.data(), ckpt.data(), m, bound};
        const C* t = tokens.data();
        const int64_t* o = offsets.data();
        int64_t docs = offsets.size() - 1;
        I* out = ms.mutable_data();
        I* la = best_la.mutable_data();
        I* lb = best_lb.mutable_data();
        py::gil_scoped_release release;
        dpsynth::match_documents<C, I>(side, t, o, docs, out, la, lb, threads);
      },
      py::arg("text").noconvert(), py::arg("sa").noconvert(), py::arg("lcp").noconvert(),
      py::arg("first").noconvert(), py::arg("occ_start").noconvert(), py::arg("occ_pos").noconvert(),
      py::arg("occ_shift").noconvert(), py::arg("ckpt_start").noconvert(), py::arg("ckpt").noconvert(),
      py::arg("bound"), py::arg("tokens").noconvert(), py::arg("offsets").noconvert(),
      py::arg("ms").noconvert(), py::arg("best_la").noconvert(), py::arg("best_lb").noconvert(),
      py::arg("threads"));
}

template <class I>
void bind_sweep(py::module_& m) {
  m.def(
      "sensitive_sweep",
      [](Arr<I> sa, Arr<I> lcp, Arr<I> best_la, Arr<I> best_lb, Arr<I> out) {
        int64_t n = sa.size();
        check_same_size(lcp.size(), n, "sensitive_sweep");
        check_same_size(out.size(), n, "sensitive_sweep");
        check_same_size(best_la.size(), n + 1, "sensitive_sweep");
        check_same_size(best_lb.size(), n + 1, "sensitive_sweep");
        const I* s = sa.data();
        const I* l = lcp.data();
        const I* la = best_la.data();
        const I* lb = best_lb.data();
        I* o = out.mutable_data();
        py::gil_scoped_release release;
        dpsynth::sensitive_sweep<I>(s, l, la, lb, n, o);
      },
      py::arg("sa").noconvert(), py::arg("lcp").noconvert(), py::arg("best_la").noconvert(),
      py::arg("best_lb").noconvert(), py::arg("out").noconvert());
}

template <class T>
void bind_decode(py::module_& m) {
  m.def(
      "decode_spans",
      [](Arr<uint8_t> surface, Arr<int64_t> offsets, Arr<uint8_t> kind, bool strip_all_leading,
         Arr<T> tokens, Arr<int64_t> starts, Arr<int64_t> ends) {
        check_same_size(offsets.size(), kind.size() + 1, "decode_spans (offsets, kind)");
        check_same_size(starts.size(), ends.size(), "decode_spans (starts, ends)");
        dpsynth::PieceTable table{reinterpret_cast<const char*>(surface.data()), surface.size(),
                                  offsets.data(), kind.data(), kind.size()};
        const T* t = tokens.data();
        int64_t num_tokens = tokens.size();
        const int64_t* a = starts.data();
        const int64_t* b = ends.data();
        int64_t spans = starts.size();
        std::string text;
        std::vector<int64_t> at(spans + 1);
        {
          py::gil_scoped_release release;
          dpsynth::decode_spans<T>(table, t, num_tokens, a, b, spans, strip_all_leading, &text,
                                   at.data());
        }
        py::list out(spans);
        for (int64_t s = 0; s < spans; ++s) {
          PyObject* str = PyUnicode_DecodeUTF8(text.data() + at[s], at[s + 1] - at[s], "strict");
          if (!str) throw py::error_already_set();
          PyList_SET_ITEM(out.ptr(), s, str);
        }
        return out;
      },
      py::arg("surface").noconvert(), py::arg("offsets").noconvert(), py::arg("kind").noconvert(),
      py::arg("strip_all_leading"), py::arg("tokens").noconvert(), py::arg("starts").noconvert(),
      py::arg("ends").noconvert());
  m.def(
      "decode_jsonl",
      [](Arr<uint8_t> surface, Arr<int64_t> offsets, Arr<uint8_t> kind, bool strip_all_leading,
         Arr<T> tokens, Arr<int64_t> starts, Arr<int64_t> ends, Arr<int64_t> doc_spans,
         Arr<uint8_t> ids, Arr<int64_t> id_offsets) {
        check_same_size(offsets.size(), kind.size() + 1, "decode_jsonl (offsets, kind)");
        check_same_size(starts.size(), ends.size(), "decode_jsonl (starts, ends)");
        check_same_size(doc_spans.size(), id_offsets.size(), "decode_jsonl (doc_spans, id_offsets)");
        if (doc_spans.size() < 1) throw std::invalid_argument("decode_jsonl: empty doc_spans");
        dpsynth::PieceTable table{reinterpret_cast<const char*>(surface.data()), surface.size(),
                                  offsets.data(), kind.data(), kind.size()};
        const T* t = tokens.data();
        const int64_t num_tokens = tokens.size(), spans = starts.size(), docs = doc_spans.size() - 1;
        const int64_t* a = starts.data();
        const int64_t* b = ends.data();
        const int64_t* d = doc_spans.data();
        const char* i = reinterpret_cast<const char*>(ids.data());
        const int64_t ids_size = ids.size();
        const int64_t* io = id_offsets.data();
        // One output buffer per thread (the GIL is released: threads never share it), reused by
        // every call: a fresh one per shard (10+ MB) cost about as much again in page faults.
        // Above kKeepBytes it is freed after the call, so big shards leave no buffer behind.
        constexpr size_t kKeepBytes = size_t{64} << 20;
        thread_local std::string jsonl;
        int64_t left_out;
        {
          py::gil_scoped_release release;
          left_out = dpsynth::decode_jsonl<T>(table, t, num_tokens, a, b, spans, d, i, ids_size, io,
                                              docs, strip_all_leading, &jsonl);
        }
        py::bytes out(jsonl);
        if (jsonl.capacity() > kKeepBytes) std::string().swap(jsonl);
        return py::make_tuple(std::move(out), left_out);
      },
      py::arg("surface").noconvert(), py::arg("offsets").noconvert(), py::arg("kind").noconvert(),
      py::arg("strip_all_leading"), py::arg("tokens").noconvert(), py::arg("starts").noconvert(),
      py::arg("ends").noconvert(), py::arg("doc_spans").noconvert(), py::arg("ids").noconvert(),
      py::arg("id_offsets").noconvert());
}

}  // namespace

PYBIND11_MODULE(_native, m) {
  m.doc() = "dpsynth native code: SA-IS suffix arrays, LCP arrays, cross-set matching, matching against a prebuilt suffix array, decoding token spans to text or JSON lines.";
  bind_sa<uint16_t, int32_t>(m);
  bind_sa<uint16_t, int64_t>(m);
  bind_sa<uint32_t, int32_t>(m);
  bind_sa<uint32_t, int64_t>(m);
  bind_cross<int32_t>(m);
  bind_cross<int64_t>(m);
  bind_match<uint16_t, int32_t>(m);
  bind_match<uint16_t, int64_t>(m);
  bind_match<uint32_t, int32_t>(m);
  bind_match<uint32_t, int64_t>(m);
  bind_sweep<int32_t>(m);
  bind_sweep<int64_t>(m);
  bind_decode<uint16_t>(m);
  bind_decode<uint32_t>(m);
  bind_decode<int32_t>(m);
  bind_decode<int64_t>(m);
}
