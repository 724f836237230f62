// Span decoding through a piece table, to text or to JSON lines (contracts in decode.h).
#include "decode.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace dpsynth {

namespace {

bool is_trail(unsigned char c) { return (c & 0xC0) == 0x80; }

// Length of the valid UTF-8 character at b[0, n) (n >= 1), or 0 when b[0] starts no valid one:
// the structural rule of SentencePiece's string_util::DecodeUTF8 (shortest form only, no
// surrogates, nothing above U+10FFFF).
size_t utf8_char_len(const unsigned char* b, size_t n) {
  const unsigned char c = b[0];
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) {
    return n >= 2 && is_trail(b[1]) && c >= 0xC2 ? 2 : 0;
  }
  if ((c & 0xF0) == 0xE0) {
    if (n < 3 || !is_trail(b[1]) || !is_trail(b[2])) return 0;
    const uint32_t cp = ((c & 0x0Fu) << 12) | ((b[1] & 0x3Fu) << 6) | (b[2] & 0x3Fu);
    return cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF) ? 3 : 0;
  }
  if ((c & 0xF8) == 0xF0) {
    if (n < 4 || !is_trail(b[1]) || !is_trail(b[2]) || !is_trail(b[3])) return 0;
    const uint32_t cp = ((c & 0x07u) << 18) | ((b[1] & 0x3Fu) << 12) | ((b[2] & 0x3Fu) << 6) |
                        (b[3] & 0x3Fu);
    return cp >= 0x10000 && cp <= 0x10FFFF ? 4 : 0;
  }
  return 0;
}

// Appends bytes b[0, n) at w, each invalid byte as U+FFFD; returns the new end.
char* append_bytes(const unsigned char* b, size_t n, char* w) {
  size_t i = 0;
  while (i < n) {
    const size_t len = utf8_char_len(b + i, n - i);
    if (len == 0) {
      std::memcpy(w, "\xEF\xBF\xBD", 3);
      w += 3;
      ++i;
    } else {
      std::memcpy(w, b + i, len);
      w += len;
      i += len;
    }
  }
  return w;
}

// One id of the table, packed so that a token costs one load: its surface is
// surface[off, off + len) of the padded copy.
struct Entry {
  uint32_t off;
  uint16_t len;
  uint8_t kind;
};

// Surfaces of up to kWide bytes are copied as kWide bytes (one vector move, no memcpy call)
// from a copy of the surfaces padded by kWide bytes into an output with kWide bytes of slack.
constexpr int64_t kWide = 16;

// Checks the table and packs it into `entries` and `padded`.
void pack_table(const PieceTable& t, const char* who, std::vector<Entry>* entries,
                std::vector<char>* padded) {
  auto fail = [who](const char* what) {
    throw std::invalid_argument(std::string(who) + ": piece table: " + what);
  };
  if (t.offsets[0] < 0 || t.offsets[t.n] > t.surface_size) fail("offsets outside the surface");
  if (t.surface_size > (int64_t{1} << 31)) fail("surfaces above 2 GiB");
  entries->resize(t.n);
  for (int64_t i = 0; i < t.n; ++i) {
    const int64_t len = t.offsets[i + 1] - t.offsets[i];
    if (len < 0) fail("decreasing offsets");
    if (len > 0xFFFF) fail("a surface above 65535 bytes");
    switch (t.kind[i]) {
      case kVerbatim:
      case kSkip:
        break;
      case kSpace:
        if (len < 1 || t.surface[t.offsets[i]] != ' ') fail("a kSpace surface must start with ' '");
        break;
      case kByte:
        if (len != 1) fail("a kByte surface must be one byte");
        break;
      default:
        fail("unknown kind");
    }
    const uint16_t used = t.kind[i] == kSkip ? 0 : static_cast<uint16_t>(len);
    (*entries)[i] = {static_cast<uint32_t>(t.offsets[i]), used, t.kind[i]};
  }
  padded->assign(t.surface, t.surface + t.surface_size);
  padded->resize(t.surface_size + kWide);
}

// Decodes spans of one token array through a packed table; `who` names the caller in errors.
class SpanDecoder {
 public:
  SpanDecoder(const PieceTable& table, bool strip_all_leading, const char* who)
      : n_(static_cast<uint64_t>(table.n)), strip_all_leading_(strip_all_leading), who_(who) {
    pack_table(table, who, &entries_, &padded_);
  }

  // Checks every span and id; returns a bound on the decoded bytes of all spans (a byte piece
  // writes at most 3 bytes) and sets *max_span to the largest bound of one span.
  template <class T>
  int64_t check(const T* tokens, int64_t num_tokens, const int64_t* starts, const int64_t* ends,
                int64_t num_spans, int64_t* max_span) const {
    int64_t bound = 0;
    *max_span = 0;
    for (int64_t s = 0; s < num_spans; ++s) {
      if (starts[s] < 0 || starts[s] > ends[s] || ends[s] > num_tokens) {
        throw std::invalid_argument(std::string(who_) + ": span " + std::to_string(s) + " [" +
                                    std::to_string(starts[s]) + ", " + std::to_string(ends[s]) +
                                    ") is not within the " + std::to_string(num_tokens) +
                                    " tokens");
      }
      int64_t span = 0;
      for (int64_t i = starts[s]; i < ends[s]; ++i) {
        const uint64_t id = static_cast<uint64_t>(tokens[i]);  // negative ids become huge
        if (id >= n_) {
          throw std::out_of_range(std::string(who_) + ": token " + std::to_string(tokens[i]) +
                                  " at position " + std::to_string(i) + " is not an id of the " +
                                  std::to_string(n_) + "-piece table");
        }
        span += entries_[id].kind == kByte ? 3 : entries_[id].len;  // kSkip: no surface
      }
      bound += span;
      if (span > *max_span) *max_span = span;
    }
    return bound;
  }

  // Writes the decoded tokens[i, e) (checked) at w, which has kWide bytes of slack past the
  // span's bound; returns the end. Two loops: a leading ' ' is only ever dropped while nothing
  // is written, so the second loop (nearly every token) has no test for it.
  template <class T>
  [[gnu::noinline]] char* decode(const T* tokens, int64_t i, int64_t e, char* w) {
    char* const begin = w;
    bool may_strip = true;  // a leading ' ' may still be dropped
    while (i < e && w == begin) {
      const Entry x = entries_[tokens[i]];
      if (x.kind == kByte) {
        i = append_run(tokens, i, e, &w);
      } else if (x.kind == kSpace && may_strip) {
        append(x.off + 1, x.len - 1, &w);
        may_strip = strip_all_leading_;
        ++i;
      } else {
        append(x.off, x.len, &w);
        ++i;
      }
    }
    while (i < e) {
      const Entry x = entries_[tokens[i]];
      if (x.kind == kByte) {
        i = append_run(tokens, i, e, &w);
      } else {
        append(x.off, x.len, &w);
        ++i;
      }
    }
    return w;
  }

 private:
  // Appends surface[off, off + len) at *w.
  void append(uint32_t off, int64_t len, char** w) const {
    const char* p = padded_.data() + off;
    if (len <= kWide) {
      std::memcpy(*w, p, kWide);
    } else {
      std::memcpy(*w, p, len);
    }
    *w += len;
  }

  // Appends the run of byte pieces (kSkip ids inside it ignored) that starts at tokens[i] as
  // UTF-8 characters; returns the index past it.
  template <class T>
  int64_t append_run(const T* tokens, int64_t i, int64_t e, char** w) {
    run_.clear();
    for (; i < e; ++i) {
      const Entry y = entries_[tokens[i]];
      if (y.kind == kByte) {
        run_.push_back(static_cast<unsigned char>(padded_[y.off]));
      } else if (y.kind != kSkip) {
        break;
      }
    }
    *w = append_bytes(run_.data(), run_.size(), *w);
    return i;
  }

  std::vector<Entry> entries_;
  std::vector<char> padded_;
  std::vector<unsigned char> run_;  // the current run of byte pieces
  uint64_t n_;
  bool strip_all_leading_;
  const char* who_;
};

// Python's str.isspace() of one code point (CPython 3.11, Unicode 14; tested over all of them).
bool is_space(uint32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  switch (c) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

// Whether b[0, n) holds a character that is not whitespace (an invalid UTF-8 byte counts as one).
bool has_non_space(const unsigned char* b, size_t n) {
  size_t i = 0;
  while (i < n) {
    const unsigned char c = b[i];
    if (c < 0x80) {
      if (!is_space(c)) return true;
      ++i;
      continue;
    }
    const size_t len = utf8_char_len(b + i, n - i);
    if (len == 0) return true;
    uint32_t cp = c & (0x7Fu >> len);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (b[i + k] & 0x3Fu);
    if (!is_space(cp)) return true;
    i += len;
  }
  return false;
}

// What follows '\\' in the JSON escape of byte c (0: c is copied as is), as CPython's
// json.encoder.encode_basestring (ensure_ascii=False): 'u' means \u00XX, lowercase hex.
struct EscapeTable {
  char next[256] = {};
  constexpr EscapeTable() {
    for (int c = 0; c < 0x20; ++c) next[c] = 'u';
    next['\b'] = 'b';
    next['\f'] = 'f';
    next['\n'] = 'n';
    next['\r'] = 'r';
    next['\t'] = 't';
    next['"'] = '"';
    next['\\'] = '\\';
  }
};
constexpr EscapeTable kEscape;

// One flag bit (0x80) per byte of v below 0x20, '"' or '\\', and maybe on bytes above a
// flagged one: the lowest flag marks exactly the first byte to escape (borrows only carry up).
inline uint64_t escape_flags(uint64_t v) {
  constexpr uint64_t kOnes = 0x0101010101010101ULL, kHighs = 0x8080808080808080ULL;
  const uint64_t quote = v ^ (kOnes * '"'), backslash = v ^ (kOnes * '\\');
  return (((v - kOnes * 0x20) & ~v) | ((quote - kOnes) & ~quote) |
          ((backslash - kOnes) & ~backslash)) & kHighs;
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "escape_flags: the first byte is the lowest");

// Appends the JSON-escaped b[0, n) at w (room for 6 n bytes); returns the end.
char* append_escaped(const char* b, size_t n, char* w) {
  static constexpr char kHex[] = "0123456789abcdef";
  size_t i = 0;
  while (true) {
    while (i + 8 <= n) {  // 8 bytes at a time up to the next byte to escape
      uint64_t v;
      std::memcpy(&v, b + i, 8);
      std::memcpy(w, &v, 8);  // within the room: the 8 bytes are at least copied
      const uint64_t flags = escape_flags(v);
      if (flags != 0) {
        const size_t k = __builtin_ctzll(flags) / 8;
        w += k;
        i += k;
        break;
      }
      w += 8;
      i += 8;
    }
    if (i == n) return w;
    const unsigned char c = static_cast<unsigned char>(b[i++]);  // to escape, or in the tail
    const char e = kEscape.next[c];
    if (e == 0) {
      *w++ = static_cast<char>(c);
    } else if (e != 'u') {
      w[0] = '\\';
      w[1] = e;
      w += 2;
    } else {
      std::memcpy(w, "\\u00", 4);
      w[4] = kHex[c >> 4];
      w[5] = kHex[c & 15];
      w += 6;
    }
  }
}

// A growable output: room(k) makes k bytes writable at w.
class Output {
 public:
  explicit Output(std::string* out, size_t initial) : out_(out) {
    out_->resize(initial);
    w = out_->data();
  }
  void room(size_t k) {
    const size_t used = w - out_->data();
    if (used + k > out_->size()) {
      out_->resize(std::max(2 * out_->size(), used + k));
      w = out_->data() + used;
    }
  }
  void put(const char* p, size_t k) {  // after room(k)
    std::memcpy(w, p, k);
    w += k;
  }
  size_t size() const { return w - out_->data(); }
  void truncate(size_t size) { w = out_->data() + size; }
  void finish() { out_->resize(size()); }
  char* w;

 private:
  std::string* out_;
};

}  // namespace

template <class T>
void decode_spans(const PieceTable& table, const T* tokens, int64_t num_tokens,
                  const int64_t* starts, const int64_t* ends, int64_t num_spans,
                  bool strip_all_leading, std::string* out, int64_t* out_offsets) {
  SpanDecoder decoder(table, strip_all_leading, "decode_spans");
  int64_t max_span;
  const int64_t bound = decoder.check(tokens, num_tokens, starts, ends, num_spans, &max_span);
  out->resize(bound + kWide);
  char* const base = out->data();
  char* w = base;
  out_offsets[0] = 0;
  for (int64_t s = 0; s < num_spans; ++s) {
    w = decoder.decode(tokens, starts[s], ends[s], w);
    out_offsets[s + 1] = w - base;
  }
  out->resize(w - base);
}

template <class T>
int64_t decode_jsonl(const PieceTable& table, const T* tokens, int64_t num_tokens,
                     const int64_t* starts, const int64_t* ends, int64_t num_spans,
                     const int64_t* doc_spans, const char* ids, int64_t ids_size,
                     const int64_t* id_offsets, int64_t num_docs, bool strip_all_leading,
                     std::string* out) {
  SpanDecoder decoder(table, strip_all_leading, "decode_jsonl");
  int64_t max_span;
  const int64_t bound = decoder.check(tokens, num_tokens, starts, ends, num_spans, &max_span);
  if (doc_spans[0] != 0 || doc_spans[num_docs] != num_spans) {
    throw std::invalid_argument("decode_jsonl: document spans must run from 0 to the " +
                                std::to_string(num_spans) + " spans");
  }
  if (id_offsets[0] < 0 || id_offsets[num_docs] > ids_size) {
    throw std::invalid_argument("decode_jsonl: id offsets outside the ids");
  }
  int64_t max_id = 0;
  for (int64_t d = 0; d < num_docs; ++d) {
    if (doc_spans[d + 1] < doc_spans[d] || id_offsets[d + 1] < id_offsets[d]) {
      throw std::invalid_argument("decode_jsonl: decreasing offsets at document " +
                                  std::to_string(d));
    }
    max_id = std::max(max_id, id_offsets[d + 1] - id_offsets[d]);
  }
  static constexpr char kHead[] = "{\"id\": \"", kText[] = "\", \"text\": \"", kTail[] = "\"}\n";
  constexpr size_t kLineBytes = sizeof(kHead) + sizeof(kText) + sizeof(kTail);  // with 3 spare
  std::vector<char> text(max_span + kWide);  // one decoded span
  // Room for every line unescaped, plus what room() asks beyond that for one span or id (its
  // worst case): with few escapes, the output never grows.
  Output o(out, bound + (id_offsets[num_docs] - id_offsets[0]) + num_docs * kLineBytes +
                    6 * (max_span + max_id) + 2 * kLineBytes);
  int64_t left_out = 0;
  for (int64_t d = 0; d < num_docs; ++d) {
    const size_t line = o.size();
    const size_t id_size = id_offsets[d + 1] - id_offsets[d];
    o.room(kLineBytes + 6 * id_size);
    o.put(kHead, sizeof(kHead) - 1);
    o.w = append_escaped(ids + id_offsets[d], id_size, o.w);
    o.put(kText, sizeof(kText) - 1);
    bool kept = false, first = true;
    for (int64_t s = doc_spans[d]; s < doc_spans[d + 1]; ++s) {
      const size_t size = decoder.decode(tokens, starts[s], ends[s], text.data()) - text.data();
      if (size == 0) continue;
      o.room(2 + 6 * size + sizeof(kTail));
      if (!first) o.put("\\n", 2);
      first = false;
      kept = kept || has_non_space(reinterpret_cast<const unsigned char*>(text.data()), size);
      o.w = append_escaped(text.data(), size, o.w);
    }
    if (!kept) {  // empty, or whitespace only
      o.truncate(line);
      ++left_out;
      continue;
    }
    o.put(kTail, sizeof(kTail) - 1);
  }
  o.finish();
  return left_out;
}

template void decode_spans<uint16_t>(const PieceTable&, const uint16_t*, int64_t, const int64_t*,
                                     const int64_t*, int64_t, bool, std::string*, int64_t*);
template void decode_spans<uint32_t>(const PieceTable&, const uint32_t*, int64_t, const int64_t*,
                                     const int64_t*, int64_t, bool, std::string*, int64_t*);
template void decode_spans<int32_t>(const PieceTable&, const int32_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, bool, std::string*, int64_t*);
template void decode_spans<int64_t>(const PieceTable&, const int64_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, bool, std::string*, int64_t*);

template int64_t decode_jsonl<uint16_t>(const PieceTable&, const uint16_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, const int64_t*, const char*,
                                    int64_t, const int64_t*, int64_t, bool, std::string*);
template int64_t decode_jsonl<uint32_t>(const PieceTable&, const uint32_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, const int64_t*, const char*,
                                    int64_t, const int64_t*, int64_t, bool, std::string*);
template int64_t decode_jsonl<int32_t>(const PieceTable&, const int32_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, const int64_t*, const char*,
                                    int64_t, const int64_t*, int64_t, bool, std::string*);
template int64_t decode_jsonl<int64_t>(const PieceTable&, const int64_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, const int64_t*, const char*,
                                    int64_t, const int64_t*, int64_t, bool, std::string*);

}  // namespace dpsynth
