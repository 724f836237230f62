// Span decoding through a piece table (contract in decode.h).
#include "decode.h"

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
void pack_table(const PieceTable& t, std::vector<Entry>* entries, std::vector<char>* padded) {
  auto fail = [](const char* what) {
    throw std::invalid_argument(std::string("decode_spans: piece table: ") + what);
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

}  // namespace

template <class T>
void decode_spans(const PieceTable& table, const T* tokens, int64_t num_tokens,
                  const int64_t* starts, const int64_t* ends, int64_t num_spans,
                  bool strip_all_leading, std::string* out, int64_t* out_offsets) {
  std::vector<Entry> entries;
  std::vector<char> padded;
  pack_table(table, &entries, &padded);
  const Entry* entry = entries.data();
  const char* surface = padded.data();
  const uint64_t n = static_cast<uint64_t>(table.n);

  // Checks every span and id, and bounds the output (a byte piece writes at most 3 bytes).
  int64_t bound = 0;
  for (int64_t s = 0; s < num_spans; ++s) {
    if (starts[s] < 0 || starts[s] > ends[s] || ends[s] > num_tokens) {
      throw std::invalid_argument("decode_spans: span " + std::to_string(s) + " [" +
                                  std::to_string(starts[s]) + ", " + std::to_string(ends[s]) +
                                  ") is not within the " + std::to_string(num_tokens) +
                                  " tokens");
    }
    for (int64_t i = starts[s]; i < ends[s]; ++i) {
      const uint64_t id = static_cast<uint64_t>(tokens[i]);  // negative ids become huge
      if (id >= n) {
        throw std::out_of_range("decode_spans: token " + std::to_string(tokens[i]) +
                                " at position " + std::to_string(i) + " is not an id of the " +
                                std::to_string(n) + "-piece table");
      }
      bound += entry[id].kind == kByte ? 3 : entry[id].len;  // kSkip: no surface
    }
  }

  out->resize(bound + kWide);
  char* const base = out->data();
  char* w = base;
  std::vector<unsigned char> run;  // the current run of byte pieces
  out_offsets[0] = 0;
  for (int64_t s = 0; s < num_spans; ++s) {
    char* const span_begin = w;
    bool may_strip = true;  // a leading ' ' may still be dropped
    int64_t i = starts[s];
    const int64_t e = ends[s];
    while (i < e) {
      const Entry x = entry[tokens[i]];
      if (x.kind == kByte) {
        run.clear();
        for (; i < e; ++i) {
          const Entry y = entry[tokens[i]];
          if (y.kind == kByte) {
            run.push_back(static_cast<unsigned char>(surface[y.off]));
          } else if (y.kind != kSkip) {
            break;
          }
        }
        w = append_bytes(run.data(), run.size(), w);
        continue;
      }
      ++i;
      const char* p = surface + x.off;
      int64_t len = x.len;
      if (x.kind == kSpace && may_strip && w == span_begin) {
        ++p;
        --len;
        may_strip = strip_all_leading;
      }
      if (len <= kWide) {
        std::memcpy(w, p, kWide);
      } else {
        std::memcpy(w, p, len);
      }
      w += len;
    }
    out_offsets[s + 1] = w - base;
  }
  out->resize(w - base);
}

template void decode_spans<uint16_t>(const PieceTable&, const uint16_t*, int64_t, const int64_t*,
                                     const int64_t*, int64_t, bool, std::string*, int64_t*);
template void decode_spans<uint32_t>(const PieceTable&, const uint32_t*, int64_t, const int64_t*,
                                     const int64_t*, int64_t, bool, std::string*, int64_t*);
template void decode_spans<int32_t>(const PieceTable&, const int32_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, bool, std::string*, int64_t*);
template void decode_spans<int64_t>(const PieceTable&, const int64_t*, int64_t, const int64_t*,
                                    const int64_t*, int64_t, bool, std::string*, int64_t*);

}  // namespace dpsynth
