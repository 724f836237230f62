"""The contamination probe (`dpsynth probe`): its statistics against references, its verbatim test
against brute-force greedy decoding, short records counted, owner-only outputs, and its place in
the privacy report of a model tuned from an imported base."""

import json
import os
import pathlib
import types

import numpy as np
import pytest
import scipy.stats

from dpsynth import cli, fileio, outdir
from dpsynth.evaluate import contamination
from tests.generate.fakes import BigramDecoder, greedy_reference, make_tables


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("hits,n,c_hits,c_n", [(18, 32, 0, 32), (3, 30, 1, 28), (0, 10, 0, 10), (5, 5, 5, 5)])
def test_fisher_is_the_hypergeometric_tail(hits, n, c_hits, c_n):
    """One-sided Fisher p = P(X >= hits), X ~ Hypergeom(n + c_n, hits + c_hits, n): D's share of the hits."""
    want = scipy.stats.hypergeom.sf(hits - 1, n + c_n, hits + c_hits, n)
    assert contamination.fisher_greater(hits, n, c_hits, c_n) == pytest.approx(want, rel=1e-9)


def test_fisher_without_tested_records_is_no_evidence():
    assert contamination.fisher_greater(0, 0, 0, 5) == 1.0 and contamination.fisher_greater(3, 3, 0, 0) == 1.0


def test_auroc_and_mann_whitney_against_brute_force_and_scipy():
    rng = np.random.default_rng(0)
    for shift in (0.0, 0.5, 2.0):
        x = np.round(rng.normal(shift, 1.0, 40), 1)  # rounded: ties occur
        y = np.round(rng.normal(0.0, 1.0, 35), 1)
        brute = np.mean([(a > b) + 0.5 * (a == b) for a in x for b in y])
        assert contamination.auroc(x, y) == pytest.approx(brute, abs=1e-12)
        p = contamination.mann_whitney_greater(x, y)
        assert p == pytest.approx(scipy.stats.mannwhitneyu(x, y, alternative="greater").pvalue, rel=1e-9)
    # The direction: D clearly more likely -> small p, AUROC 1; the reverse -> p near 1.
    assert contamination.auroc([5, 6, 7], [1, 2, 3]) == 1.0 and contamination.mann_whitney_greater([5, 6, 7], [1, 2, 3]) < 0.06
    assert contamination.mann_whitney_greater([1, 2, 3], [5, 6, 7]) > 0.9
    assert contamination.mann_whitney_greater([1, 1], [1, 1]) == 1.0 and contamination.auroc([], [1]) is None


def test_verdict_at_the_level():
    assert contamination.verdict(0.049, 0.05) == contamination.SEEN
    assert contamination.verdict(0.05, 0.05) == contamination.UNSEEN


def test_config_is_checked():
    with pytest.raises(ValueError, match="significance"):
        contamination.ProbeConfig(significance=1.5)
    with pytest.raises(ValueError, match="match_tokens"):
        contamination.ProbeConfig(match_tokens=0)


def test_sample_is_seeded_and_in_file_order():
    rows = [{"text": str(i)} for i in range(50)]
    a = contamination.sample(rows, 10, seed=3, stream=0)
    assert a == contamination.sample(rows, 10, seed=3, stream=0) and a != contamination.sample(rows, 10, 3, 1)
    assert [int(r["text"]) for r in a] == sorted(int(r["text"]) for r in a) and len(a) == 10
    assert contamination.sample(rows[:4], 10, 0, 0) == rows[:4]


# ----------------------------------------------------------------------------- the verbatim test


def _bundle(table, pos_bias):
    tok = types.SimpleNamespace(bos_id=2, eos_id=3, pad_id=0, vocab_size=table.shape[0], sampling_banned_ids=(0, 2))
    return types.SimpleNamespace(decoder=BigramDecoder(), params={"table": table, "pos_bias": pos_bias}, tokenizer=tok)


def test_greedy_hits_are_the_brute_force_greedy_continuations():
    """A hit iff the brute-force greedy decoding of BOS + prefix starts with the target; a target one
    token off is no hit."""
    table, pos_bias = make_tables(vocab=12, max_len=64, seed=1, eos_logit=-30.0)
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(4, 12, 5).astype(np.int32) for _ in range(7)]
    greedy = [np.asarray(greedy_reference(table, pos_bias, np.concatenate([[2], p]), 6 + 4)[0][:4], np.int32)
              for p in prefixes]
    assert all(len(g) == 4 for g in greedy)
    wrong = [g.copy() for g in greedy]
    for w in wrong:
        w[-1] = 4 + (w[-1] - 3) % 8  # another real token
    hits = contamination.greedy_hits(_bundle(table, pos_bias), prefixes + prefixes, greedy + wrong, batch_size=4)
    assert hits.tolist() == [True] * 7 + [False] * 7


def test_split_verbatim_counts_short_records():
    t = np.arange(10)
    assert contamination.split_verbatim(t, 4, 6)[1].tolist() == [4, 5, 6, 7, 8, 9]
    assert contamination.split_verbatim(t, 4, 7) is None


# ----------------------------------------------------------------------------- the command


@pytest.fixture(scope="module")
def gemma_base(tmp_path_factory):
    """The Gemma fixture of the importer tests, imported (an imported base model, max_len from its config)."""
    from dpsynth.models import hf_import

    out = tmp_path_factory.mktemp("hf") / "gemma"
    hf_import.import_model(str(pathlib.Path(__file__).parents[1] / "models" / "fixtures" / "hf" / "gemma"), str(out))
    return str(out)


def _write(path, texts):
    path.write_text("".join(json.dumps({"text": t, "label": "x"}) + "\n" for t in texts))
    return str(path)


WORDS = "the a quiet house garden letter morning sister walked read wrote said long evening visit".split()


def _texts(n, seed, short=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, 3 if i < short else 40)) for i in range(n)]


def test_probe_command_owner_only_short_records_and_refusals(gemma_base, tmp_path, capsys):
    data = _write(tmp_path / "d.jsonl", _texts(12, 0, short=5))
    control = _write(tmp_path / "c.jsonl", _texts(9, 1))
    out = tmp_path / "probe"
    argv = ["probe", "--model", gemma_base, "--data", data, "--control", control, "--out", str(out), "--records", "10",
            "--prefix-tokens", "4", "--match-tokens", "4", "--batch-size", "4"]
    assert cli.main(argv) == 0
    std = capsys.readouterr()
    head = json.loads(std.out.strip().splitlines()[-1])
    assert head["verdict"] in (contamination.SEEN, contamination.UNSEEN)
    rep = json.loads((out / contamination.REPORT_JSON).read_text())
    v = rep["verbatim"]
    # 10 of 12 D records sampled; the 3-word ones are counted as too short, not tested and not dropped.
    assert v["data"]["sampled"] == 10 and v["data"]["too_short"] + v["data"]["tested"] == 10
    assert 1 <= v["data"]["too_short"] <= 5 and v["control"] == {**v["control"], "sampled": 9, "too_short": 0}
    assert rep["likelihood"]["data"]["records"] == 10 and rep["dp"] is False and rep["imported"] is True
    assert 0.0 <= rep["likelihood"]["auroc"] <= 1.0 and 0.0 <= rep["verbatim"]["p_value"] <= 1.0
    # Owner-only, and no record text anywhere (numbers only).
    assert os.stat(out).st_mode & 0o777 == 0o700 and outdir.owner(str(out))["kind"] == outdir.PROBE
    assert sorted(os.listdir(out)) == sorted([contamination.REPORT_JSON, contamination.REPORT_MD, outdir.RUN_FILE])
    assert all(os.stat(out / name).st_mode & 0o777 == 0o600 for name in os.listdir(out))
    for name in (contamination.REPORT_JSON, contamination.REPORT_MD):
        assert not any(w in (out / name).read_text() for w in ("garden", "sister", "evening"))
    assert not any(w in std.err + std.out for w in ("garden", "sister", "evening"))
    md = (out / contamination.REPORT_MD).read_text()
    assert "NOT differentially private" in md and "never prove" in md
    # Never overwritten; a user's non-empty directory and a directory inside the model are refused.
    assert cli.main(argv) == 2 and "already holds contamination_probe.json" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert cli.main(argv[:-9] + [str(mine)] + argv[-8:]) == 2
    assert "no dpsynth run wrote" in capsys.readouterr().err and os.listdir(mine) == ["notes.txt"]
    assert cli.main(argv[:-9] + [os.path.join(gemma_base, "probe")] + argv[-8:]) == 2
    assert "inside the released directory" in capsys.readouterr().err
    assert not os.path.exists(os.path.join(gemma_base, "probe"))
    # Too long a prompt for the model: one line, nothing written.
    bad = argv[:-9] + [str(tmp_path / "p2")] + argv[-8:-4] + ["--match-tokens", "100000", "--batch-size", "4"]
    assert cli.main(bad) == 2 and "exceed the model's max_len" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "p2" / contamination.REPORT_JSON)


# ----------------------------------------------------------------------------- the privacy report


def test_imported_base_report_lines_with_and_without_a_probe():
    from dpsynth.train import tune_report

    src = {"family": "gemma3", "path": "/m", "config_sha256": "ab"}
    without, with_probe = tune_report.imported_base_channel(src), tune_report.imported_base_channel(src, True)
    for ch in (without, with_probe):
        assert ("DP covers the fine-tuning data; the base model's pretraining data was not deduplicated against D"
                in ch["detail"])
    assert "no contamination probe was run (`dpsynth probe`)" in without["detail"]
    assert "a contamination probe was run" in with_probe["detail"] and "private state" in with_probe["detail"]
    assert contamination.SEEN not in with_probe["detail"] and contamination.UNSEEN not in with_probe["detail"]


def test_dp_tune_of_an_imported_base_keeps_the_probe_private(gemma_base, tmp_path):
    """The released report says only that a probe ran (no verdict, no figure) and drops the false claim
    that the base was pretrained on a deduplicated corpus; the probe goes to the private state; a
    probe of another model is refused."""
    from dpsynth.dp import report as report_lib
    from dpsynth.train import finetune, tune_config, tune_report
    from tests.train.conftest import make_records

    probe_dir = tmp_path / "probe"
    rep = contamination.run_probe(gemma_base, _texts_records(8, 0), _texts_records(8, 1), str(probe_dir),
                                  contamination.ProbeConfig(records=8, prefix_tokens=4, match_tokens=4, batch_size=4))
    probe = contamination.read_probe(str(probe_dir))
    cfg = tune_config.TuneConfig(mode="lora", epsilon=4.0, batch_size=8, steps=1, microbatch_size=8, max_tokens=16,
                                 checkpoint_every=1, lora_rank=2)
    train = make_records(24, 1)
    out, state = tmp_path / "tuned", tmp_path / "state"
    finetune.dp_tune(gemma_base, train, [], str(out), cfg, state_dir=str(state), contamination_probe=probe,
                     progress_interval=1e9)
    released = report_lib.load_report(str(out))
    names = {c["name"] for c in released["side_channels"]}
    assert "pretrained base model" in names and report_lib.PUBLIC_OVERLAP_CHANNEL["name"] not in names
    text = json.dumps(released) + (out / report_lib.REPORT_MD).read_text()
    assert tune_report.PROBE_RUN in text and released["training"]["contamination_probe_run"] is True
    assert contamination.SEEN not in text and contamination.UNSEEN not in text and "auroc" not in text.lower()
    assert "not deduplicated against D" in (out / report_lib.REPORT_MD).read_text()
    kept = state / tune_report.PROBE_FILE
    assert os.stat(kept).st_mode & 0o777 == 0o600 and json.loads(kept.read_text())["verdict"] == rep["verdict"]
    # (Without a probe the report says none was run: tests/train/test_finetune_imported.py.)
    # A probe of another model (the tuned one's manifest differs from the base's) is refused before tuning.
    with pytest.raises(tune_config.TuneError, match="the probe is of another model"):
        finetune.dp_tune(gemma_base, train, [], str(tmp_path / "tuned3"), cfg, state_dir=str(tmp_path / "state3"),
                         contamination_probe={**probe, "model_manifest_sha256": "0" * 64}, progress_interval=1e9)
    assert not os.path.exists(tmp_path / "tuned3" / "manifest.json")


def _texts_records(n, seed):
    return [{"text": t} for t in _texts(n, seed)]


def test_dp_tune_flag_reads_the_probe_and_warns_the_owner(tmp_path, capsys):
    """`dp-tune --contamination-probe DIR`: the report is read (a missing or foreign one is one clear
    error) and a probe that found evidence is said on the owner's terminal."""
    from trainers.dp_tune import _probe

    assert _probe(None) is None
    with pytest.raises(contamination.ProbeError, match="missing; is .* a finished `dpsynth probe`"):
        _probe(str(tmp_path))
    (tmp_path / contamination.REPORT_JSON).write_text(json.dumps({"format": "dpsynth.release_audit"}))
    with pytest.raises(contamination.ProbeError, match="not a contamination probe"):
        _probe(str(tmp_path))
    probe = {"format": contamination.FORMAT, "format_version": contamination.FORMAT_VERSION,
             "verdict": contamination.SEEN, "model_manifest_sha256": "ab"}
    (tmp_path / contamination.REPORT_JSON).write_text(json.dumps(probe))
    got = _probe(str(tmp_path))
    assert got == {**probe, "probe_dir": str(tmp_path)}
    assert "found evidence that the base model has seen D" in capsys.readouterr().err
    # A probe of other data than --train says nothing of D_train: refused, naming the file.
    train, other = tmp_path / "train.jsonl", tmp_path / "other.jsonl"
    train.write_text('{"text": "a"}\n')
    other.write_text('{"text": "b"}\n')
    for data in ([other], [other, train]):
        (tmp_path / contamination.REPORT_JSON).write_text(json.dumps({**probe, "data_files": [
            {"path": str(p), "sha256": fileio.sha256_file(str(p))} for p in data]}))
        if train in data:
            assert _probe(str(tmp_path), [str(train)])["verdict"] == contamination.SEEN
        else:
            with pytest.raises(contamination.ProbeError, match=r"did not read --train .*train.jsonl .*other.jsonl"):
                _probe(str(tmp_path), [str(train)])
