"""Tests for dpsynth.data.tokenizers: the SentencePiece wrapper (special ids, batching, pickling) and its
native span decoder, against SentencePiece itself."""

import pathlib
import random

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
