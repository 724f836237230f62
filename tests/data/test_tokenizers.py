"""Tests for dpsynth.data.tokenizers: the SentencePiece wrapper (special ids, batching, pickling) and its
native span decoder and JSON-lines writer, against SentencePiece itself and Python's json."""

import json
import pathlib
import random
from json.encoder import encode_basestring

import numpy as np
import pytest

from dpsynth.data.tokenizer_training import train_tokenizer
from dpsynth.data.tokenizers import BOS_ID, EOS_ID, PAD_ID, HFTokenizer, Tokenizer

FIXTURES = pathlib.Path(__file__).parents[1] / "models" / "fixtures" / "hf"


@pytest.fixture(scope="module")
def tokenizer():
    rng = random.Random(0)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    texts = [" ".join(rng.choice(words) for _ in range(200)) for _ in range(10)]
    return train_tokenizer(texts, vocab_size=300)


def test_tokenizer_special_ids_roundtrip_and_pickle(tmp_path, tokenizer):
    import pickle

    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (0, 1, 2, 3)
    text = "alpha beta gamma, Ünïcode ✓ 🙂"
    ids = tokenizer.encode(text)
    assert ids.dtype == np.int32 and ids.min() > 3
    assert tokenizer.decode(ids) == text  # byte fallback keeps unseen characters
    assert tokenizer.decode([BOS_ID, *ids, EOS_ID, PAD_ID]) == text
    batch = tokenizer.encode_batch([text, "beta"])
    np.testing.assert_array_equal(batch[0], ids)
    tokenizer.save(str(tmp_path / "m.model"))
    loaded = Tokenizer.load(str(tmp_path / "m.model"))
    assert loaded.sha256 == tokenizer.sha256
    clone = pickle.loads(pickle.dumps(tokenizer))
    np.testing.assert_array_equal(clone.encode(text), ids)


def test_decode_spans_equals_decode_of_each_span(tokenizer):
    rng = np.random.default_rng(3)
    tokens = rng.integers(0, tokenizer.vocab_size, size=400)
    tokens[[5, 6, 100, 399]] = [PAD_ID, BOS_ID, EOS_ID, PAD_ID]  # dropped, as by decode
    starts = np.array([0, 3, 3, 50, 120, 399, 0])
    ends = np.array([10, 3, 101, 200, 400, 400, 400])
    expected = [tokenizer.decode(tokens[a:b]) for a, b in zip(starts, ends)]
    assert tokenizer.decode_spans(tokens, starts, ends) == expected
    assert tokenizer.decode_batch([tokens[a:b] for a, b in zip(starts, ends)]) == expected
    assert tokenizer.decode_batch([]) == [] and tokenizer.decode_spans(tokens, [], []) == []


# ----------------------------------------------------------------------------- native decoding
# `decode_spans` decodes natively; every check compares with SentencePiece's own `decode`.

CORPUS = """The quick brown fox jumps over the lazy dog.  Two  spaces,   three   spaces.
Café naïve résumé, ÅÄÖ åäö, 日本語のテキスト, emoji 😀🙂 and ✓ marks.
    indented line with trailing spaces
Privacy is a property of the mechanism, not of the output. 0123456789
""".splitlines() * 20
SETTINGS = {  # SentencePieceTrainer options of the models the native decoder must match (and dpsynth's)
    "dpsynth-unigram": None,  # dpsynth.data.tokenizer_training.train_tokenizer
    "dpsynth-bpe": None,
    "unigram-no-fallback": dict(model_type="unigram", byte_fallback=False, control_symbols=["<ctl>"],
                                user_defined_symbols=["<ud>", "▁▁"]),
    "bpe-llama2": dict(model_type="bpe", byte_fallback=True, allow_whitespace_only_pieces=True,
                       remove_extra_whitespaces=False, normalization_rule_name="identity"),
    "bpe-no-dummy-prefix": dict(model_type="bpe", byte_fallback=True, add_dummy_prefix=False,
                                remove_extra_whitespaces=False, allow_whitespace_only_pieces=True),
    "unigram-no-dummy-prefix": dict(model_type="unigram", byte_fallback=True, add_dummy_prefix=False),
    "unigram-unk-surface": dict(model_type="unigram", byte_fallback=False, unk_surface="<?>"),
    "unigram-empty-unk-surface": dict(model_type="unigram", byte_fallback=False, unk_surface=""),
    "bpe-suffix-whitespace": dict(model_type="bpe", byte_fallback=True, treat_whitespace_as_suffix=True),
    "char": dict(model_type="char", byte_fallback=True, remove_extra_whitespaces=False),
}
# Byte sequences spelled with byte pieces: valid characters (2-4 bytes, U+2581, U+FFFD) and what
# SentencePiece must replace by U+FFFD (stray continuation, truncated, overlong, surrogate,
# above U+10FFFF, bytes that never occur in UTF-8).
BYTE_RUNS = [c.encode() for c in "aé€日😀▁\ufffd\x00"] + [
    b"\x80", b"\xc0\x80", b"\xc1\xbf", b"\xe2\x82", b"\xe0\x80\x80", b"\xed\xa0\x80", b"\xf0\x9f\x98",
    b"\xf4\x90\x80\x80", b"\xf8\x88\x80\x80\x80", b"\xff", b"\xc2", b"\xe2\x82\xac\xac"]


def _train_sp(**options) -> bytes:
    import io

    import sentencepiece as spm

    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=out, vocab_size=400,
                                   hard_vocab_limit=False, minloglevel=2, pad_id=PAD_ID, unk_id=1, bos_id=BOS_ID,
                                   eos_id=EOS_ID, **options)
    return out.getvalue()


def _random_tokens(sp, rng: np.random.Generator, n: int) -> np.ndarray:
    """`n` ids mixing every kind: any id, control/unknown ids, pieces starting with U+2581, and
    runs of byte pieces spelling valid and invalid UTF-8."""
    size = sp.get_piece_size()
    byte_id = {int(sp.id_to_piece(i)[3:5], 16): i for i in range(size) if sp.is_byte(i)}
    special = [i for i in range(size) if sp.is_control(i) or sp.is_unknown(i)]
    spacey = [i for i in range(size) if sp.id_to_piece(i).startswith("\u2581")]
    out: list[int] = []
    while len(out) < n:
        r = rng.random()
        if r < 0.3:
            out.append(int(rng.integers(size)))
        elif r < 0.45:
            out.append(int(rng.choice(special)))
        elif r < 0.7:
            out.append(int(rng.choice(spacey)))
        elif byte_id:
            run = BYTE_RUNS[rng.integers(len(BYTE_RUNS))] if rng.random() < 0.8 else rng.bytes(3)
            out.extend(byte_id[b] for b in run)
    return np.array(out[:n], np.int64)


def _spans(rng: np.random.Generator, n: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Random spans, mostly short (leading-space rules apply at each start), empty ones, the ends."""
    starts = rng.integers(0, n + 1, count)
    ends = np.minimum(starts + rng.integers(0, 12, count) * rng.choice([1, 1, 1, 30], count), n)
    extra = [(0, 0), (n, n), (n - 1, n), (0, n), (n - 5, n)]
    return (np.concatenate([starts, [a for a, _ in extra]]), np.concatenate([ends, [b for _, b in extra]]))


def _sp_reference(proto: bytes, tokens: np.ndarray, starts, ends, drop) -> list[str]:
    """SentencePiece's decode of every span, `drop` ids removed first (as `Tokenizer.decode`)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=proto)
    ids = tokens.astype(np.int64).tolist()
    return [sp.decode([i for i in ids[a:b] if i not in drop]) for a, b in zip(starts.tolist(), ends.tolist())]


@pytest.fixture(scope="module", params=sorted(SETTINGS))
def model(request):
    name = request.param
    if SETTINGS[name] is None:
        return name, train_tokenizer(CORPUS, vocab_size=400, model_type=name.split("-")[1]).model_proto
    return name, _train_sp(**SETTINGS[name])


def test_native_decode_spans_equals_sentencepiece(model):
    name, proto = model
    tok = Tokenizer(proto)
    assert tok._pieces is not None  # the native path is taken for every model here
    rng = np.random.default_rng(len(name))
    tokens = _random_tokens(tok._sp, rng, 3000)
    starts, ends = _spans(rng, tokens.size, 800)
    expected = _sp_reference(proto, tokens, starts, ends, {PAD_ID, BOS_ID, EOS_ID})
    dtypes = [np.uint16, np.uint32, np.int32, np.int64, np.int16, np.dtype(">u2")]  # the last two converted
    for dtype in dtypes:
        assert tok.decode_spans(tokens.astype(dtype), starts, ends) == expected, dtype


@pytest.mark.parametrize("name, special", [("gemma", {"pad": 0, "eos": 1, "bos": 2, "unk": 3}),
                                           ("mistral", {"pad": 0, "unk": 0, "bos": 1, "eos": 2})])
def test_native_decode_of_imported_models(name, special):
    proto = (FIXTURES / name / "tokenizer.model").read_bytes()
    tok = Tokenizer(proto, special)
    assert tok._pieces is not None
    rng = np.random.default_rng(4)
    tokens = _random_tokens(tok._sp, rng, 3000)
    starts, ends = _spans(rng, tokens.size, 800)
    drop = {special["pad"], special["bos"], special["eos"]}
    assert tok.decode_spans(tokens.astype(np.uint16), starts, ends) == _sp_reference(proto, tokens, starts, ends, drop)


def test_hf_tokenizer_decode_spans_equals_decode():
    tok = HFTokenizer((FIXTURES / "qwen2" / "tokenizer.json").read_bytes(), {"bos": 0, "eos": 2, "pad": 0, "unk": 0})
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, tok.vocab_size, 400).astype(np.uint32)
    starts, ends = _spans(rng, tokens.size, 50)
    assert tok.decode_spans(tokens, starts, ends) == [tok.decode(tokens[a:b]) for a, b in zip(starts, ends)]
    assert tok.decode_spans(tokens, [], []) == []


def test_native_decode_of_encoded_texts(model):
    name, proto = model
    tok = Tokenizer(proto)
    texts = CORPUS[:4] + ["", " ", "   leading", "a  b\n\nc", "\u2581 meta", "😀x", "<ud><ctl> x", "tail  "]
    docs = [tok.encode(t) for t in texts]
    assert tok.decode_batch(docs) == [tok._sp.decode(d.tolist()) for d in docs]


def test_native_decode_drops_special_ids_inside_byte_runs():
    tok = train_tokenizer(CORPUS, vocab_size=400, model_type="bpe")
    proto = tok.model_proto
    euro = [tok._sp.piece_to_id(f"<0x{b:02X}>") for b in "€".encode()]
    tokens = np.array([euro[0], PAD_ID, euro[1], BOS_ID, euro[2], EOS_ID], np.uint16)
    assert tok.decode_spans(tokens, [0, 0], [6, 3]) == ["€", "\ufffd\ufffd"]
    # Imported special ids that are ordinary pieces (a byte, a piece with U+2581) are dropped.
    space_a = next(i for i in range(tok.vocab_size) if tok._sp.id_to_piece(i).startswith("\u2581"))
    ids = {"pad": 0, "unk": 1, "bos": euro[1], "eos": space_a}
    imported = Tokenizer(proto, ids)
    rng = np.random.default_rng(0)
    tokens = np.concatenate([_random_tokens(tok._sp, rng, 500), np.array(euro * 5 + [space_a] * 5)])
    starts, ends = _spans(rng, tokens.size, 200)
    assert imported._pieces is not None
    assert imported.decode_spans(tokens, starts, ends) == _sp_reference(proto, tokens, starts, ends, set(ids.values()) - {1})


def test_native_decode_errors_as_sentencepiece(model):
    _, proto = model
    tok = Tokenizer(proto)
    for bad in ([tok.vocab_size], [5, tok.vocab_size + 7]):
        with pytest.raises(IndexError):
            tok._sp.decode([bad])
        with pytest.raises(IndexError):
            tok.decode_spans(np.array(bad, np.uint32), [0], [len(bad)])
    with pytest.raises(IndexError):
        tok.decode_spans(np.array([5, -1], np.int32), [0], [2])
    with pytest.raises(ValueError):
        tok.decode_spans(np.array([5, 6], np.int32), [1], [3])
    with pytest.raises(ValueError):
        tok.decode_spans(np.array([5, 6], np.int32), [2], [1])
    assert tok.decode_spans(np.zeros(0, np.uint16), [0, 0], [0, 0]) == ["", ""]


def test_decode_falls_back_to_sentencepiece_for_a_denormalizer(tmp_path):
    rules = tmp_path / "denorm.tsv"
    rules.write_text("61\t41\n")  # decoded "a" -> "A"
    options = dict(model_type="unigram", byte_fallback=True)
    plain, denorm = _train_sp(**options), _train_sp(**options, denormalization_rule_tsv=str(rules))
    tok = Tokenizer(denorm)
    assert tok._pieces is None
    rng = np.random.default_rng(1)
    tokens = _random_tokens(tok._sp, rng, 2000)
    starts, ends = _spans(rng, tokens.size, 300)
    expected = _sp_reference(denorm, tokens, starts, ends, {PAD_ID, BOS_ID, EOS_ID})
    assert tok.decode_spans(tokens, starts, ends) == expected
    assert any("A" in t for t in expected)
    # The rule matters: the same pieces without it decode (natively) differently.
    native = Tokenizer(plain)
    assert native._pieces is not None and native._sp.id_to_piece(list(range(native.vocab_size))) == \
        tok._sp.id_to_piece(list(range(tok.vocab_size)))
    assert native.decode_spans(tokens, starts, ends) != expected


def test_decode_falls_back_without_the_native_extension(monkeypatch, tokenizer):
    from dpsynth.data import tokenizers

    monkeypatch.setattr(tokenizers, "_native", None)  # as when dpsynth._native is not built
    tok = Tokenizer(tokenizer.model_proto)
    assert tok._pieces is None and tokenizer._pieces is not None
    tokens = _random_tokens(tok._sp, np.random.default_rng(2), 500)
    starts, ends = _spans(np.random.default_rng(3), tokens.size, 100)
    expected = _sp_reference(tok.model_proto, tokens, starts, ends, {PAD_ID, BOS_ID, EOS_ID})
    assert tok.decode_spans(tokens, starts, ends) == expected


def test_native_decoder_refuses_a_malformed_table():
    from dpsynth import _native

    tokens, starts, ends = np.array([0], np.uint16), np.array([0]), np.array([1])
    offsets = np.array([0, 2], np.int64)
    for kind, surface in (([1], b"ab"), ([2], b"ab"), ([7], b"ab")):
        with pytest.raises(ValueError):
            _native.decode_spans(np.frombuffer(surface, np.uint8), offsets, np.array(kind, np.uint8), True,
                                 tokens, starts, ends)
    assert _native.decode_spans(np.frombuffer(b" b", np.uint8), offsets, np.array([1], np.uint8), True,
                                tokens, starts, ends) == ["b"]


# ----------------------------------------------------------------------------- JSON lines
# `decode_jsonl` must give the bytes of json.dumps per kept document, its texts being
# SentencePiece's decode of each span; whitespace (str.isspace) and escaping checked for every
# code point.

# Characters every escape and whitespace rule touches: quotes, backslashes, every control
# character, DEL, the line separators JSON leaves alone, non-BMP, and Unicode whitespace.
SPECIAL = "\"\\\x7f\u2028\u2029\U0001f600\U0010ffff" + "".join(map(chr, range(0x20)))
WHITESPACE = " \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u205f\u3000"
IDS = ["", "a", "d\"q\\b", "é😀", "\x00\x1f\n", "\u2028\x7f", "x" * 40]


def _jsonl_reference(texts: list[str], doc_spans, ids) -> tuple[bytes, int]:
    """json.dumps of every document whose joined non-empty spans are not only whitespace."""
    lines, left_out = [], 0
    for j, doc_id in enumerate(ids):
        text = "\n".join(t for t in texts[doc_spans[j]:doc_spans[j + 1]] if t)
        if text.strip():
            lines.append(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False, sort_keys=True) + "\n")
        else:
            left_out += 1
    return "".join(lines).encode("utf-8"), left_out


def _byte_tokens(sp, text: str) -> list[int]:
    """`text` spelled with byte pieces (a byte-fallback model), else nothing."""
    byte_id = {int(sp.id_to_piece(i)[3:5], 16): i for i in range(sp.get_piece_size()) if sp.is_byte(i)}
    data = text.encode()
    return [byte_id[b] for b in data] if len(byte_id) == 256 else []


def _documents(sp, rng: np.random.Generator, count: int):
    """(tokens, starts, ends, doc_spans, ids) of `count` documents of 0-4 spans: random tokens
    with the SPECIAL characters, and whitespace-only ones (byte pieces, U+2581 pieces, control ids)."""
    size = sp.get_piece_size()
    blank = [i for i in range(size) if sp.is_control(i) or set(sp.id_to_piece(i)) == {"\u2581"}]
    tokens = list(_random_tokens(sp, rng, 4000))
    for c in SPECIAL:
        tokens[int(rng.integers(len(tokens))):0] = _byte_tokens(sp, c)
    starts, ends, doc_spans = [], [], [0]
    for _ in range(count):
        for _ in range(int(rng.integers(0, 5))):
            if rng.random() < 0.3:  # only whitespace
                run = []
                for _ in range(int(rng.integers(0, 6))):
                    run += _byte_tokens(sp, WHITESPACE[rng.integers(len(WHITESPACE))]) if rng.random() < 0.6 \
                        else [int(rng.choice(blank))]
                starts.append(len(tokens))
                tokens += run
                ends.append(len(tokens))
            else:
                a = int(rng.integers(0, len(tokens) + 1))
                starts.append(a)
                ends.append(min(a + int(rng.integers(0, 40)), len(tokens)))
        doc_spans.append(len(starts))
    ids = [IDS[i] for i in rng.integers(0, len(IDS), count)]
    return np.array(tokens, np.int64), np.array(starts, np.int64), np.array(ends, np.int64), doc_spans, ids


def test_decode_jsonl_equals_json_dumps_of_joined_spans(model):
    name, proto = model
    tok = Tokenizer(proto)
    rng = np.random.default_rng(len(name) + 10)
    tokens, starts, ends, doc_spans, ids = _documents(tok._sp, rng, 400)
    texts = _sp_reference(proto, tokens, starts, ends, {PAD_ID, BOS_ID, EOS_ID})
    expected = _jsonl_reference(texts, doc_spans, ids)
    assert 0 < expected[1] < len(ids)
    for dtype in (np.uint16, np.uint32, np.int32, np.int64, np.int16):
        assert tok.decode_jsonl(tokens.astype(dtype), starts, ends, doc_spans, ids) == expected, dtype
    assert tok._py_decode_jsonl(tokens, starts, ends, np.array(doc_spans), ids) == expected
    assert tok.decode_jsonl(tokens, [], [], [0], []) == (b"", 0)
    if tok._sp.is_byte(tok.vocab_size - 1):  # a byte-fallback model spells every SPECIAL character
        assert all(json.dumps(c, ensure_ascii=False) in expected[0].decode() for c in SPECIAL)


def test_decode_jsonl_errors():
    tok = train_tokenizer(CORPUS, vocab_size=400)
    tokens = np.array([5, 6, 7], np.int32)
    for native in (True, False):
        decode = tok.decode_jsonl if native else (lambda *a: tok._py_decode_jsonl(*map(np.asarray, a[:4]), a[4]))
        for doc_spans in ([1, 2], [0, 3], [0, 2, 1, 2]):  # not from 0, not to the end, decreasing
            with pytest.raises(ValueError):
                decode(tokens, [0, 1], [1, 3], doc_spans, ["a"] * (len(doc_spans) - 1))
        with pytest.raises(ValueError):
            decode(tokens, [0], [4], [0, 1], ["a"])
        with pytest.raises(IndexError):
            decode(np.array([5, tok.vocab_size], np.int32), [0], [2], [0, 1], ["a"])
    with pytest.raises(ValueError):
        tok.decode_jsonl(tokens, [0], [1], [0, 1], ["a", "b"])


def _code_point_table():
    """A piece table whose id i is the i-th code point (surrogates excluded), verbatim."""
    points = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    surfaces = [chr(c).encode() for c in points]
    offsets = np.zeros(len(points) + 1, np.int64)
    np.cumsum([len(s) for s in surfaces], out=offsets[1:])
    return points, (np.frombuffer(b"".join(surfaces), np.uint8), offsets, np.zeros(len(points), np.uint8), True)


def test_decode_jsonl_whitespace_and_escapes_of_every_code_point():
    from dpsynth import _native

    points, table = _code_point_table()
    n = len(points)
    tokens = np.arange(n, dtype=np.uint32)
    bounds = np.arange(n + 1, dtype=np.int64)  # one document per code point, its id that code point
    data, left_out = _native.decode_jsonl(*table, tokens, bounds[:-1], bounds[1:], bounds, table[0], table[1])
    chars = [chr(c) for c in points]
    assert left_out == sum(c.isspace() for c in chars) == 29
    assert data == "".join('{"id": ' + encode_basestring(c) + ', "text": ' + encode_basestring(c) + "}\n"
                           for c in chars if not c.isspace()).encode()
    # Long texts (the 8-byte fast path at every alignment): the first 300 code points, shifted.
    starts = np.array([0, 1, 2, 3, 5, 7, 0, 0x20, n - 1000], np.int64)
    ends = np.array([300, 301, 302, 303, 305, 307, n, 0x7F, n], np.int64)
    bounds = np.arange(starts.size + 1, dtype=np.int64)
    names = ["q\"", "", "é", "\x01", "\\", "\u2028", "all", "".join(map(chr, range(0x80))) * 2, "end"]
    encoded = [x.encode() for x in names]
    id_offsets = np.concatenate([[0], np.cumsum([len(x) for x in encoded])]).astype(np.int64)
    data, left_out = _native.decode_jsonl(*table, tokens, starts, ends, bounds,
                                          np.frombuffer(b"".join(encoded), np.uint8), id_offsets)
    assert left_out == 0
    assert data.decode() == "".join(json.dumps({"id": x, "text": "".join(chars[a:b])}, ensure_ascii=False,
                                               sort_keys=True) + "\n" for x, a, b in zip(names, starts, ends))


def test_decode_jsonl_output_above_the_kept_buffer_size():
    # The binding keeps its per-thread buffer only up to 64 MiB: a bigger output, then a small
    # one, then the big one again, all exact.
    from dpsynth import _native

    table = (np.frombuffer(b"x" * 1024, np.uint8), np.array([0, 1024], np.int64), np.zeros(1, np.uint8), True)
    ids = np.frombuffer(b"big", np.uint8), np.array([0, 3], np.int64)
    big = np.zeros(70_000, np.uint16)  # 70 MB of text

    def run(n):
        return _native.decode_jsonl(*table, big[:n], np.array([0], np.int64), np.array([n], np.int64),
                                    np.array([0, 1], np.int64), *ids)

    want = (b'{"id": "big", "text": "' + b"x" * (1024 * 70_000) + b'"}\n', 0)
    assert run(70_000) == want
    assert run(2) == (b'{"id": "big", "text": "' + b"x" * 2048 + b'"}\n', 0)
    assert run(70_000) == want


def test_decode_jsonl_of_random_strings():
    """Texts and ids over characters to escape and whitespace, at every offset of the 8-byte blocks."""
    from dpsynth import _native

    points, table = _code_point_table()
    alphabet = 'aaaa"\\\x01\n\x1f\x7fé\U0001f600 \u3000\xa0'
    rng = np.random.default_rng(8)
    tokens = np.array([ord(c) - (0x800 if ord(c) > 0xDFFF else 0) for c in rng.choice(list(alphabet), 30000)],
                      np.uint32)
    cuts = np.sort(rng.integers(0, tokens.size + 1, 1500))
    starts, ends = cuts[:-1], cuts[1:]
    doc_spans = np.concatenate([[0], np.sort(rng.integers(0, starts.size + 1, 600)), [starts.size]])
    ids = ["".join(rng.choice(list(alphabet), rng.integers(0, 20))) for _ in range(doc_spans.size - 1)]
    encoded = [x.encode() for x in ids]
    id_offsets = np.concatenate([[0], np.cumsum([len(x) for x in encoded])]).astype(np.int64)
    texts = ["".join(chr(points[t]) for t in tokens[a:b]) for a, b in zip(starts, ends)]
    expected = _jsonl_reference(texts, doc_spans, ids)
    assert expected[1] > 0
    assert _native.decode_jsonl(*table, tokens, starts, ends, doc_spans, np.frombuffer(b"".join(encoded), np.uint8),
                                id_offsets) == expected


def test_decode_jsonl_falls_back_to_sentencepiece(monkeypatch, tmp_path, tokenizer):
    from dpsynth.data import tokenizers

    rules = tmp_path / "denorm.tsv"
    rules.write_text("61\t41\n")  # decoded "a" -> "A"
    denorm = _train_sp(model_type="unigram", byte_fallback=True, denormalization_rule_tsv=str(rules))
    rng = np.random.default_rng(6)
    for proto in (denorm, tokenizer.model_proto):
        native = Tokenizer(proto)
        tokens, starts, ends, doc_spans, ids = _documents(native._sp, rng, 200)
        expected = _jsonl_reference(_sp_reference(proto, tokens, starts, ends, {PAD_ID, BOS_ID, EOS_ID}),
                                    doc_spans, ids)
        if proto is denorm:
            assert native._pieces is None and b"A" in expected[0]
        else:
            assert native._pieces is not None
            assert native.decode_jsonl(tokens, starts, ends, doc_spans, ids) == expected
            monkeypatch.setattr(tokenizers, "_native", None)  # as when dpsynth._native is not built
            assert Tokenizer(proto)._pieces is None
        assert Tokenizer(proto).decode_jsonl(tokens, starts, ends, doc_spans, ids) == expected


def test_hf_tokenizer_decode_jsonl_equals_decode():
    tok = HFTokenizer((FIXTURES / "qwen2" / "tokenizer.json").read_bytes(), {"bos": 0, "eos": 2, "pad": 0, "unk": 0})
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, tok.vocab_size, 400).astype(np.uint32)
    starts, ends = _spans(rng, tokens.size, 60)
    doc_spans = [0, 0, 1, 5, 20, 40, starts.size]
    ids = IDS[:len(doc_spans) - 1]
    texts = [tok.decode(tokens[a:b]) for a, b in zip(starts, ends)]
    assert tok.decode_jsonl(tokens, starts, ends, doc_spans, ids) == _jsonl_reference(texts, doc_spans, ids)


def test_an_invalid_utf8_unk_surface_falls_back():
    proto = _train_sp(model_type="unigram", byte_fallback=False, unk_surface="<?>")
    assert proto.count(b"<?>") == 1 and Tokenizer(proto)._pieces is not None
    assert Tokenizer(proto.replace(b"<?>", b"<\xff>"))._pieces is None


def test_sampling_banned_ids_are_the_control_pieces_but_eos(tokenizer):
    """What a sampler never draws: dpsynth's own tokenizer bans PAD and BOS only (as before); an imported
    one every control or unused piece (Gemma's `<unusedN>`, `<mask>`, ...) but its EOS."""
    assert tokenizer.sampling_banned_ids == (PAD_ID, BOS_ID)
    gemma = Tokenizer((FIXTURES / "gemma" / "tokenizer.model").read_bytes(), {"pad": 0, "eos": 1, "bos": 2, "unk": 3})
    sp = gemma._sp
    control = {i for i in range(gemma.vocab_size) if sp.is_control(i) or sp.is_unused(i)}
    assert set(gemma.sampling_banned_ids) == (control | {0, 2}) - {1} and 1 not in gemma.sampling_banned_ids
    qwen = HFTokenizer((FIXTURES / "qwen2" / "tokenizer.json").read_bytes(), {"bos": 0, "eos": 2, "pad": 0, "unk": 0})
    assert qwen.sampling_banned_ids == (0, 1)  # <|endoftext|> (pad, bos) and <|im_start|>; <|im_end|> is EOS


def test_sampling_banned_ids_of_a_tokenizer_with_extra_control_symbols(tmp_path):
    import sentencepiece as spm

    rng = random.Random(1)
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    (tmp_path / "c.txt").write_text("\n".join(" ".join(rng.choice(words) for _ in range(50)) for _ in range(50)))
    spm.SentencePieceTrainer.train(input=str(tmp_path / "c.txt"), model_prefix=str(tmp_path / "m"), vocab_size=24,
                                   control_symbols=["<start_of_turn>", "<end_of_turn>"], pad_id=0, unk_id=3, bos_id=2,
                                   eos_id=1, minloglevel=2)
    tok = Tokenizer((tmp_path / "m.model").read_bytes(), {"pad": 0, "eos": 1, "bos": 2, "unk": 3})
    turns = {tok._sp.piece_to_id("<start_of_turn>"), tok._sp.piece_to_id("<end_of_turn>")}
    assert set(tok.sampling_banned_ids) == {0, 2} | turns
