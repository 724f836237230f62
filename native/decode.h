// Decoding spans of token ids to UTF-8 text through a piece table: for the tables that
// dpsynth/data/tokenizers.py builds, byte-identical to SentencePiece's
// SentencePieceProcessor::Decode(ids) (rules studied at v0.2.3; the Python side decides which
// models qualify and checks nothing else applies, e.g. no denormalizer).
//
// Piece table of n ids: id i's surface is surface[offsets[i], offsets[i + 1]), its kind[i] is
//   kVerbatim  the surface is appended as is (normal, user-defined and unused pieces with every
//              U+2581 already replaced by ' '; control pieces: empty; unknown: its unk_surface);
//   kSpace     the same, but the surface starts with the ' ' of a leading U+2581, dropped while
//              the span's output is still empty; with strip_all_leading false (SentencePiece's
//              add_dummy_prefix without remove_extra_whitespaces) only the first such drop of a
//              span happens;
//   kByte      a one-byte surface (a <0xXX> piece). Each maximal run of kByte ids (ended by any
//              kVerbatim or kSpace id, an empty one too) is appended one UTF-8 character at a
//              time; every structurally invalid byte (bad lead byte or continuation, truncated,
//              overlong, surrogate, above U+10FFFF) becomes U+FFFD;
//   kSkip      ignored as if absent, its surface unused (it does not end a run of kByte ids).
// A surface holds at most 65535 bytes, all surfaces together at most 2 GiB.
// Span s is tokens[starts[s], ends[s]) with 0 <= starts[s] <= ends[s] <= num_tokens, else
// std::invalid_argument; an id outside [0, n) throws std::out_of_range (nothing is written
// then); a malformed table throws std::invalid_argument. Output: the decoded spans
// concatenated in *out, span s being (*out)[out_offsets[s], out_offsets[s + 1]) (num_spans + 1
// offsets). Single-threaded.
#pragma once

#include <cstdint>
#include <string>

namespace dpsynth {

enum PieceKind : uint8_t { kVerbatim = 0, kSpace = 1, kByte = 2, kSkip = 3 };

struct PieceTable {
  const char* surface;
  int64_t surface_size;
  const int64_t* offsets;  // n + 1
  const uint8_t* kind;     // n
  int64_t n;
};

template <class T>
void decode_spans(const PieceTable& table, const T* tokens, int64_t num_tokens,
                  const int64_t* starts, const int64_t* ends, int64_t num_spans,
                  bool strip_all_leading, std::string* out, int64_t* out_offsets);

// JSON lines of documents made of spans (the dedup job's clean text, dpsynth/beam/dedup.py).
// Document d is spans [doc_spans[d], doc_spans[d + 1]) (num_docs + 1 offsets from 0 to
// num_spans, non-decreasing), its id the UTF-8 ids[id_offsets[d], id_offsets[d + 1]). Its text
// is its spans, each decoded as by decode_spans, empty ones dropped, joined by '\n'. A document
// whose text is empty or only whitespace (Python's str.isspace(), hard-coded from CPython 3.11)
// is left out; every other one appends the bytes of Python's
//   json.dumps({"id": id, "text": text}, ensure_ascii=False, sort_keys=True) + "\n"
// to *out: id and text escaped as json.encoder.encode_basestring does ('"', '\\' and \b \f \n
// \r \t as two-character escapes, other bytes below 0x20 as \u00xx in lowercase hex, every
// other byte copied). Decoded text is valid UTF-8 when the table's surfaces are (byte runs are
// made valid); an invalid byte counts as non-whitespace and is copied. Returns the number of
// documents left out. Errors as decode_spans, and std::invalid_argument for bad offsets.
template <class T>
int64_t decode_jsonl(const PieceTable& table, const T* tokens, int64_t num_tokens,
                     const int64_t* starts, const int64_t* ends, int64_t num_spans,
                     const int64_t* doc_spans, const char* ids, int64_t ids_size,
                     const int64_t* id_offsets, int64_t num_docs, bool strip_all_leading,
                     std::string* out);

}  // namespace dpsynth
