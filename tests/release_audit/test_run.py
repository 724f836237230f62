"""`audit_release` and `dpsynth audit`: owner-only output, refusals, the report's figures."""

import json
import os
import stat

import numpy as np
import pytest

from dpsynth import cli
from dpsynth.release_audit import copying, run
from tests.release_audit.conftest import WordTokenizer


def _records(n, seed, prefix):
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(30)]
    return [{"id": f"{prefix}{i}", "text": " ".join(rng.choice(words, size=25)), "label": "a"} for i in range(n)]


def _corpus(tmp_path, rows, name="synth"):
    d = tmp_path / name
    d.mkdir()
    (d / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "manifest.json").write_text(json.dumps({"format": "dpsynth.synthetic", "splits": {"train": {}},
                                                 "config_hash": "ab" * 32, "private": True}))
    return str(d)


def test_report_is_owner_only_and_holds_numbers_only(tmp_path):
    train, test = _records(40, 0, "tr"), _records(20, 1, "te")
    synth = [{"text": r["text"], "label": "a"} for r in train[:10]] + [{"text": r["text"], "label": "a"}
                                                                       for r in _records(10, 2, "s")]
    corpus = _corpus(tmp_path, synth + [{"text": "w1 w2 w3 unlabeled", "label": ""}])
    out = str(tmp_path / "private" / "audit")
    rep = run.audit_release(corpus, train, test, out, tokenizer=WordTokenizer(), thresholds=(20, 25))
    for path in (out, os.path.join(out, run.REPORT_JSON), os.path.join(out, run.REPORT_MD)):
        mode = stat.S_IMODE(os.stat(path).st_mode)
        assert mode == (0o700 if os.path.isdir(path) else 0o600), (path, oct(mode))
    c = rep["copying"]
    assert c["sharing_at_least"] == {"25": 10, "20": 10} and c["longest_shared_with_train"] == 25
    assert c["held_out_comparison"]["verdict"] == copying.MEMORISING
    assert rep["dp"] is False and "NOT differentially private" in rep["notice"]
    assert rep["synthetic_rows_skipped"] == 1 and c["num_synthetic"] == 20  # counted, not silently dropped
    written = open(os.path.join(out, run.REPORT_JSON)).read() + open(os.path.join(out, run.REPORT_MD)).read()
    assert not any(r["text"] in written for r in train + test + synth)  # no record text, only numbers
    md = open(os.path.join(out, run.REPORT_MD)).read()
    assert "Verdict: memorising" in md and "rerun with --canaries before concluding" in md


def test_the_canary_section_reads_the_auroc_against_its_chance_level(tmp_path):
    from dpsynth.dp import audit

    train, test = _records(40, 0, "tr"), _records(20, 1, "te")
    corpus = _corpus(tmp_path, [{"text": r["text"], "label": "a"} for r in _records(10, 2, "s")])
    rep = run.audit_release(corpus, train, test, str(tmp_path / "audit"), tokenizer=WordTokenizer())
    stats = audit.canary_statistics(np.arange(32.0) + 0.5, np.arange(32.0), delta=1e-4)  # (no separation)
    rep["canaries"] = {**stats, "canaries": {"repeats": 1}, "attacker": "a 3-gram LM", "accounted_epsilon": 3.0,
                       "accountant": "rdp", "verdict": "at chance"}
    md = run.render_markdown(rep)
    line = next(x for x in md.splitlines() if x.startswith("- AUROC"))
    assert f"AUROC {stats['auroc']:.3g} (at chance with these many canaries: {stats['auroc_chance']:.3g}" in line
    assert f"permutation p = {stats['auroc_p_value']:.3g}" in line and stats["auroc_p_value"] > 0.05
    assert run.headline(rep)["canaries"]["auroc_p_value"] == stats["auroc_p_value"]
    assert "**Canary verdict: at chance** (permutation test at significance 0.05)" in md


def test_refusals(tmp_path):
    train, test = _records(5, 0, "tr"), _records(5, 1, "te")
    corpus = _corpus(tmp_path, [{"text": "w1 w2", "label": "a"}])
    with pytest.raises(run.AuditError, match="inside the released directory"):
        run.audit_release(corpus, train, test, os.path.join(corpus, "audit"), tokenizer=WordTokenizer())
    out = str(tmp_path / "audit")
    run.audit_release(corpus, train, test, out, tokenizer=WordTokenizer())
    with pytest.raises(run.AuditError, match="already holds"):
        run.audit_release(corpus, train, test, out, tokenizer=WordTokenizer())
    other = tmp_path / "model"
    other.mkdir()
    (other / "manifest.json").write_text("{}")
    mode = os.stat(other).st_mode
    with pytest.raises(run.AuditError, match="holds other files"):
        run.audit_release(corpus, train, test, str(other), tokenizer=WordTokenizer())
    assert os.stat(other).st_mode == mode and os.listdir(other) == ["manifest.json"]  # left as it was
    os.remove(os.path.join(corpus, "manifest.json"))
    with pytest.raises(run.AuditError, match="no manifest.json"):
        run.audit_release(corpus, train, test, str(tmp_path / "audit2"), tokenizer=WordTokenizer())


def test_cli_audit_end_to_end_and_one_line_errors(tmp_path, tiny_corpus, capsys):
    """`dpsynth audit` with a real tokenizer directory: exit 0 and the headline JSON; a bad
    input is one line and exit 2 with no report written."""
    from dpsynth.data.readers import write_jsonl

    _, tok_path, tok = tiny_corpus
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.model").write_bytes(open(tok_path, "rb").read())
    train, test = _records(30, 0, "tr"), _records(12, 1, "te")
    write_jsonl(str(tmp_path / "train.jsonl"), train)
    write_jsonl(str(tmp_path / "test.jsonl"), test)
    corpus = _corpus(tmp_path, [{"text": r["text"], "label": "a"} for r in train[:3] + _records(9, 3, "s")])
    argv = ["audit", "--corpus", corpus, "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "test.jsonl"),
            "--tokenizer", str(model), "--out", str(tmp_path / "audit")]
    assert cli.main(argv) == 0
    head = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert head["sharing_at_least"]["20"] == 3 and "verdict" in head
    from dpsynth import outdir

    audit_dir = tmp_path / "audit"
    assert outdir.owner(str(audit_dir))["kind"] == outdir.AUDIT and os.stat(audit_dir).st_mode & 0o777 == 0o700
    assert {os.stat(audit_dir / name).st_mode & 0o777 for name in os.listdir(audit_dir)} == {0o600}  # run record too
    assert cli.main(argv) == 2  # an audit is never overwritten
    assert "already holds release_audit.json" in capsys.readouterr().err
    rc = cli.main(["generate", "--model", str(model), "--num-examples", "2", "--out", str(audit_dir)])
    assert rc == 2 and "holds a release audit of `dpsynth audit`" in capsys.readouterr().err
    # A corpus released by `dpsynth select` names its generator in generation_config.json (its manifest does not).
    (tmp_path / "synth" / "generation_config.json").write_text(json.dumps({"model_dir": str(model)}))
    assert cli.main([a for a in argv if a not in ("--tokenizer", str(model))][:-1] + [str(tmp_path / "audit_s")]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sharing_at_least"]["20"] == 3
    bad = argv[:-1] + [str(tmp_path / "audit_b")]
    bad[bad.index("--test") + 1] = str(tmp_path / "missing.jsonl")
    assert cli.main(bad) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("dpsynth audit: error: ") and "missing.jsonl" in err[-1]
    assert not os.path.exists(tmp_path / "audit_b" / run.REPORT_JSON)
